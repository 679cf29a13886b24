//! One row's attention over an f16 KV cache in a single pass: the scores, the softmax and the
//! weighted sum of values go run by run of [`RUN`] keys, the softmax's maximum and
//! denominator kept running (the online softmax of FlashAttention).
//!
//! Why one pass: in two passes (every score, then the softmax, then the weighted sum over
//! every value) a sequence's values are read from memory a second time, after the scores
//! have streamed all of its keys. At serving contexts that is about 77 KB of one kv head's
//! values per row and layer at 600 tokens, and with eight sequences decoding a step's keys and
//! values (about 110 MB for SmolLM2) are far larger than the CPU's caches, so the second pass
//! waited on memory: in a profile of `dspark bench` at concurrency 8 the weighted sums took
//! twice the scores' time while doing the same number of multiply-adds. Here a run's values
//! are used right after its keys, the blocks a few ahead are prefetched meanwhile, each score
//! costs one [`exp`] (a short f32 polynomial) and no division, and only the `head_dim`
//! outputs are divided by the denominator.
//!
//! Numerics. An f16 cache rounds every key and value, so no reference is reproduced bit for
//! bit anyway; f32 caches keep candle's orders (`cpu.rs`) for the reference-parity tests. The
//! order here is a fixed function of the row (the same whatever batch, chunk or step the row
//! comes in), and the vector kernel computes exactly [`reference_head`]:
//!
//! ```text
//! m = -inf, l = 0, acc = 0
//! for each run of keys 16r .. 16r + t (t <= 16):
//!     s_j   = two_chain_dot(q, k_j) * scale                  (key_lanes::two_chain_dot)
//!     alpha = exp(m - max_j s_j) and m = max_j s_j   if that max exceeds m, else alpha = 1
//!     p_j   = exp(s_j - m)
//!     l     = l * alpha + (((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))),
//!             v_i = p_i + p_(i+8) (a key past t counts 0)
//!     acc_e = c0 + c1, from c0 = acc_e * alpha, c1 = 0, then for each key j of the run
//!             c_(j mod 2) = fma(p_j, v_j[e], c_(j mod 2))
//! out_e = acc_e * (1 / l)
//! ```
//!
//! The weighted sum keeps two chains (even and odd keys) for the same reason as the scores:
//! one chain per accumulator waits on each fused multiply-add's latency.

use super::key_lanes::{KeyElement, KeyLanes};

/// Keys per step of the online softmax: the score kernel's 16 keys (two AVX2 vectors).
pub const RUN: usize = 16;

/// How many blocks ahead [`attend`] calls `ahead`.
pub(super) const PREFETCH_BLOCKS: usize = 4;

/// `exp(x)` to within about 2 units in the last place, for the softmax of f16 caches: `x` is
/// split as `n ln 2 + r` (`n` the nearest integer to `x / ln 2`, `ln 2` in two parts),
/// `exp(r)` is Cephes' degree-7 polynomial in Horner's form with fused multiply-adds, and `2^n`
/// is built from its exponent bits. Inputs below -87 (and NaN) give 0, inputs above 88 are
/// taken as 88. The vector kernel's `exp8` computes the same operations lane by lane.
pub fn exp(x: f32) -> f32 {
    // NaN too: an ordered comparison is false for it.
    if x.is_nan() || x < EXP_MIN {
        return 0.0;
    }
    let x = x.min(EXP_MAX);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // -126 <= n <= 127 for the inputs kept: a normal power of two.
    y * f32::from_bits(((n as i32 + 127) << 23) as u32)
}

/// Below this [`exp`] returns 0 (exp(-87) is about 1.6e-38, near the smallest normal f32).
pub(super) const EXP_MIN: f32 = -87.0;
/// Above this [`exp`] takes the input as this (exp(88) is about 1.65e38).
pub(super) const EXP_MAX: f32 = 88.0;
/// `ln 2` in two parts: the first exact in few bits, so `n * LN2_HI` is exact.
pub(super) const LN2_HI: f32 = 0.693_359_4;
pub(super) const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes' `expf` coefficients, highest power first: `exp(r) ~ 1 + r + r^2 P(r)`.
pub(super) const EXP_POLY: [f32; 6] = [1.987_569_2e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// The specification of one head's output ([module docs](self)): `n` keys, `key(j, e)` and
/// `value(j, e)` element `e` of key and value `j`, `out` of the query's length. The loop of
/// [`attend`] where its vector kernel cannot run, and what that kernel is tested against.
pub fn reference_head(
    query: &[f32],
    n: usize,
    key: impl Fn(usize, usize) -> f32,
    value: impl Fn(usize, usize) -> f32,
    scale: f32,
    out: &mut [f32],
) {
    let (mut max, mut total) = (f32::NEG_INFINITY, 0f32);
    out.fill(0.0);
    let mut scores = [0f32; RUN];
    for first in (0..n).step_by(RUN) {
        let take = RUN.min(n - first);
        for (j, score) in scores.iter_mut().enumerate() {
            *score = if j < take {
                let mut chains = [0f32; 2];
                for (e, q) in query.iter().enumerate() {
                    chains[e % 2] = q.mul_add(key(first + j, e), chains[e % 2]);
                }
                (chains[0] + chains[1]) * scale
            } else {
                f32::NEG_INFINITY
            };
        }
        let (p, alpha) = softmax_step(&scores, &mut max, &mut total, |w| w);
        for (e, out) in out.iter_mut().enumerate() {
            let mut chains = [*out * alpha, 0.0];
            for (j, &p) in p.iter().enumerate().take(take) {
                chains[j % 2] = p.mul_add(value(first + j, e), chains[j % 2]);
            }
            *out = chains[0] + chains[1];
        }
    }
    let inverse = 1.0 / total;
    for out in out.iter_mut() {
        *out *= inverse;
    }
}

/// The attention of a group of heads sharing one kv head, for one or more rows of a sequence
/// ([module docs](self)). Row `r` sees the first `seen[r]` positions; `seen` must not
/// decrease (a chunk's rows in order). `queries` holds each row's `heads` queries one after
/// the other (`heads = queries.len() / (seen.len() * head_dim)`), rows one after the other,
/// and `out` receives their outputs in the same layout. `blocks` holds where each of the
/// sequence's cache blocks starts, at the same offset in `keys` (dimension-major within the
/// block: element `e` of slot `j` at `start + e * block_size + j`) and in `values`
/// (slot-major: at `start + j * head_dim + e`). `ahead(b)` is called when block `b` is a few
/// blocks away, to prefetch it.
///
/// Every row gets exactly the numbers it would get alone: the rows of a chunk (a prefill, a
/// fast-forward span, a draft) only share the reading of the keys and values. The AVX2 kernel
/// goes run by run and, for each run, row by row, so a run's 4 KB of keys and values are
/// read from memory once for all the rows and from L1 after the first.
///
/// With `lanes` [`KeyLanes::Avx2`] or wider, head size 64 and block sizes that are multiples
/// of [`RUN`], the AVX2 kernel runs (on AVX-512 CPUs too, so every x86 machine computes the
/// same numbers); otherwise [`reference_head`] per row and head.
///
/// # Panics
/// If `queries` and `out` differ in length or are not a multiple of `seen.len() * head_dim`,
/// `seen` is empty or decreases, `blocks` holds fewer than `max(seen).div_ceil(block_size)`
/// starts, or a used block runs past the end of `keys` or `values`.
#[allow(clippy::too_many_arguments)]
pub fn attend<T: KeyElement>(
    lanes: KeyLanes,
    queries: &[f32],
    head_dim: usize,
    keys: &[T],
    values: &[T],
    blocks: &[usize],
    block_size: usize,
    seen: &[usize],
    scale: f32,
    out: &mut [f32],
    ahead: impl Fn(usize),
) {
    let AttendShape { heads, row_len, used } =
        AttendShape::check(queries.len(), out.len(), head_dim, keys.len().min(values.len()), blocks, block_size, seen);
    let blocks = &blocks[..used];
    #[cfg(target_arch = "x86_64")]
    if lanes != KeyLanes::Scalar && head_dim == 64 && block_size.is_multiple_of(RUN) {
        let mut running = Vec::new();
        for first_head in (0..heads).step_by(3) {
            let kernel: Kernel<T> = match (heads - first_head).min(3) {
                1 => heads_avx2::<T, 1>,
                2 => heads_avx2::<T, 2>,
                _ => heads_avx2::<T, 3>,
            };
            let at = first_head * head_dim;
            // SAFETY: `KeyLanes::Avx2` and wider are only detected with AVX2, FMA and F16C;
            // every used block's keys and values are inside `keys` and `values` (asserted
            // above); the block size is a multiple of 16; rows of `row_len` elements hold
            // the group's heads from `at` on.
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
    let _ = (lanes, ahead);
    let slot = |j: usize| (blocks[j / block_size], j % block_size);
    let key = |j: usize, e: usize| {
        let (start, s) = slot(j);
        keys[start + e * block_size + s].to_f32()
    };
    let value = |j: usize, e: usize| {
        let (start, s) = slot(j);
        values[start + s * head_dim + e].to_f32()
    };
    let rows = queries.chunks(row_len).zip(out.chunks_mut(row_len)).zip(seen);
    for ((queries, out), &n) in rows {
        for (query, out) in queries.chunks(head_dim).zip(out.chunks_mut(head_dim)) {
            reference_head(query, n, key, value, scale, out);
        }
    }
}

/// Walks the runs of up to [`RUN`] keys of a sequence's `blocks` (where each starts in the
/// cache, `block_size` slots each) that the rows `seen` (non-decreasing key counts) attend
/// to, calling `ahead(b)` [`PREFETCH_BLOCKS`] blocks ahead of block `b`, and `run(start,
/// first, done, run_len, first_row)` for each: the run is slots `first..first + run_len` of
/// the block at `start`, keys `done..done + run_len` of the sequence, and rows from
/// `first_row` on see some of them. Shared by the three caches' kernels.
#[inline(always)]
pub(super) fn for_each_run(
    blocks: &[usize],
    block_size: usize,
    seen: &[usize],
    ahead: &dyn Fn(usize),
    mut run: impl FnMut(usize, usize, usize, usize, usize),
) {
    let n = seen[seen.len() - 1];
    // Rows before `first_row` have seen all their keys.
    let mut first_row = 0;
    let mut done = 0;
    for (b, &start) in blocks.iter().enumerate() {
        if b + PREFETCH_BLOCKS < blocks.len() {
            ahead(b + PREFETCH_BLOCKS);
        }
        let mut first = 0;
        while first < block_size && done < n {
            while seen[first_row] <= done {
                first_row += 1;
            }
            let run_len = RUN.min(n - done);
            run(start, first, done, run_len, first_row);
            done += run_len;
            first += RUN;
        }
    }
}

/// The reference kernels' online softmax step over a run's scores (keys past the run at
/// -inf): raises `max` to the run's largest score where that exceeds it, and returns the
/// weights `round(exp(s - max))` and the factor `alpha` the earlier sums are rescaled by,
/// after adding the weights to `total * alpha` in the order `((v0 + v4) + (v2 + v6)) + ((v1 +
/// v5) + (v3 + v7))`, `v_i = w_i + w_(i+8)`. Shared by the three caches' `reference_head`s.
pub(super) fn softmax_step(
    scores: &[f32; RUN],
    max: &mut f32,
    total: &mut f32,
    round: impl Fn(f32) -> f32,
) -> ([f32; RUN], f32) {
    let run_max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut alpha = 1.0;
    if run_max > *max {
        alpha = exp(*max - run_max);
        *max = run_max;
    }
    let w: [f32; RUN] = std::array::from_fn(|j| round(exp(scores[j] - *max)));
    let v: [f32; 8] = std::array::from_fn(|i| w[i] + w[i + 8]);
    *total = *total * alpha + (((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])));
    (w, alpha)
}

/// The shape of an attention call over a paged cache, checked: the heads per row, the
/// elements per row and the blocks the rows use. Shared by [`attend`] and
/// [`super::bf16::attend`], which panic as their docs say through it.
pub(super) struct AttendShape {
    pub heads: usize,
    pub row_len: usize,
    pub used: usize,
}

impl AttendShape {
    /// Checks `queries` and `out` (`queries_len`, `out_len` elements) against `seen`'s rows,
    /// and that every block a row uses starts `head_dim * block_size` elements inside a cache
    /// of `cache_len` (the shorter of the keys and the values).
    pub(super) fn check(
        queries_len: usize,
        out_len: usize,
        head_dim: usize,
        cache_len: usize,
        blocks: &[usize],
        block_size: usize,
        seen: &[usize],
    ) -> Self {
        let rows = seen.len();
        assert!(rows > 0 && seen.windows(2).all(|w| w[0] <= w[1]), "rows must see non-decreasing key counts");
        let row_len = queries_len / rows;
        assert!(head_dim > 0 && queries_len == out_len && queries_len == rows * row_len);
        assert!(row_len.is_multiple_of(head_dim));
        let used = seen[rows - 1].div_ceil(block_size.max(1));
        assert!(blocks.len() >= used);
        let per_block = head_dim * block_size;
        let inside = |start: &usize| start.checked_add(per_block).is_some_and(|end| end <= cache_len);
        assert!(blocks[..used].iter().all(inside));
        Self { heads: row_len / head_dim, row_len, used }
    }
}

/// One row's running softmax for up to 3 heads of 64: the maximum, the denominator and the
/// unnormalised weighted sums.
#[derive(Clone, Copy)]
struct Running {
    max: [f32; 3],
    total: [f32; 3],
    acc: [f32; 64 * 3],
}

impl Running {
    const START: Self = Self { max: [f32::NEG_INFINITY; 3], total: [0.0; 3], acc: [0.0; 64 * 3] };
}

/// [`heads_avx2`] for one head count.
#[cfg(target_arch = "x86_64")]
type Kernel<T> =
    unsafe fn(&[f32], &mut [f32], usize, &[usize], &[T], &[T], &[usize], usize, f32, &dyn Fn(usize), &mut Vec<Running>);

/// [`attend`]'s AVX2 kernel for `H` heads of 64 in each of `seen.len()` rows (row `r`'s
/// queries at `r * row_len` in `queries`, its outputs there in `out`). Per run of 16 keys and
/// row: the scores in two vectors and both chains (12 accumulators for 3 heads), the softmax
/// step in registers, then the weighted sum 16 elements of every head at a time (12
/// accumulators again, loaded from and stored to the row's [`Running`] sums in L1, the run's
/// values in L1 too). `running` is scratch, one [`Running`] per row.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `block_size` is a multiple of 16; every start in `blocks`
/// begins `64 * block_size` readable keys and values; `seen` is non-empty and non-decreasing,
/// its last at most `blocks.len() * block_size`; `queries` and `out` hold
/// `(seen.len() - 1) * row_len + 64 H` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn heads_avx2<T: KeyElement, const H: usize>(
    queries: &[f32],
    out: &mut [f32],
    row_len: usize,
    seen: &[usize],
    keys: &[T],
    values: &[T],
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
    let scale = _mm256_set1_ps(scale);
    // SAFETY: the caller's promise for the features, the keys, the values and the sizes;
    // `acc` holds 64 elements per head; `p` 16 weights per head.
    unsafe {
        for_each_run(blocks, block_size, seen, ahead, |start, first, done, _, first_row| {
            let key_base = keys.as_ptr().add(start + first);
            let value_base = values.as_ptr().add(start + first * K);
            for (row, state) in running.iter_mut().enumerate().skip(first_row) {
                let q = queries.as_ptr().add(row * row_len);
                let take = RUN.min(seen[row] - done);
                // Scores: element e of the run's 16 keys is 16 consecutive keys at
                // `first + e * block_size`; even elements in one chain, odd in the other.
                let mut dots = [[[_mm256_setzero_ps(); 2]; 2]; H];
                for e in (0..K).step_by(2) {
                    for chain in 0..2 {
                        let at = key_base.add((e + chain) * block_size);
                        let x = [T::load8(at), T::load8(at.add(8))];
                        for (h, dots) in dots.iter_mut().enumerate() {
                            let qe = _mm256_broadcast_ss(&*q.add(h * K + e + chain));
                            dots[chain][0] = _mm256_fmadd_ps(qe, x[0], dots[chain][0]);
                            dots[chain][1] = _mm256_fmadd_ps(qe, x[1], dots[chain][1]);
                        }
                    }
                }
                // The softmax step: keys past `take` score -inf, so weigh 0.
                let past = |half: i32| {
                    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(take as i32 - half), lane))
                };
                let keep = [past(0), past(8)];
                let mut p = [[0f32; RUN]; H];
                let mut alpha = [1f32; H];
                for h in 0..H {
                    let s: [__m256; 2] = std::array::from_fn(|v| {
                        let s = _mm256_mul_ps(_mm256_add_ps(dots[h][0][v], dots[h][1][v]), scale);
                        if take < RUN { _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), s, keep[v]) } else { s }
                    });
                    let run_max = horizontal_max(_mm256_max_ps(s[0], s[1]));
                    if run_max > state.max[h] {
                        alpha[h] = exp(state.max[h] - run_max);
                        state.max[h] = run_max;
                    }
                    let m = _mm256_set1_ps(state.max[h]);
                    let weights = [exp8(_mm256_sub_ps(s[0], m)), exp8(_mm256_sub_ps(s[1], m))];
                    _mm256_storeu_ps(p[h].as_mut_ptr(), weights[0]);
                    _mm256_storeu_ps(p[h].as_mut_ptr().add(8), weights[1]);
                    state.total[h] = state.total[h] * alpha[h] + horizontal_sum(_mm256_add_ps(weights[0], weights[1]));
                }
                // The weighted sum: 16 elements of every head at a time over the run's values.
                let rescale = alpha.iter().any(|&a| a != 1.0);
                let alphas: [__m256; H] = std::array::from_fn(|h| _mm256_set1_ps(alpha[h]));
                let acc = state.acc.as_mut_ptr();
                for slice in (0..K).step_by(16) {
                    let mut chains: [[[__m256; 2]; 2]; H] = std::array::from_fn(|h| {
                        let from = |v: usize| {
                            let a = _mm256_loadu_ps(acc.add(h * K + slice + 8 * v));
                            // Multiplying by 1 changes nothing: skipped.
                            if rescale { _mm256_mul_ps(a, alphas[h]) } else { a }
                        };
                        [[from(0), from(1)], [_mm256_setzero_ps(); 2]]
                    });
                    let mut j = 0;
                    while j < take {
                        for (chain, j) in (j..take.min(j + 2)).enumerate() {
                            let at = value_base.add(j * K + slice);
                            let x = [T::load8(at), T::load8(at.add(8))];
                            for (h, chains) in chains.iter_mut().enumerate() {
                                let w = _mm256_set1_ps(*p[h].get_unchecked(j));
                                chains[chain][0] = _mm256_fmadd_ps(w, x[0], chains[chain][0]);
                                chains[chain][1] = _mm256_fmadd_ps(w, x[1], chains[chain][1]);
                            }
                        }
                        j += 2;
                    }
                    for (h, [even, odd]) in chains.iter().enumerate() {
                        for v in 0..2 {
                            _mm256_storeu_ps(acc.add(h * K + slice + 8 * v), _mm256_add_ps(even[v], odd[v]));
                        }
                    }
                }
            }
        });
        for (row, state) in running.iter().enumerate() {
            for h in 0..H {
                let inverse = _mm256_set1_ps(1.0 / state.total[h]);
                for e in (0..K).step_by(8) {
                    let a = _mm256_loadu_ps(state.acc.as_ptr().add(h * K + e));
                    _mm256_storeu_ps(out.as_mut_ptr().add(row * row_len + h * K + e), _mm256_mul_ps(a, inverse));
                }
            }
        }
    }
}

/// The largest of 8 lanes (exact in any order, NaN aside).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn horizontal_max(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let b = _mm_max_ps(a, _mm_movehl_ps(a, a));
    _mm_cvtss_f32(_mm_max_ss(b, _mm_shuffle_ps::<1>(b, b)))
}

/// `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn horizontal_sum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    _mm_cvtss_f32(_mm_add_ss(b, _mm_shuffle_ps::<1>(b, b)))
}

/// [`exp`] of 8 lanes, the same operations lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // `!(x >= EXP_MIN)` gives 0, NaN included (an ordered comparison is false for NaN).
    let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(EXP_MIN));
    let x = _mm256_min_ps(x, _mm256_set1_ps(EXP_MAX));
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let power = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
    _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(power)), keep)
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The vector `exp` equals the scalar one bit for bit, and both are within 2 units in the
    /// last place of the true value over the softmax's range; below -87 and NaN give 0.
    #[test]
    fn the_fast_exp_is_accurate_and_the_vector_one_equal() {
        let mut inputs: Vec<f32> = (0..200_000).map(|i| -87.0 + i as f32 * (87.0 + 88.0) / 200_000.0).collect();
        inputs.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -87.0, std::f32::consts::LN_2, -std::f32::consts::LN_2]);
        for &x in &inputs {
            let got = exp(x) as f64;
            let want = (x as f64).exp();
            let ulp = (want as f32).to_bits().abs_diff((got as f32).to_bits());
            assert!(ulp <= 2, "exp({x}) = {got}, true {want}: {ulp} ulp");
        }
        assert_eq!(exp(-87.5), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(f32::NAN), 0.0);
        assert_eq!(exp(0.0), 1.0);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            inputs.extend([-87.5, -1e9, f32::NEG_INFINITY, f32::NAN, 89.0, f32::INFINITY]);
            for eight in inputs.chunks(8) {
                let mut lanes = [0f32; 8];
                lanes[..eight.len()].copy_from_slice(eight);
                let mut got = [0f32; 8];
                // SAFETY: AVX2 and FMA checked above.
                unsafe {
                    use std::arch::x86_64::*;
                    _mm256_storeu_ps(got.as_mut_ptr(), exp8(_mm256_loadu_ps(lanes.as_ptr())));
                }
                for (x, got) in lanes.iter().zip(got) {
                    assert_eq!(got.to_bits(), exp(*x).to_bits(), "exp8({x})");
                }
            }
        }
    }

    /// The specification is softmax attention: within 1e-5 of it computed in f64.
    #[test]
    fn the_reference_is_softmax_attention() {
        let head_dim = 64;
        for n in [1usize, 15, 16, 17, 100, 700] {
            let query: Vec<f32> = values(head_dim, 1).iter().map(|x| 4.0 * x).collect();
            let keys = values(n * head_dim, 2);
            let vals = values(n * head_dim, 3);
            let mut out = vec![0f32; head_dim];
            let key = |j: usize, e: usize| keys[j * head_dim + e];
            let value = |j: usize, e: usize| vals[j * head_dim + e];
            reference_head(&query, n, key, value, 0.125, &mut out);
            let scores: Vec<f64> = (0..n)
                .map(|j| (0..head_dim).map(|e| query[e] as f64 * key(j, e) as f64).sum::<f64>() * 0.125)
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (e, &got) in out.iter().enumerate() {
                let want: f64 = weights.iter().enumerate().map(|(j, w)| w * value(j, e) as f64).sum::<f64>() / total;
                assert!((got as f64 - want).abs() <= 1e-5, "n {n}, element {e}: {got} vs {want}");
            }
        }
    }

    /// The kernel gives the specification's outputs bit for bit: scattered blocks of 16 and
    /// 32 slots, partial last runs and blocks, 1 to 7 heads per kv head, f16 and f32 caches,
    /// and the prefetch callback reaches the blocks ahead.
    #[test]
    fn the_kernel_equals_the_reference() {
        let head_dim = 64;
        for block_size in [16usize, 32] {
            let per_block = head_dim * block_size;
            let pool = 24;
            let keys32 = values(pool * per_block, 5);
            let values32 = values(pool * per_block, 6);
            let keys16: Vec<f16> = keys32.iter().map(|&x| f16::from_f32(x)).collect();
            let values16: Vec<f16> = values32.iter().map(|&x| f16::from_f32(x)).collect();
            for n in [1usize, 7, 16, 17, 33, 100, 16 * 12, 16 * 12 + 5] {
                let used = n.div_ceil(block_size);
                // Blocks out of order, across the pool.
                let blocks: Vec<usize> = (0..used).map(|b| ((b * 7 + 3) % pool) * per_block).collect();
                for heads in 1..=7usize {
                    let queries: Vec<f32> = values(heads * head_dim, heads as u64).iter().map(|x| 3.0 * x).collect();
                    let check = |got: &[f32], keys: &dyn Fn(usize) -> f32, vals: &dyn Fn(usize) -> f32, what: &str| {
                        for (h, got) in got.chunks(head_dim).enumerate() {
                            let slot = |j: usize| (blocks[j / block_size], j % block_size);
                            let key = |j: usize, e: usize| {
                                let (start, s) = slot(j);
                                keys(start + e * block_size + s)
                            };
                            let value = |j: usize, e: usize| {
                                let (start, s) = slot(j);
                                vals(start + s * head_dim + e)
                            };
                            let mut want = vec![0f32; head_dim];
                            reference_head(&queries[h * head_dim..][..head_dim], n, key, value, 0.125, &mut want);
                            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(got),
                                bits(&want),
                                "{what}: block {block_size}, n {n}, head {h} of {heads}"
                            );
                        }
                    };
                    let lanes = KeyLanes::detect(block_size);
                    let asked = std::cell::RefCell::new(Vec::new());
                    let mut got = vec![f32::NAN; heads * head_dim];
                    attend(
                        lanes,
                        &queries,
                        head_dim,
                        &keys16,
                        &values16,
                        &blocks,
                        block_size,
                        &[n],
                        0.125,
                        &mut got,
                        |b| asked.borrow_mut().push(b),
                    );
                    check(&got, &|i| keys16[i].to_f32(), &|i| values16[i].to_f32(), "f16");
                    if used > PREFETCH_BLOCKS && lanes != KeyLanes::Scalar {
                        assert!(asked.borrow().contains(&PREFETCH_BLOCKS), "block {block_size}, n {n}");
                    }
                    let mut got = vec![f32::NAN; heads * head_dim];
                    attend(
                        lanes,
                        &queries,
                        head_dim,
                        &keys32,
                        &values32,
                        &blocks,
                        block_size,
                        &[n],
                        0.125,
                        &mut got,
                        |_| {},
                    );
                    check(&got, &|i| keys32[i], &|i| values32[i], "f32");
                }
            }
        }
    }

    /// `run(out, queries, row)`: [`attend`] of every row (`row` `usize::MAX`) or of that one.
    type AttendRows<'a> = dyn Fn(&mut [f32], &[f32], usize) + 'a;

    /// Rows of one sequence attended together (a chunk: the rows see non-decreasing key
    /// counts, equal ones too) each get the numbers of that row attended alone, bit for bit,
    /// for 1 to 7 heads, f16 and f32, with the reference where the vector kernel cannot run.
    #[test]
    fn rows_attended_together_equal_each_row_alone() {
        let head_dim = 64;
        let block_size = 16;
        let per_block = head_dim * block_size;
        let pool = 20;
        let keys16: Vec<f16> = values(pool * per_block, 8).iter().map(|&x| f16::from_f32(x)).collect();
        let values16: Vec<f16> = values(pool * per_block, 9).iter().map(|&x| f16::from_f32(x)).collect();
        let keys32 = values(pool * per_block, 10);
        let values32 = values(pool * per_block, 11);
        let blocks: Vec<usize> = (0..pool).map(|b| ((b * 3 + 5) % pool) * per_block).collect();
        let spans: [&[usize]; 5] = [
            &[1, 2, 3],
            &[15, 16, 17, 18],
            &[40, 40, 41, 60],
            &[100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115],
            &[7, 250, 320],
        ];
        for lanes in [KeyLanes::detect(block_size), KeyLanes::Scalar] {
            for heads in 1..=7usize {
                for seen in spans {
                    let row_len = heads * head_dim;
                    let queries: Vec<f32> =
                        values(seen.len() * row_len, 20 + heads as u64).iter().map(|x| 3.0 * x).collect();
                    let check = |run: &AttendRows, what: &str| {
                        let mut together = vec![f32::NAN; queries.len()];
                        run(&mut together, &queries, usize::MAX);
                        for (r, &n) in seen.iter().enumerate() {
                            let mut alone = vec![f32::NAN; row_len];
                            run(&mut alone, &queries[r * row_len..][..row_len], r);
                            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                            assert_eq!(
                                bits(&together[r * row_len..][..row_len]),
                                bits(&alone),
                                "{what} {lanes:?}: {heads} heads, rows {seen:?}, row {r} (n {n})"
                            );
                        }
                    };
                    // `row` usize::MAX: every row together; otherwise that row alone.
                    let seen_of = |row: usize| if row == usize::MAX { seen.to_vec() } else { vec![seen[row]] };
                    check(
                        &|out, q, row| {
                            attend(
                                lanes,
                                q,
                                head_dim,
                                &keys16,
                                &values16,
                                &blocks,
                                block_size,
                                &seen_of(row),
                                0.125,
                                out,
                                |_| {},
                            )
                        },
                        "f16",
                    );
                    check(
                        &|out, q, row| {
                            attend(
                                lanes,
                                q,
                                head_dim,
                                &keys32,
                                &values32,
                                &blocks,
                                block_size,
                                &seen_of(row),
                                0.125,
                                out,
                                |_| {},
                            )
                        },
                        "f32",
                    );
                }
            }
        }
    }
}
