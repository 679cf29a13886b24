//! Attention over a bf16 KV cache in one pass: the keys and values widened to f32 (exact: a
//! bf16 is the top half of an f32) and multiplied with f32 fused multiply-adds.
//!
//! Why bf16: it halves the cache against f32, and widening it back is exact and costs one
//! shift or one mask per 16 values, done once per run of 16 keys for every row and head that
//! reads the run. bf16 is also what SmolLM2, Qwen2.5 and most current models are trained and
//! shipped in, and what GPU servers (vLLM, SGLang) keep their caches and run their attention
//! matmuls in; it has f32's range (no overflow of large activations) and 8 bits of mantissa
//! against f16's 11.
//!
//! Why not `vdpbf16ps` (two bf16 products per f32 lane, what an earlier version of this
//! kernel used): on the Sapphire Rapids Xeon of these benchmarks it retires one every
//! two cycles (an ad-hoc loop of 12 independent chains: 1.56 per ns per core, against 6.4 per
//! ns for `vpdpbusd`), so its 32 products per two cycles are half of what two f32 FMAs per
//! cycle give. With the widening shared by the rows of a chunk, a 16-row chunk at 480
//! positions ran about 7% faster (`dspark engine-bench`).
//!
//! Layout. Each (block, kv head) holds `block_size * head_dim` bf16 values (as `u16` bits),
//! in the pairs `vdpbf16ps` takes (what the kernel used before; a 64-byte load now widens
//! into the even and the odd elements, two f32 vectors):
//! - keys by element pairs: elements `2p` and `2p + 1` of slot `j` at `p * 2 * block_size +
//!   2 * j` and the next one ([`key_index`]), so a 64-byte vector holds pair `p` of 16
//!   consecutive slots, one slot per f32 lane;
//! - values by slot pairs: element `e` of slots `2i` and `2i + 1` at `i * 2 * head_dim + 2 * e`
//!   and the next one ([`value_index`]), so a vector holds 16 elements of two slots.
//!
//! Numerics, a fixed function of the row (the same whatever batch, chunk or step the row
//! comes in); the vector kernel computes exactly [`reference_head`]. `bf16(x)` is
//! [`to_bf16`] (round to nearest even, zero and subnormals to signed zero, as
//! `vcvtneps2bf16`), `dot2(c, a, b) = fma(a0, b0, fma(a1, b1, c))` ([`dot2`]: the odd
//! element first, as `vdpbf16ps` orders a pair):
//!
//! ```text
//! q = bf16(query), m = -inf, l = 0, acc = 0
//! for each run of keys 16r .. 16r + t (t <= 16):
//!     s_j   = ((c0 + c1) + (c2 + c3)) * scale, from c_i = 0 and for p in 0..32:
//!             c_(p mod 4) = dot2(c_(p mod 4), q[2p, 2p+1], k_j[2p, 2p+1])    (s_j = -inf past t)
//!     alpha = exp(m - max_j s_j) and m = max_j s_j   if that max exceeds m, else alpha = 1
//!     w_j   = bf16(exp(s_j - m))                                            (0 past t)
//!     l     = l * alpha + (((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))), v_i = w_i + w_(i+8)
//!     acc_e = acc_e * alpha, then for each pair of keys (j, j + 1) of the run with j < t:
//!             acc_e = dot2(acc_e, w[j, j+1], v[j, j+1][e])     (v_(j+1) taken as 0 past t)
//! out_e = acc_e * (1 / l)
//! ```
//!
//! `exp` is [`super::f16::exp`], the same function the f16 path uses. The
//! denominator sums the weights as rounded to bf16, the ones the values are weighted by.
//!
//! CPUs without AVX-512 BF16 run [`reference_head`] per row and head: correct, and several
//! times slower than the f16 path, which is why the engine picks bf16 only where the
//! instruction exists ([`crate::engine::backend::KvDtype::fastest`]).

use super::f16::{self, AttendShape, exp};
#[cfg(target_arch = "x86_64")]
use super::f16::{for_each_run, horizontal_sum};

/// Keys per step of the online softmax: one 16-lane vector of scores.
pub const RUN: usize = 16;

/// `x` rounded to bf16 (as `u16` bits) the way `vcvtneps2bf16` rounds: to nearest, ties to
/// even; zero and subnormal inputs give zero of the same sign; NaN gives a quiet NaN.
pub fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    if x == 0.0 || x.is_subnormal() {
        return ((bits >> 16) & 0x8000) as u16;
    }
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// [`to_bf16`] of every element of `src` into `dst` (of the same length), 16 at a time with
/// `vcvtneps2bf16` where the CPU has AVX-512 BF16: writing a row into the cache converts
/// every key and value of every layer.
///
/// # Panics
/// If the lengths differ.
pub fn to_bf16_slice(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "to_bf16_slice: lengths differ");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if accelerated() {
        // SAFETY: AVX-512 F and BF16 checked by `accelerated`; the lengths are equal.
        unsafe { to_bf16_avx512(src, dst) };
        done = src.len() / 16 * 16;
    }
    for (x, b) in src[done..].iter().zip(&mut dst[done..]) {
        *b = to_bf16(*x);
    }
}

/// The whole vectors of [`to_bf16_slice`].
///
/// # Safety
/// The CPU has AVX-512 F and BF16; `dst` is as long as `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
unsafe fn to_bf16_avx512(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::*;
    for i in (0..src.len() / 16 * 16).step_by(16) {
        // SAFETY: elements i..i + 16 exist in both (the caller's promise for `dst`).
        unsafe {
            let rounded = _mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(i)));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), half_bits(rounded));
        }
    }
}

/// The f32 value of bf16 bits (exact).
pub fn from_bf16(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Where element `e` of slot `slot` of a block's keys is, from the block's start.
pub fn key_index(e: usize, slot: usize, block_size: usize) -> usize {
    (e / 2) * 2 * block_size + 2 * slot + e % 2
}

/// Where element `e` of slot `slot` of a block's values is, from the block's start.
pub fn value_index(e: usize, slot: usize, head_dim: usize) -> usize {
    (slot / 2) * 2 * head_dim + 2 * e + slot % 2
}

/// `c + a1 b1 + a0 b0` for a pair of bf16 elements: two fused multiply-adds, the odd
/// element's first (the order `vdpbf16ps` uses; unlike it, subnormal results are kept).
pub fn dot2(c: f32, a: [f32; 2], b: [f32; 2]) -> f32 {
    a[0].mul_add(b[0], a[1].mul_add(b[1], c))
}

/// The specification of one head's output ([module docs](self)): `n` keys, `key(j, e)` and
/// `value(j, e)` element `e` of key and value `j` (bf16 bits), `out` of the query's length
/// (even). The loop of [`attend`] where its vector kernel cannot run, and what that kernel is
/// tested against.
pub fn reference_head(
    query: &[f32],
    n: usize,
    key: impl Fn(usize, usize) -> u16,
    value: impl Fn(usize, usize) -> u16,
    scale: f32,
    out: &mut [f32],
) {
    let q: Vec<f32> = query.iter().map(|&x| from_bf16(to_bf16(x))).collect();
    let (mut max, mut total) = (f32::NEG_INFINITY, 0f32);
    out.fill(0.0);
    let mut scores = [0f32; RUN];
    for first in (0..n).step_by(RUN) {
        let take = RUN.min(n - first);
        for (j, score) in scores.iter_mut().enumerate() {
            *score = if j < take {
                let mut chains = [0f32; 4];
                for p in 0..q.len() / 2 {
                    let k = |e: usize| from_bf16(key(first + j, e));
                    chains[p % 4] = dot2(chains[p % 4], [q[2 * p], q[2 * p + 1]], [k(2 * p), k(2 * p + 1)]);
                }
                ((chains[0] + chains[1]) + (chains[2] + chains[3])) * scale
            } else {
                f32::NEG_INFINITY
            };
        }
        let (w, alpha) = f16::softmax_step(&scores, &mut max, &mut total, |w| from_bf16(to_bf16(w)));
        for (e, out) in out.iter_mut().enumerate() {
            let mut acc = *out * alpha;
            for j in (0..take).step_by(2) {
                let odd = if j + 1 < take { from_bf16(value(first + j + 1, e)) } else { 0.0 };
                acc = dot2(acc, [w[j], w[j + 1]], [from_bf16(value(first + j, e)), odd]);
            }
            *out = acc;
        }
    }
    let inverse = 1.0 / total;
    for out in out.iter_mut() {
        *out *= inverse;
    }
}

/// Whether [`attend`] runs its vector kernel here (AVX-512 F and BF16) for head size 64.
pub fn accelerated() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx512bf16") && has!("avx2") && has!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The attention of a group of heads sharing one kv head, for one or more rows of a sequence
/// ([module docs](self)); the arguments as [`super::f16::attend`]'s, over a bf16
/// cache in this module's layout: row `r` sees the first `seen[r]` positions (`seen`
/// non-decreasing), `queries` and `out` hold each row's heads one after the other, `blocks`
/// where each block starts in `keys` and `values`, `ahead(b)` prefetches block `b`.
///
/// Every row gets exactly the numbers it would get alone. With AVX-512 BF16, head size 64 and
/// block sizes that are multiples of [`RUN`] the vector kernel runs; otherwise
/// [`reference_head`] per row and head.
///
/// # Panics
/// If `queries` and `out` differ in length or are not a multiple of `seen.len() * head_dim`,
/// `head_dim` or `block_size` is odd, `seen` is empty or decreases, `blocks` holds fewer than
/// `max(seen).div_ceil(block_size)` starts, or a used block runs past the end of `keys` or
/// `values`.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    queries: &[f32],
    head_dim: usize,
    keys: &[u16],
    values: &[u16],
    blocks: &[usize],
    block_size: usize,
    seen: &[usize],
    scale: f32,
    out: &mut [f32],
    ahead: impl Fn(usize),
) {
    assert!(head_dim.is_multiple_of(2) && block_size.is_multiple_of(2) && block_size > 0);
    let AttendShape { heads, row_len, used } =
        AttendShape::check(queries.len(), out.len(), head_dim, keys.len().min(values.len()), blocks, block_size, seen);
    let blocks = &blocks[..used];
    #[cfg(target_arch = "x86_64")]
    if head_dim == 64 && block_size.is_multiple_of(RUN) && accelerated() {
        let mut running = Vec::new();
        for first_head in (0..heads).step_by(3) {
            let kernel: Kernel = match (heads - first_head).min(3) {
                1 => heads_avx512::<1>,
                2 => heads_avx512::<2>,
                _ => heads_avx512::<3>,
            };
            let at = first_head * head_dim;
            // SAFETY: AVX-512 F and BF16 checked by `accelerated`; every used block's keys
            // and values are inside `keys` and `values` (asserted above); the block size is a
            // multiple of 16; rows of `row_len` elements hold the group's heads from `at` on.
            unsafe {
                kernel(
                    &queries[at..],
                    &mut out[at..],
                    row_len,
                    seen,
                    keys,
                    values,
                    blocks,
                    block_size,
                    scale,
                    &ahead,
                    &mut running,
                )
            };
        }
        return;
    }
    let _ = ahead;
    let slot = |j: usize| (blocks[j / block_size], j % block_size);
    let key = |j: usize, e: usize| {
        let (start, s) = slot(j);
        keys[start + key_index(e, s, block_size)]
    };
    let value = |j: usize, e: usize| {
        let (start, s) = slot(j);
        values[start + value_index(e, s, head_dim)]
    };
    let rows = queries.chunks(row_len).zip(out.chunks_mut(row_len)).zip(seen);
    for ((queries, out), &n) in rows {
        for (query, out) in queries.chunks(head_dim).zip(out.chunks_mut(head_dim)) {
            reference_head(query, n, key, value, scale, out);
        }
    }
}

/// One row's running softmax for up to 3 heads of 64, and its queries; shared with
/// [`super::int8`]'s kernel.
#[derive(Clone, Copy)]
pub(super) struct Running {
    pub max: [f32; 3],
    pub total: [f32; 3],
    pub acc: [f32; 64 * 3],
    /// Element `e` of head `h`'s query at `64 h + e` (here rounded to bf16, held as f32).
    pub query: [f32; 64 * 3],
}

impl Running {
    pub const START: Self =
        Self { max: [f32::NEG_INFINITY; 3], total: [0.0; 3], acc: [0.0; 64 * 3], query: [0.0; 64 * 3] };
}

/// The online softmax's step for one head over a run's 16 scores `s` (keys past the run at
/// -inf): raises `max` to the run's largest score where that exceeds it, and returns the
/// weights `exp(s - max)` as `round` rounds them and the factor `alpha` the head's earlier
/// sums are rescaled by, after adding the rounded weights to `total * alpha` in the order
/// `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`, `v_i = w_i + w_(i+8)`. Shared with
/// [`super::int8`]'s kernel.
///
/// # Safety
/// The CPU has AVX-512 F and AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
#[inline]
pub(super) unsafe fn softmax_step(
    s: std::arch::x86_64::__m512,
    max: &mut f32,
    total: &mut f32,
    round: impl Fn(std::arch::x86_64::__m512) -> std::arch::x86_64::__m512,
) -> (std::arch::x86_64::__m512, f32) {
    use std::arch::x86_64::*;
    let run_max = _mm512_reduce_max_ps(s);
    let mut alpha = 1.0;
    if run_max > *max {
        alpha = exp(*max - run_max);
        *max = run_max;
    }
    let weights = round(exp16(_mm512_sub_ps(s, _mm512_set1_ps(*max))));
    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(weights)));
    let v = _mm256_add_ps(_mm512_castps512_ps256(weights), high);
    *total = *total * alpha + horizontal_sum(v);
    (weights, alpha)
}

/// A row's weighted sums for `H` heads of 64 (4 vectors each), each head's multiplied by
/// its `alpha` (the online softmax's rescaling; a factor of 1 is skipped, as it changes
/// nothing). Shared with [`super::int8`]'s kernel.
///
/// # Safety
/// The CPU has AVX-512 F; `H <= 3`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn rescaled_sums<const H: usize>(
    state: &Running,
    alpha: &[f32; H],
) -> [[std::arch::x86_64::__m512; 4]; H] {
    use std::arch::x86_64::*;
    let rescale = alpha.iter().any(|&a| a != 1.0);
    std::array::from_fn(|h| {
        std::array::from_fn(|v| {
            // SAFETY: `acc` holds 64 elements per head, H <= 3.
            let a = unsafe { _mm512_loadu_ps(state.acc.as_ptr().add(h * 64 + 16 * v)) };
            if rescale { _mm512_mul_ps(a, _mm512_set1_ps(alpha[h])) } else { a }
        })
    })
}

/// Stores [`rescaled_sums`]' vectors back into the row's `acc` once a run's values are in.
///
/// # Safety
/// The CPU has AVX-512 F; `H <= 3`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_sums<const H: usize>(state: &mut Running, sums: &[[std::arch::x86_64::__m512; 4]; H]) {
    use std::arch::x86_64::*;
    for (h, sums) in sums.iter().enumerate() {
        for (v, sum) in sums.iter().enumerate() {
            // SAFETY: `acc` holds 64 elements per head, H <= 3.
            unsafe { _mm512_storeu_ps(state.acc.as_mut_ptr().add(h * 64 + 16 * v), *sum) };
        }
    }
}

/// Writes each row's heads, `acc * (1 / total)`, to `out` (row `r`'s at `r * row_len`).
/// Shared with [`super::int8`]'s kernel.
///
/// # Safety
/// The CPU has AVX-512 F; `H <= 3`; `out` holds `(running.len() - 1) * row_len + 64 H`
/// elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn write_rows<const H: usize>(running: &[Running], out: &mut [f32], row_len: usize) {
    use std::arch::x86_64::*;
    const K: usize = 64;
    debug_assert!(H <= 3 && out.len() >= (running.len() - 1) * row_len + H * K);
    for (row, state) in running.iter().enumerate() {
        for h in 0..H {
            let inverse = _mm512_set1_ps(1.0 / state.total[h]);
            for e in (0..K).step_by(16) {
                // SAFETY: `acc` holds 64 elements per head; the caller's promise for `out`.
                unsafe {
                    let a = _mm512_loadu_ps(state.acc.as_ptr().add(h * K + e));
                    _mm512_storeu_ps(out.as_mut_ptr().add(row * row_len + h * K + e), _mm512_mul_ps(a, inverse));
                }
            }
        }
    }
}

/// [`heads_avx512`] for one head count.
#[cfg(target_arch = "x86_64")]
type Kernel = unsafe fn(
    &[f32],
    &mut [f32],
    usize,
    &[usize],
    &[u16],
    &[u16],
    &[usize],
    usize,
    f32,
    &dyn Fn(usize),
    &mut Vec<Running>,
);

/// [`attend`]'s kernel for `H` heads of 64 in each of `seen.len()` rows (row `r`'s queries at
/// `r * row_len` in `queries`, its outputs there in `out`). Per run of 16 keys, the run's
/// keys and values are widened to f32 ([`widen`]): once into 8 KB of scratch in L1 where
/// several rows use them, in registers as used where one row does. Then per row
/// ([`run_step`]): the scores of every head in four chains of one vector each (12
/// accumulators for 3 heads, two fused multiply-adds per element pair and head), the softmax
/// step in registers, and the weighted sum: per key 4 value vectors shared by the heads, one
/// multiply-add per vector and head into the row's 12 accumulators. A run's keys and values
/// are read from the cache once for all the rows. `running` is scratch, one [`Running`] per
/// row.
///
/// # Safety
/// The CPU has AVX-512 F and BF16, AVX2 and FMA; `block_size` is a multiple of 16; every
/// start in `blocks` begins `64 * block_size` readable keys and values; `seen` is non-empty
/// and non-decreasing, its last at most `blocks.len() * block_size`; `queries` and `out` hold
/// `(seen.len() - 1) * row_len + 64 H` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn heads_avx512<const H: usize>(
    queries: &[f32],
    out: &mut [f32],
    row_len: usize,
    seen: &[usize],
    keys: &[u16],
    values: &[u16],
    blocks: &[usize],
    block_size: usize,
    scale: f32,
    ahead: &dyn Fn(usize),
    running: &mut Vec<Running>,
) {
    use std::arch::x86_64::*;
    const K: usize = 64;
    let rows = seen.len();
    debug_assert!(H <= 3 && queries.len() >= (rows - 1) * row_len + H * K && out.len() >= queries.len());
    running.clear();
    running.resize(rows, Running::START);
    let scale = _mm512_set1_ps(scale);
    // The run's keys, element-major (`[e][slot]`: element `e` of the 16 keys in one vector),
    // and values, slot-major (`[slot][e]`), as f32.
    let mut run_keys = [_mm512_setzero_ps(); K];
    let mut run_values = [[_mm512_setzero_ps(); K / 16]; RUN];
    // SAFETY: the caller's promise for the features, the keys, the values and the sizes;
    // `acc` and `query` hold 64 elements per head, `w` 16 weights per head.
    unsafe {
        for (row, state) in running.iter_mut().enumerate() {
            for h in 0..H {
                for v in 0..K / 16 {
                    let q = _mm512_loadu_ps(queries.as_ptr().add(row * row_len + h * K + 16 * v));
                    _mm512_storeu_ps(state.query.as_mut_ptr().add(h * K + 16 * v), rounded_to_bf16(q));
                }
            }
        }
        for_each_run(blocks, block_size, seen, ahead, |start, first, done, run_len, first_row| {
            // Pair p of the run's 16 slots: 16 words at `start + p * 2 * block_size + 2 * first`,
            // element 2p in the low half of each, 2p + 1 in the high half.
            let key_base = keys.as_ptr().add(start + 2 * first);
            // The run's slot pairs: 2 * 64 bf16 each, from `start + first * 64`; vector v
            // of a pair holds elements 16v..16v + 16 of both slots, the even slot low.
            let value_base = values.as_ptr().add(start + first * K);
            let key_pair = |p: usize| widen(_mm512_loadu_si512(key_base.add(p * 2 * block_size).cast()));
            let value_pair =
                |pair: usize, v: usize| widen(_mm512_loadu_si512(value_base.add(pair * 2 * K + 32 * v).cast()));
            let active = &mut running[first_row..];
            if let [state] = active {
                // One row: widened in registers as used.
                run_step::<H>(state, RUN.min(seen[rows - 1] - done), scale, key_pair, value_pair);
            } else {
                // Several rows: widened once into L1 for all of them.
                for p in 0..K / 2 {
                    (run_keys[2 * p], run_keys[2 * p + 1]) = key_pair(p);
                }
                let (slot_pairs, _) = run_values.as_chunks_mut::<2>();
                for (pair, [even, odd]) in slot_pairs.iter_mut().enumerate().take(run_len.div_ceil(2)) {
                    for (v, (even, odd)) in even.iter_mut().zip(odd.iter_mut()).enumerate() {
                        (*even, *odd) = value_pair(pair, v);
                    }
                }
                for (offset, state) in active.iter_mut().enumerate() {
                    let take = RUN.min(seen[first_row + offset] - done);
                    run_step::<H>(
                        state,
                        take,
                        scale,
                        |p| (run_keys[2 * p], run_keys[2 * p + 1]),
                        |pair, v| (run_values[2 * pair][v], run_values[2 * pair + 1][v]),
                    );
                }
            }
        });
        write_rows::<H>(running, out, row_len);
    }
}

/// The even and odd elements of 16 bf16 pairs (the even one in each word's low half) as
/// two f32 vectors: a bf16 is the top half of an f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn widen(x: std::arch::x86_64::__m512i) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512) {
    use std::arch::x86_64::*;
    let even = _mm512_slli_epi32::<16>(x);
    let odd = _mm512_and_si512(x, _mm512_set1_epi32(0xFFFF_0000u32 as i32));
    (_mm512_castsi512_ps(even), _mm512_castsi512_ps(odd))
}

/// 16 f32 rounded to bf16 as `vcvtneps2bf16` rounds ([`to_bf16`]), as f32 again (exact).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512vl")]
#[inline]
fn rounded_to_bf16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let bits = half_bits(_mm512_cvtneps_pbh(x));
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
}

/// One row's step of [`heads_avx512`] over a run of 16 keys of which it sees `take`:
/// `key_pair(p)` gives elements 2p and 2p + 1 of the run's 16 keys (a lane per key),
/// `value_pair(pair, v)` elements 16v..16v + 16 of the values of keys 2 pair and 2 pair + 1.
///
/// # Safety
/// The CPU has AVX-512 F and BF16, AVX2 and FMA; `H <= 3`; `0 < take <= 16`; the closures
/// read only what exists for `p < 32`, `pair < take.div_ceil(2)`, `v < 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16,avx512vl,avx2,fma")]
#[inline]
unsafe fn run_step<const H: usize>(
    state: &mut Running,
    take: usize,
    scale: std::arch::x86_64::__m512,
    key_pair: impl Fn(usize) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512),
    value_pair: impl Fn(usize, usize) -> (std::arch::x86_64::__m512, std::arch::x86_64::__m512),
) {
    use std::arch::x86_64::*;
    const K: usize = 64;
    // SAFETY: `query` and `acc` hold 64 elements per head, `w` 16 weights per head; the
    // closures' reads are the caller's promise.
    unsafe {
        let mut dots = [[_mm512_setzero_ps(); 4]; H];
        for p4 in (0..K / 2).step_by(4) {
            for chain in 0..4 {
                let p = p4 + chain;
                let (even, odd) = key_pair(p);
                for (h, dots) in dots.iter_mut().enumerate() {
                    let q = state.query.as_ptr().add(h * K + 2 * p);
                    let c = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(1)), odd, dots[chain]);
                    dots[chain] = _mm512_fmadd_ps(_mm512_set1_ps(*q), even, c);
                }
            }
        }
        // The softmax step: keys past `take` score -inf, so weigh 0.
        let keep: __mmask16 = if take == RUN { 0xFFFF } else { (1u16 << take) - 1 };
        let mut w = [[0f32; RUN]; H];
        let mut alpha = [1f32; H];
        for h in 0..H {
            let [c0, c1, c2, c3] = dots[h];
            let s = _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)), scale);
            let s = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), keep, s);
            // The weights rounded to bf16, summed in the spec's order.
            let back;
            (back, alpha[h]) = softmax_step(s, &mut state.max[h], &mut state.total[h], |w| rounded_to_bf16(w));
            _mm512_storeu_ps(w[h].as_mut_ptr(), back);
        }
        // The weighted sum: all 64 elements of every head, a pair of keys at a time, the odd
        // key first.
        let mut sums = rescaled_sums::<H>(state, &alpha);
        for pair in 0..take.div_ceil(2) {
            // A key past this row's last counts 0 (its slot may hold stale values).
            let last = 2 * pair + 1 == take;
            let values: [(__m512, __m512); 4] = std::array::from_fn(|v| {
                let (even, odd) = value_pair(pair, v);
                (even, if last { _mm512_setzero_ps() } else { odd })
            });
            for (h, sums) in sums.iter_mut().enumerate() {
                let (w_even, w_odd) = (_mm512_set1_ps(w[h][2 * pair]), _mm512_set1_ps(w[h][2 * pair + 1]));
                for (sum, (even, odd)) in sums.iter_mut().zip(values) {
                    let c = _mm512_fmadd_ps(w_odd, odd, *sum);
                    *sum = _mm512_fmadd_ps(w_even, even, c);
                }
            }
        }
        store_sums::<H>(state, &sums);
    }
}

/// 16 bf16 as the integer vector of their bits.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn half_bits(x: std::arch::x86_64::__m256bh) -> std::arch::x86_64::__m256i {
    // SAFETY: two 256-bit vector types of the same size; any bits are valid for both.
    unsafe { std::mem::transmute(x) }
}

/// [`exp`] of 16 lanes, the same operations lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn exp16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use super::f16::{EXP_MAX, EXP_MIN, EXP_POLY, LN2_HI, LN2_LO};
    use std::arch::x86_64::*;
    // `!(x >= EXP_MIN)` gives 0, NaN included (an ordered comparison is false for NaN).
    let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(EXP_MIN));
    let x = _mm512_min_ps(x, _mm512_set1_ps(EXP_MAX));
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        x,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x);
    let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), r);
    let mut p = _mm512_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0));
    let power = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)));
    _mm512_maskz_mov_ps(keep, _mm512_mul_ps(y, _mm512_castsi512_ps(power)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::backend::cpu::attention::f16::PREFETCH_BLOCKS;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::engine::backend::test_values(n, seed as u32)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// The edge values of the conversion, and where the CPU has the instruction, the scalar
    /// conversion is exactly `vcvtne2ps2bf16`; `dot2` is two fused multiply-adds, the odd
    /// element first, subnormal results kept.
    #[test]
    fn the_conversion_is_the_instruction_and_dot2_its_two_steps() {
        assert_eq!(to_bf16(1.0), 0x3F80);
        assert_eq!(to_bf16(-2.0), 0xC000);
        // Ties to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
        assert_eq!(to_bf16(1.0 + 1.0 / 256.0), 0x3F80);
        assert_eq!(to_bf16(1.0 + 3.0 / 256.0), 0x3F82);
        assert_eq!(to_bf16(f32::MIN_POSITIVE / 4.0), 0);
        assert_eq!(to_bf16(-f32::MIN_POSITIVE / 4.0), 0x8000);
        assert_eq!(to_bf16(f32::INFINITY), 0x7F80);
        assert_eq!(to_bf16(f32::MAX), 0x7F80);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(dot2(1.0, [2.0, 3.0], [4.0, 5.0]), 24.0);
        // Odd first: 1 + 2^-24 rounds to 1 before the even product cancels the 1 (even first
        // would give 2^-24), and the other way round the 1 cancels first.
        let tiny = 2f32.powi(-24);
        assert_eq!(dot2(1.0, [-1.0, tiny], [1.0, 1.0]), 0.0);
        assert_eq!(dot2(1.0, [tiny, -1.0], [1.0, 1.0]), tiny);
        // A subnormal result stays.
        let sub = dot2(0.0, [f32::MIN_POSITIVE, 0.0], [0.5, 0.0]);
        assert!(sub.is_subnormal(), "{sub}");
        let mut edges = values(1000, 4);
        edges.iter_mut().enumerate().for_each(|(i, x)| *x *= [1.0, 1e-39, 3e38, 1e-5][i % 4]);
        edges.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, 1.0 + 1.0 / 256.0]);
        let mut slice = vec![0u16; edges.len()];
        to_bf16_slice(&edges, &mut slice);
        for (x, b) in edges.iter().zip(&slice) {
            assert_eq!(*b, to_bf16(*x), "to_bf16_slice({x})");
        }
        #[cfg(target_arch = "x86_64")]
        if accelerated() {
            let mut xs = values(4096, 3);
            xs.iter_mut().enumerate().for_each(|(i, x)| *x *= [1.0, 1e-19, 1e-36, 1e30][i % 4]);
            xs.extend([0.0, -0.0, f32::MIN_POSITIVE, f32::MIN_POSITIVE / 3.0, 1.0 + 1.0 / 256.0, f32::MAX]);
            while !xs.len().is_multiple_of(32) {
                xs.push(0.5);
            }
            for chunk in xs.chunks(32) {
                // SAFETY: AVX-512 F and BF16 checked by `accelerated`.
                let a = unsafe {
                    use std::arch::x86_64::*;
                    std::mem::transmute::<__m512bh, [u16; 32]>(_mm512_cvtne2ps_pbh(
                        _mm512_loadu_ps(chunk.as_ptr().add(16)),
                        _mm512_loadu_ps(chunk.as_ptr()),
                    ))
                };
                for i in 0..32 {
                    assert_eq!(a[i], to_bf16(chunk[i]), "convert {}", chunk[i]);
                }
            }
        }
    }

    /// The specification is softmax attention, to bf16's precision: within 2e-2 of it
    /// computed in f64 from the unrounded inputs (keys, values and weights each round to 8
    /// bits of mantissa).
    #[test]
    fn the_reference_is_softmax_attention() {
        let head_dim = 64;
        for n in [1usize, 15, 16, 17, 100, 700] {
            let query: Vec<f32> = values(head_dim, 1).iter().map(|x| 4.0 * x).collect();
            let keys = values(n * head_dim, 2);
            let vals = values(n * head_dim, 3);
            let mut out = vec![0f32; head_dim];
            let key = |j: usize, e: usize| to_bf16(keys[j * head_dim + e]);
            let value = |j: usize, e: usize| to_bf16(vals[j * head_dim + e]);
            reference_head(&query, n, key, value, 0.125, &mut out);
            let scores: Vec<f64> = (0..n)
                .map(|j| (0..head_dim).map(|e| query[e] as f64 * keys[j * head_dim + e] as f64).sum::<f64>() * 0.125)
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (e, &got) in out.iter().enumerate() {
                let want: f64 =
                    weights.iter().enumerate().map(|(j, w)| w * vals[j * head_dim + e] as f64).sum::<f64>() / total;
                assert!((got as f64 - want).abs() <= 2e-2, "n {n}, element {e}: {got} vs {want}");
            }
        }
    }

    /// A cache of `pool` blocks of `block_size` slots (64 elements) in the paired layout,
    /// from f32 keys and values slot-major per block.
    fn paired(keys: &[f32], vals: &[f32], pool: usize, block_size: usize) -> (Vec<u16>, Vec<u16>) {
        let per_block = 64 * block_size;
        let (mut k, mut v) = (vec![0u16; pool * per_block], vec![0u16; pool * per_block]);
        for b in 0..pool {
            for slot in 0..block_size {
                for e in 0..64 {
                    let from = b * per_block + slot * 64 + e;
                    k[b * per_block + key_index(e, slot, block_size)] = to_bf16(keys[from]);
                    v[b * per_block + value_index(e, slot, 64)] = to_bf16(vals[from]);
                }
            }
        }
        (k, v)
    }

    /// The kernel gives the specification's outputs bit for bit (scattered blocks of 16 and
    /// 32 slots, partial last runs, odd key counts, 1 to 7 heads per kv head), stale values
    /// past the last key (here infinities) change nothing, and the prefetch callback reaches
    /// the blocks ahead.
    #[test]
    fn the_kernel_equals_the_reference() {
        for block_size in [16usize, 32] {
            let per_block = 64 * block_size;
            let pool = 24;
            let (keys, clean) = paired(&values(pool * per_block, 5), &values(pool * per_block, 6), pool, block_size);
            for n in [1usize, 7, 16, 17, 33, 100, 16 * 12, 16 * 12 + 5] {
                let used = n.div_ceil(block_size);
                let blocks: Vec<usize> = (0..used).map(|b| ((b * 7 + 3) % pool) * per_block).collect();
                // The slot after the last key holds a value that would poison the sum.
                let mut vals = clean.clone();
                if !n.is_multiple_of(block_size) {
                    let (start, slot) = (blocks[n / block_size], n % block_size);
                    for e in 0..64 {
                        vals[start + value_index(e, slot, 64)] = to_bf16(f32::INFINITY);
                    }
                }
                for heads in 1..=7usize {
                    let queries: Vec<f32> = values(heads * 64, heads as u64).iter().map(|x| 3.0 * x).collect();
                    let asked = std::cell::RefCell::new(Vec::new());
                    let mut got = vec![f32::NAN; heads * 64];
                    let ahead = |b| asked.borrow_mut().push(b);
                    attend(&queries, 64, &keys, &vals, &blocks, block_size, &[n], 0.125, &mut got, ahead);
                    let slot = |j: usize| (blocks[j / block_size], j % block_size);
                    let key = |j: usize, e: usize| {
                        let (start, s) = slot(j);
                        keys[start + key_index(e, s, block_size)]
                    };
                    let value = |j: usize, e: usize| {
                        let (start, s) = slot(j);
                        vals[start + value_index(e, s, 64)]
                    };
                    for (h, got) in got.chunks(64).enumerate() {
                        let mut want = vec![0f32; 64];
                        reference_head(&queries[h * 64..][..64], n, key, value, 0.125, &mut want);
                        assert!(got.iter().all(|x| x.is_finite()), "block {block_size}, n {n}, head {h}");
                        assert_eq!(bits(got), bits(&want), "block {block_size}, n {n}, head {h} of {heads}");
                    }
                    if used > PREFETCH_BLOCKS && accelerated() {
                        assert!(asked.borrow().contains(&PREFETCH_BLOCKS), "block {block_size}, n {n}");
                    }
                }
            }
        }
    }

    /// Rows of one sequence attended together (a chunk) each get the numbers of that row
    /// attended alone, bit for bit, for 1 to 7 heads.
    #[test]
    fn rows_attended_together_equal_each_row_alone() {
        let block_size = 16;
        let per_block = 64 * block_size;
        let pool = 20;
        let (keys, vals) = paired(&values(pool * per_block, 8), &values(pool * per_block, 9), pool, block_size);
        let blocks: Vec<usize> = (0..pool).map(|b| ((b * 3 + 5) % pool) * per_block).collect();
        let spans: [&[usize]; 5] = [
            &[1, 2, 3],
            &[15, 16, 17, 18],
            &[40, 40, 41, 60],
            &[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115],
            &[7, 250, 320],
        ];
        for heads in 1..=7usize {
            for seen in spans {
                let row_len = heads * 64;
                let queries: Vec<f32> =
                    values(seen.len() * row_len, 20 + heads as u64).iter().map(|x| 3.0 * x).collect();
                let mut together = vec![f32::NAN; queries.len()];
                attend(&queries, 64, &keys, &vals, &blocks, block_size, seen, 0.125, &mut together, |_| {});
                for (r, &n) in seen.iter().enumerate() {
                    let mut alone = vec![f32::NAN; row_len];
                    let query = &queries[r * row_len..][..row_len];
                    attend(query, 64, &keys, &vals, &blocks, block_size, &[n], 0.125, &mut alone, |_| {});
                    assert_eq!(
                        bits(&together[r * row_len..][..row_len]),
                        bits(&alone),
                        "{heads} heads, rows {seen:?}, row {r}"
                    );
                }
            }
        }
    }
}
