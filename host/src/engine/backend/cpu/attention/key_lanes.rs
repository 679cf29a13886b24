//! Attention scores over key-major cache blocks, a vector lane per key.
//!
//! The CPU cache stores each (block, kv head)'s keys dimension-major: element `e` of the
//! block's `block_size` keys lie side by side (`[dim][slot]`), so one vector load brings
//! element `e` of 8 (AVX2) or 16 (AVX-512) keys. A query's dot products with those keys are
//! computed lane = key: each lane runs exactly the scalar operations of candle's kernel for
//! one key ([`horizontal_dot`] or [`lane_dot`]: the same fused multiply-adds and additions in
//! the same order), so the scores are those of the key-by-key loops bit for bit, with no
//! transposes and no horizontal reductions.
//!
//! Why: the previous layout (keys row-major, one key's 64 elements contiguous) needed about
//! 26 vector operations per (head, key) for the matrix-vector order, 8 of them f16
//! conversions and a transpose across keys; here it is 64 conversions, 64 fused
//! multiply-adds and 63 additions per 16 keys, about 12 per key, and 8 in the short-context
//! order. Attention was the largest share of a serving step at the answers' contexts (39% of a
//! 16-sequence server profile, the Q4_1 products 35%).
//!
//! Which order ([`ScoreOrder`]) is the cache's choice: f32 caches take candle's, so the engine
//! reproduces candle-transformers bit for bit; f16 caches, which no reference reproduces
//! anyway, take [`ScoreOrder::TwoChains`] (64 fused multiply-adds per 8 keys instead of 64
//! products and 63 additions), computed inside [`super::f16`]'s one pass over a
//! sequence; here it is the per-block order the score tests and benchmarks compare.

use half::f16;

/// A key cache element type, as the score kernels read it.
pub trait KeyElement: Copy + Send + Sync {
    /// The value as f32 (exact).
    fn to_f32(self) -> f32;
    /// Eight consecutive elements as f32.
    ///
    /// # Safety
    /// `src` has 8 readable elements; the CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(src: *const Self) -> std::arch::x86_64::__m256;
    /// Sixteen consecutive elements as f32.
    ///
    /// # Safety
    /// `src` has 16 readable elements; the CPU has AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(src: *const Self) -> std::arch::x86_64::__m512;
}

impl KeyElement for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const f32) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's promise.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(src) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(src: *const f32) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's promise.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(src) }
    }
}

impl KeyElement for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(src: *const f16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's promise.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(src: *const f16) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's promise.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(src.cast())) }
    }
}

/// The vector width the score kernels run with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLanes {
    /// One key at a time (any CPU, any block size).
    Scalar,
    /// 8 keys per vector: AVX2, FMA and F16C; block sizes that are multiples of 8.
    Avx2,
    /// 16 keys per vector: AVX-512 F; block sizes that are multiples of 16.
    Avx512,
}

impl KeyLanes {
    /// The widest width this CPU and `block_size` allow. AVX-512 is used where the packed
    /// kernels use it ([`super::super::matmul::Isa::detect`], so `DSPARK_CPU_KERNELS=avx2` narrows
    /// both for comparisons).
    pub fn detect(block_size: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            let avx512 = avx2
                && has!("avx512f")
                && super::super::matmul::Isa::detect() == Some(super::super::matmul::Isa::Avx512Vnni);
            if avx512 && block_size.is_multiple_of(16) {
                return Self::Avx512;
            }
            if avx2 && block_size.is_multiple_of(8) {
                return Self::Avx2;
            }
        }
        let _ = block_size;
        Self::Scalar
    }

    /// Keys per vector.
    pub fn width(self) -> usize {
        match self {
            Self::Scalar => 1,
            Self::Avx2 => 8,
            Self::Avx512 => 16,
        }
    }
}

/// The order a score's 64 (or `head_dim`) products are summed in. Every order is a fixed
/// function of the query and the key alone, so a row's scores never depend on its batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreOrder {
    /// candle's horizontal kernel, which its GEMM uses for a single query over at most 256
    /// keys ([`horizontal_dot`]).
    Horizontal,
    /// candle's matrix-vector kernel, for a single query over more keys ([`lane_dot`]): 64
    /// separate products and 63 additions per 64 elements, twice the work of a fused chain.
    MatrixVector,
    /// Even and odd elements in two fused chains, then added ([`two_chain_dot`]): the fewest
    /// operations, with enough independent chains to keep AVX2's two FMA pipes busy. For
    /// caches no reference reproduces bit for bit anyway (f16 keys).
    TwoChains,
}

impl ScoreOrder {
    /// candle's order for a single query over `keys` keys.
    pub fn candle(keys: usize) -> Self {
        if keys <= HORIZONTAL_MAX_KEYS { Self::Horizontal } else { Self::MatrixVector }
    }

    /// The scalar specification of this order: the dot product of `a` and `b`.
    pub fn dot(self, a: &[f32], b: &[f32]) -> f32 {
        match self {
            Self::Horizontal => horizontal_dot(a, b),
            Self::MatrixVector => lane_dot(a, b),
            Self::TwoChains => two_chain_dot(a, b),
        }
    }
}

/// Up to this many keys, candle's GEMM computes a single query's scores with its
/// horizontal kernel; beyond, with its matrix-vector kernel.
pub const HORIZONTAL_MAX_KEYS: usize = 256;

/// Appends `scale * (query_h . key_j)` for the first `n` keys of one cache block to
/// `scores[h]`, for every head `h` of a group sharing the block's kv head: `queries` holds
/// `scores.len()` queries of `head_dim` elements one after the other. `block` holds the
/// block's `block_size` keys of that kv head dimension-major (element `e` of key `j` at
/// `block[e * block_size + j]`). Each key vector is loaded (and widened) once for up to three
/// heads, each score summed in `order`.
///
/// # Panics
/// If `queries` is not `scores.len() * head_dim` long, `block` is shorter than
/// `head_dim * block_size`, `n > block_size`, or `lanes` does not divide `block_size` (use
/// [`KeyLanes::detect`]).
#[allow(clippy::too_many_arguments)]
pub fn append_block_scores<T: KeyElement>(
    lanes: KeyLanes,
    queries: &[f32],
    head_dim: usize,
    block: &[T],
    block_size: usize,
    n: usize,
    order: ScoreOrder,
    scale: f32,
    scores: &mut [Vec<f32>],
) {
    assert!(queries.len() == scores.len() * head_dim);
    assert!(block.len() >= head_dim * block_size && n <= block_size && block_size.is_multiple_of(lanes.width()));
    for (queries, scores) in queries.chunks(3 * head_dim.max(1)).zip(scores.chunks_mut(3)) {
        match scores.len() {
            1 => heads_block::<T, 1>(lanes, queries, block, block_size, n, order, scale, scores),
            2 => heads_block::<T, 2>(lanes, queries, block, block_size, n, order, scale, scores),
            _ => heads_block::<T, 3>(lanes, queries, block, block_size, n, order, scale, scores),
        }
    }
}

/// [`append_block_scores`] for `H` heads.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn heads_block<T: KeyElement, const H: usize>(
    lanes: KeyLanes,
    queries: &[f32],
    block: &[T],
    block_size: usize,
    n: usize,
    order: ScoreOrder,
    scale: f32,
    scores: &mut [Vec<f32>],
) {
    let width = lanes.width();
    let mut dots = [[0f32; 16]; H];
    let mut first = 0;
    while first < n {
        let keys = block[first..].as_ptr();
        let out = dots.as_mut_ptr().cast::<f32>();
        // Two AVX2 vectors side by side where the block has them and more than one vector's
        // keys are wanted: each query broadcast then serves 16 keys.
        let pair = lanes == KeyLanes::Avx2 && first + 2 * width <= block_size && n - first > width;
        // SAFETY: every load reads `width` (or, paired, `2 width`) keys' element
        // `e < head_dim` from `first + e * block_size` on, inside the block (asserted by the
        // caller: `block_size` is a multiple of `width`; paired, checked above); `dots` has
        // 16 floats per head; the CPU has the width's features (`KeyLanes::detect`, or
        // `Scalar`).
        unsafe {
            match (lanes, queries.len() / H) {
                (KeyLanes::Scalar, _) if order == ScoreOrder::TwoChains => {
                    two_chains_with::<Scalar, T, H, 1, 0>(queries, keys, block_size, out)
                }
                (KeyLanes::Scalar, _) => dots_with::<Scalar, T, H, 1, 8, 0>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx2, 64) if pair => dots_avx2::<T, H, 2, 64>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx2, 128) if pair => dots_avx2::<T, H, 2, 128>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx2, _) if pair => dots_avx2::<T, H, 2, 0>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx2, 64) => dots_avx2::<T, H, 1, 64>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx2, _) => dots_avx2::<T, H, 1, 0>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx512, 64) => dots_avx512::<T, H, 64>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx512, 128) => dots_avx512::<T, H, 128>(queries, keys, block_size, order, out),
                #[cfg(target_arch = "x86_64")]
                (KeyLanes::Avx512, _) => dots_avx512::<T, H, 0>(queries, keys, block_size, order, out),
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("vector widths are detected on x86-64 only"),
            }
        }
        let step = if pair { 2 * width } else { width };
        let take = step.min(n - first);
        for (dots, scores) in dots.iter().zip(scores.iter_mut()) {
            // A whole array at once vectorises; an iterator of unknown length did not.
            let scaled: [f32; 16] = std::array::from_fn(|i| dots[i] * scale);
            scores.extend_from_slice(&scaled[..take]);
        }
        first += step;
    }
}

/// A vector of f32 lanes, one key per lane.
trait Lanes {
    type V: Copy;
    /// Keys per vector.
    const WIDTH: usize;
    unsafe fn zero() -> Self::V;
    unsafe fn load<T: KeyElement>(src: *const T) -> Self::V;
    /// `a * b + c`, one rounding (lane-wise `f32::mul_add` with `a` broadcast).
    unsafe fn fma(a: f32, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn store(v: Self::V, dst: *mut f32);
}

struct Scalar;

impl Lanes for Scalar {
    type V = f32;
    const WIDTH: usize = 1;
    #[inline(always)]
    unsafe fn zero() -> f32 {
        0.0
    }
    #[inline(always)]
    unsafe fn load<T: KeyElement>(src: *const T) -> f32 {
        // SAFETY: the caller's promise (one readable element).
        unsafe { (*src).to_f32() }
    }
    #[inline(always)]
    unsafe fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
    #[inline(always)]
    unsafe fn add(a: f32, b: f32) -> f32 {
        a + b
    }
    #[inline(always)]
    unsafe fn store(v: f32, dst: *mut f32) {
        // SAFETY: the caller's promise.
        unsafe { *dst = v }
    }
}

/// A [`Lanes`] over one x86 vector type: its name, vector, element load and intrinsics.
/// Its methods run only inside the matching `dots_*` function, which enables the features.
macro_rules! x86_lanes {
    ($name:ident, $v:ident, $width:literal, $load:ident, $zero:ident, $set1:ident, $fmadd:ident, $add:ident, $store:ident) => {
        #[cfg(target_arch = "x86_64")]
        struct $name;

        #[cfg(target_arch = "x86_64")]
        impl Lanes for $name {
            type V = std::arch::x86_64::$v;
            const WIDTH: usize = $width;
            #[inline(always)]
            unsafe fn zero() -> Self::V {
                // SAFETY: inside the matching `dots_*` (features enabled).
                unsafe { std::arch::x86_64::$zero() }
            }
            #[inline(always)]
            unsafe fn load<T: KeyElement>(src: *const T) -> Self::V {
                // SAFETY: the caller's promise (a vector's elements readable).
                unsafe { T::$load(src) }
            }
            #[inline(always)]
            unsafe fn fma(a: f32, b: Self::V, c: Self::V) -> Self::V {
                // SAFETY: as in `zero`.
                unsafe { std::arch::x86_64::$fmadd(std::arch::x86_64::$set1(a), b, c) }
            }
            #[inline(always)]
            unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
                // SAFETY: as in `zero`.
                unsafe { std::arch::x86_64::$add(a, b) }
            }
            #[inline(always)]
            unsafe fn store(v: Self::V, dst: *mut f32) {
                // SAFETY: the caller's promise (a vector's floats of room).
                unsafe { std::arch::x86_64::$store(dst, v) }
            }
        }
    };
}

x86_lanes!(Avx2, __m256, 8, load8, _mm256_setzero_ps, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps);
x86_lanes!(
    Avx512,
    __m512,
    16,
    load16,
    _mm512_setzero_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_storeu_ps
);

/// [`dots_with`] on AVX2 over `V` vectors of 8 keys. The accumulators are grouped so that
/// they fit the 16 registers beside the keys and the broadcast query element: 2 of the
/// horizontal order's 8 lanes at a time for 2 or 3 heads, 4 for one.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_avx2<T: KeyElement, const H: usize, const V: usize, const K: usize>(
    queries: &[f32],
    keys: *const T,
    stride: usize,
    order: ScoreOrder,
    out: *mut f32,
) {
    // SAFETY: the caller's promise; AVX2 is enabled here.
    unsafe {
        if order == ScoreOrder::TwoChains {
            two_chains_with::<Avx2, T, H, V, K>(queries, keys, stride, out)
        } else if H == 1 {
            dots_with::<Avx2, T, H, V, 4, K>(queries, keys, stride, order, out)
        } else {
            dots_with::<Avx2, T, H, V, 2, K>(queries, keys, stride, order, out)
        }
    }
}

/// [`dots_with`] on AVX-512 over one vector of 16 keys; the 32 registers hold all 8 of the
/// horizontal order's accumulators for 3 heads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dots_avx512<T: KeyElement, const H: usize, const K: usize>(
    queries: &[f32],
    keys: *const T,
    stride: usize,
    order: ScoreOrder,
    out: *mut f32,
) {
    // SAFETY: the caller's promise; AVX-512 F is enabled here.
    unsafe {
        if order == ScoreOrder::TwoChains {
            two_chains_with::<Avx512, T, H, 1, K>(queries, keys, stride, out)
        } else {
            dots_with::<Avx512, T, H, 1, 8, K>(queries, keys, stride, order, out)
        }
    }
}

/// The horizontal order's 8 accumulator lanes in the order their sums are paired:
/// `x_l = acc_l + acc_(l+4)`, then `(x_0 + x_2) + (x_1 + x_3)`.
const HORIZONTAL_PAIRS: [usize; 8] = [0, 4, 2, 6, 1, 5, 3, 7];

/// The dot products of `H` queries (`queries`, one after the other) with `V` vectors' worth
/// of keys (element `e` of vector `v`'s lane's key at `keys + e * stride + v * width + lane`),
/// each lane in the order of [`horizontal_dot`] or [`lane_dot`] (`order`; [`two_chains_with`]
/// computes the third); head `h`'s written from
/// `out + 16 h` on (one f32 per lane, vector after vector). Each key vector is loaded once
/// for all the heads and each query element broadcast once for all the vectors.
///
/// Every accumulator runs its chain in the reference's order; only which chains are live at
/// once differs: `P` of the horizontal order's 8 lanes at a time ([`HORIZONTAL_PAIRS`], so
/// each group's sums pair up as the reference pairs them), and the matrix-vector order's
/// accumulators reduced pair by pair as soon as both are complete. With AVX2's 16
/// registers, keeping all 8 lanes of 3 heads live (24 vectors) spilled to the stack on
/// every fused multiply-add.
///
/// # Safety
/// Those elements are readable for `e < queries.len() / H`; `out` has room for `16 H`
/// floats; the CPU runs `L`; `V * width <= 16`; `K` is 0 or `queries.len() / H`.
#[inline(always)]
unsafe fn dots_with<L: Lanes, T: KeyElement, const H: usize, const V: usize, const P: usize, const K: usize>(
    queries: &[f32],
    keys: *const T,
    stride: usize,
    order: ScoreOrder,
    out: *mut f32,
) {
    let horizontal = order == ScoreOrder::Horizontal;
    // A head size known at compile time (`K`, or 0 for any) unrolls every loop below.
    let k = if K == 0 { queries.len() / H } else { K };
    assert!(queries.len() == H * k);
    let width = L::WIDTH;
    // SAFETY: the caller's promise for every `e < k` and `v < V`.
    let key = |v: usize, e: usize| unsafe { L::load(keys.add(e * stride + v * width)) };
    // SAFETY: `h < H` and `e < k` at every call below; `queries` has `H k` elements.
    let q = |h: usize, e: usize| unsafe { *queries.get_unchecked(h * k + e) };
    // SAFETY: the CPU runs `L` (the caller's promise).
    unsafe {
        let sums: [[L::V; V]; H] = if horizontal {
            // Element `at` goes to accumulator `at % 8`; constant indices keep the
            // accumulators in registers.
            let full = k / 8 * 8;
            let mut pairs = [[[L::zero(); 4]; V]; H];
            for group in 0..8 / P {
                let lanes: [usize; P] = std::array::from_fn(|i| HORIZONTAL_PAIRS[group * P + i]);
                let mut acc = [[[L::zero(); P]; V]; H];
                let mut at = 0;
                while at < full {
                    for (i, &l) in lanes.iter().enumerate() {
                        let x: [L::V; V] = std::array::from_fn(|v| key(v, at + l));
                        for (h, acc) in acc.iter_mut().enumerate() {
                            for (acc, x) in acc.iter_mut().zip(&x) {
                                acc[i] = L::fma(q(h, at + l), *x, acc[i]);
                            }
                        }
                    }
                    at += 8;
                }
                for (i, &l) in lanes.iter().enumerate() {
                    if full + l < k {
                        let x: [L::V; V] = std::array::from_fn(|v| key(v, full + l));
                        for (h, acc) in acc.iter_mut().enumerate() {
                            for (acc, x) in acc.iter_mut().zip(&x) {
                                acc[i] = L::fma(q(h, full + l), *x, acc[i]);
                            }
                        }
                    }
                }
                for (acc, pairs) in acc.iter().zip(pairs.iter_mut()) {
                    for (acc, pairs) in acc.iter().zip(pairs.iter_mut()) {
                        for i in 0..P / 2 {
                            pairs[group * P / 2 + i] = L::add(acc[2 * i], acc[2 * i + 1]);
                        }
                    }
                }
            }
            pairs.map(|pairs| pairs.map(|x| L::add(L::add(x[0], x[1]), L::add(x[2], x[3]))))
        } else {
            let blocks = k / 64 * 64;
            let mut sums = [[L::zero(); V]; H];
            for l in 0..8 {
                // Lane `l` of the reference's eight accumulators over blocks of 64, reduced
                // as ((0+1)+(2+3))+((4+5)+(6+7)), then its 8-element blocks; lanes are
                // independent, so one at a time, and each accumulator pair is added as soon
                // as it is complete.
                let mut quads = [[[L::zero(); 2]; V]; H];
                for quad in 0..2 {
                    let mut pairs = [[[L::zero(); 2]; V]; H];
                    for pair in 0..2 {
                        let mut acc = [[[L::zero(); 2]; V]; H];
                        for j in 0..2 {
                            let i = 4 * quad + 2 * pair + j;
                            let mut depth = 0;
                            while depth < blocks {
                                let e = depth + 8 * i + l;
                                let x: [L::V; V] = std::array::from_fn(|v| key(v, e));
                                for (h, acc) in acc.iter_mut().enumerate() {
                                    for (acc, x) in acc.iter_mut().zip(&x) {
                                        acc[j] = L::fma(q(h, e), *x, acc[j]);
                                    }
                                }
                                depth += 64;
                            }
                        }
                        for (acc, pairs) in acc.iter().zip(pairs.iter_mut()) {
                            for (acc, pairs) in acc.iter().zip(pairs.iter_mut()) {
                                pairs[pair] = L::add(acc[0], acc[1]);
                            }
                        }
                    }
                    for (pairs, quads) in pairs.iter().zip(quads.iter_mut()) {
                        for (pairs, quads) in pairs.iter().zip(quads.iter_mut()) {
                            quads[quad] = L::add(pairs[0], pairs[1]);
                        }
                    }
                }
                for (h, (quads, sums)) in quads.iter().zip(sums.iter_mut()).enumerate() {
                    for (v, (quads, sum)) in quads.iter().zip(sums.iter_mut()).enumerate() {
                        let mut lane = L::add(quads[0], quads[1]);
                        let mut depth = blocks;
                        while depth + 8 <= k {
                            lane = L::fma(q(h, depth + l), key(v, depth + l), lane);
                            depth += 8;
                        }
                        *sum = if l == 0 { lane } else { L::add(*sum, lane) };
                    }
                }
            }
            for at in k / 8 * 8..k {
                let x: [L::V; V] = std::array::from_fn(|v| key(v, at));
                for (h, sums) in sums.iter_mut().enumerate() {
                    for (sum, x) in sums.iter_mut().zip(&x) {
                        *sum = L::fma(q(h, at), *x, *sum);
                    }
                }
            }
            sums
        };
        for (h, sums) in sums.iter().enumerate() {
            for (v, sum) in sums.iter().enumerate() {
                L::store(*sum, out.add(16 * h + v * width));
            }
        }
    }
}

/// [`ScoreOrder::TwoChains`] for `H` queries and `V` vectors' worth of keys, laid out and
/// written as for [`dots_with`]: element `e` of every key goes to chain `e % 2`, and with
/// 3 heads x 2 chains x 2 vectors of 8 keys (AVX2) the 12 accumulators, the two key vectors
/// and the broadcast query element fill the 16 registers, each chain a fused multiply-add
/// per 2 elements, so the FMA pipes need not wait on a chain's latency.
///
/// # Safety
/// As for [`dots_with`].
#[inline(always)]
unsafe fn two_chains_with<L: Lanes, T: KeyElement, const H: usize, const V: usize, const K: usize>(
    queries: &[f32],
    keys: *const T,
    stride: usize,
    out: *mut f32,
) {
    let k = if K == 0 { queries.len() / H } else { K };
    assert!(queries.len() == H * k);
    let width = L::WIDTH;
    // SAFETY: the caller's promise for every `e < k` and `v < V`.
    let key = |v: usize, e: usize| unsafe { L::load(keys.add(e * stride + v * width)) };
    // SAFETY: `h < H` and `e < k` at every call below; `queries` has `H k` elements.
    let q = |h: usize, e: usize| unsafe { *queries.get_unchecked(h * k + e) };
    // SAFETY: the CPU runs `L` (the caller's promise).
    unsafe {
        let mut acc = [[[L::zero(); V]; 2]; H];
        let mut e = 0;
        while e < k {
            for (chain, at) in [e, e + 1].into_iter().enumerate() {
                if at < k {
                    let x: [L::V; V] = std::array::from_fn(|v| key(v, at));
                    for (h, acc) in acc.iter_mut().enumerate() {
                        for (a, x) in acc[chain].iter_mut().zip(&x) {
                            *a = L::fma(q(h, at), *x, *a);
                        }
                    }
                }
            }
            e += 2;
        }
        for (h, [even, odd]) in acc.iter().enumerate() {
            for (v, (even, odd)) in even.iter().zip(odd).enumerate() {
                L::store(L::add(*even, *odd), out.add(16 * h + v * width));
            }
        }
    }
}

/// A dot product in [`ScoreOrder::TwoChains`]: the even and the odd elements each in one
/// fused multiply-add chain, then the two added. The specification the kernels are tested
/// against.
pub fn two_chain_dot(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut chains = [0f32; 2];
    for (at, (x, y)) in a[..k].iter().zip(&b[..k]).enumerate() {
        chains[at % 2] = x.mul_add(*y, chains[at % 2]);
    }
    chains[0] + chains[1]
}

/// A dot product in the order of the reference's horizontal kernel: one fused 8-lane
/// accumulator, then the lanes reduced as `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
/// candle's GEMM computes a single query's scores this way up to 256 keys (the CPU backend's
/// `HORIZONTAL_MAX_KEYS`). The specification the kernels are tested against.
pub fn horizontal_dot(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut acc = [0f32; 8];
    for (at, (x, y)) in a[..k].iter().zip(&b[..k]).enumerate() {
        acc[at % 8] = x.mul_add(*y, acc[at % 8]);
    }
    let x: [f32; 4] = std::array::from_fn(|l| acc[l] + acc[l + 4]);
    (x[0] + x[2]) + (x[1] + x[3])
}

/// A dot product in the order of the reference's matrix-vector kernel (one query row):
/// eight 8-lane fused accumulators over blocks of 64, reduced pairwise, then 8-lane blocks,
/// the lanes summed in order, then the tail. The specification the kernels are tested
/// against.
pub fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut depth = 0;
    let mut acc = [[0f32; 8]; 8];
    while depth + 64 <= k {
        for (i, lanes) in acc.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                let at = depth + 8 * i + l;
                *v = a[at].mul_add(b[at], *v);
            }
        }
        depth += 64;
    }
    let pair = |x: usize, y: usize, l: usize| acc[x][l] + acc[y][l];
    let mut lanes: [f32; 8] =
        std::array::from_fn(|l| (pair(0, 1, l) + pair(2, 3, l)) + (pair(4, 5, l) + pair(6, 7, l)));
    while depth + 8 <= k {
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = a[depth + l].mul_add(b[depth + l], *v);
        }
        depth += 8;
    }
    let mut sum = lanes[0];
    for v in &lanes[1..] {
        sum += v;
    }
    for at in depth..k {
        sum = a[at].mul_add(b[at], sum);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(12_345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 20_001) as f32 / 10_000.0 - 1.0
            })
            .collect()
    }

    /// Every width gives the specification's scores bit for bit, for f32 and f16 keys, head
    /// sizes with and without 8- and 64-element tails, full and partial blocks.
    #[test]
    fn every_width_gives_the_key_by_key_scores() {
        let block_size = 32;
        let widths: Vec<KeyLanes> = [KeyLanes::Scalar, KeyLanes::Avx2, KeyLanes::Avx512]
            .into_iter()
            .filter(|&w| w == KeyLanes::Scalar || KeyLanes::detect(block_size).width() >= w.width())
            .collect();
        for k in [8usize, 13, 64, 72, 96, 128, 130] {
            // Seven different queries: groups of 1 to 7 heads (chunks of 3, 2 and 1).
            let queries: Vec<Vec<f32>> = (0..7).map(|h| values(k, k as u32 + 100 * h)).collect();
            let keys: Vec<Vec<f32>> = (0..block_size).map(|j| values(k, 7 * k as u32 + j as u32)).collect();
            let halves: Vec<Vec<f32>> =
                keys.iter().map(|key| key.iter().map(|&v| f16::from_f32(v).to_f32()).collect()).collect();
            let mut major = vec![0f32; k * block_size];
            let mut major16 = vec![f16::ZERO; k * block_size];
            for j in 0..block_size {
                for e in 0..k {
                    major[e * block_size + j] = keys[j][e];
                    major16[e * block_size + j] = f16::from_f32(keys[j][e]);
                }
            }
            for order in [ScoreOrder::Horizontal, ScoreOrder::MatrixVector, ScoreOrder::TwoChains] {
                let spec = |q: &[f32], keys: &[Vec<f32>]| -> Vec<u32> {
                    keys.iter().map(|key| (order.dot(q, key) * 0.125).to_bits()).collect()
                };
                for &lanes in &widths {
                    for n in [block_size, 21, 1] {
                        for heads in [1usize, 2, 3, 7] {
                            let flat: Vec<f32> = queries[..heads].concat();
                            let mut got = vec![Vec::new(); heads];
                            append_block_scores(lanes, &flat, k, &major, block_size, n, order, 0.125, &mut got);
                            let mut got16 = vec![Vec::new(); heads];
                            append_block_scores(lanes, &flat, k, &major16, block_size, n, order, 0.125, &mut got16);
                            for h in 0..heads {
                                let bits = |s: &[f32]| s.iter().map(|s| s.to_bits()).collect::<Vec<_>>();
                                let what = format!("{lanes:?}, k {k}, n {n}, head {h} of {heads}, {order:?}");
                                assert_eq!(bits(&got[h]), spec(&queries[h], &keys)[..n], "f32, {what}");
                                assert_eq!(bits(&got16[h]), spec(&queries[h], &halves)[..n], "f16, {what}");
                            }
                        }
                    }
                }
            }
        }
        // On this project's machines the vector widths run (x86-64 with AVX2 at least), so
        // the test compares them and does not pass on the scalar loop alone.
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            assert!(widths.len() >= 2, "{widths:?}");
        }
    }
}
