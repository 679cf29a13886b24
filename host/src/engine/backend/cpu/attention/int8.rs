//! Attention over an 8-bit KV cache: keys and values as signed bytes with one f32 scale per
//! 32 elements of a (slot, kv head), the blocks of llama.cpp's `q8_0` cache type
//! (`--cache-type-k q8_0 --cache-type-v q8_0`) with f32 scales, what vLLM users reach for with
//! `--kv-cache-dtype fp8`.
//!
//! Why: half the bytes of a bf16 cache (1 + 1/8 bytes per element against 2), so twice the
//! sequences or the context in the same memory, and half the memory traffic where attention
//! waits on it: 16 sequences at 480 positions read 177 MB of bf16 keys and values per step on
//! SmolLM2, more than the last-level cache keeps beside the weights (`dspark engine-bench`).
//! The price is the rounding: 8 bits against the scale of each 32 elements, where bf16 keeps 8
//! significant bits of every element. It is opt-in (`kv_cache_dtype: int8`); the engine tests
//! hold it to the reference model's greedy tokens the way they hold the 2-byte types.
//!
//! Layout per (block, kv head) of `block_size` slots and `head_dim` elements (a multiple of
//! 32):
//! - keys element-major: element `e` of slot `j` at `e * block_size + j`, so 16 consecutive
//!   slots of one element are 16 bytes, one vector of 16 lanes once widened;
//! - values slot-major: element `e` of slot `j` at `j * head_dim + e`;
//! - scales, one array for the keys and one for the values: part `p` (elements `32p ..
//!   32p + 32`) of slot `j` at `p * block_size + j` from the (block, kv head)'s start divided
//!   by 32, so 16 consecutive slots' scales of one part are one vector.
//!
//! Writing rounds each part as Q8_0 rounds a block ([`super::super::matmul::quantize_q8`]): `d =
//! amax / 127`, `q = round(x / d)`, half away from zero. Numerics, a fixed function of the row
//! (the same whatever batch, chunk or step the row comes in); the vector kernel computes
//! exactly [`reference_head`], written here for head size 64 (parts 0 and 1):
//!
//! ```text
//! m = -inf, l = 0, acc = 0
//! for each run of keys 16r .. 16r + t (t <= 16):
//!     s_j   = (((c0 + c1) * dk0_j) + ((c2 + c3) * dk1_j)) * scale, from c_i = 0 and for e in
//!             16i .. 16i + 16 in order: c_i = fma(q_e, k_j[e], c_i)        (s_j = -inf past t)
//!     alpha = exp(m - max_j s_j) and m = max_j s_j   if that max exceeds m, else alpha = 1
//!     w_j   = exp(s_j - m)                                                  (0 past t)
//!     l     = l * alpha + (((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))), v_i = w_i + w_(i+8)
//!     acc_e = acc_e * alpha, then for j < t in order: acc_e = fma(w_j * dv_(e/32),j, v_j[e], acc_e)
//! out_e = acc_e * (1 / l)
//! ```
//!
//! `k_j[e]` and `v_j[e]` are the stored integers as f32. `exp` is
//! [`super::f16::exp`]. The query stays f32. CPUs without AVX-512 run
//! [`reference_head`] per row and head: correct and slower.

#[cfg(target_arch = "x86_64")]
use super::bf16::{Running, rescaled_sums, softmax_step, store_sums, write_rows};
#[cfg(target_arch = "x86_64")]
use super::f16::for_each_run;
use super::f16::{self, AttendShape};

/// Keys per step of the online softmax: one 16-lane vector of scores.
pub const RUN: usize = 16;

/// Elements per scale.
pub const PART: usize = 32;

/// Where element `e` of slot `slot` of a (block, kv head)'s keys is, from its start.
pub fn key_index(e: usize, slot: usize, block_size: usize) -> usize {
    e * block_size + slot
}

/// Where element `e` of slot `slot` of a (block, kv head)'s values is, from its start.
pub fn value_index(e: usize, slot: usize, head_dim: usize) -> usize {
    slot * head_dim + e
}

/// Where the scale of part `part` of slot `slot` is, from the (block, kv head)'s start in the
/// keys or values divided by [`PART`].
pub fn scale_index(part: usize, slot: usize, block_size: usize) -> usize {
    part * block_size + slot
}

/// The specification of one head's output ([module docs](self)): `n` keys, `key(j, e)` and
/// `value(j, e)` element `e` of key and value `j`, `key_scale(j, p)` and `value_scale(j, p)`
/// the scale of their part `p`; `out` of the query's length (a multiple of 32). The loop of
/// [`attend`] where its vector kernel cannot run, and what that kernel is tested against.
#[allow(clippy::too_many_arguments)] // the keys, the values and their scales
pub fn reference_head(
    query: &[f32],
    n: usize,
    key: impl Fn(usize, usize) -> i8,
    key_scale: impl Fn(usize, usize) -> f32,
    value: impl Fn(usize, usize) -> i8,
    value_scale: impl Fn(usize, usize) -> f32,
    scale: f32,
    out: &mut [f32],
) {
    let parts = query.len() / PART;
    let (mut max, mut total) = (f32::NEG_INFINITY, 0f32);
    out.fill(0.0);
    let mut scores = [0f32; RUN];
    for first in (0..n).step_by(RUN) {
        let take = RUN.min(n - first);
        for (j, score) in scores.iter_mut().enumerate() {
            *score = if j < take {
                // Chains of 16 elements, two per part; each part's pair of chains scaled by
                // the part's scale, the parts summed in order.
                let mut sum = 0f32;
                for p in 0..parts {
                    let mut chains = [0f32; 2];
                    for (c, chain) in chains.iter_mut().enumerate() {
                        let from = PART * p + 16 * c;
                        for (e, &q) in query.iter().enumerate().skip(from).take(16) {
                            *chain = q.mul_add(key(first + j, e) as f32, *chain);
                        }
                    }
                    let part = (chains[0] + chains[1]) * key_scale(first + j, p);
                    sum = if p == 0 { part } else { sum + part };
                }
                sum * scale
            } else {
                f32::NEG_INFINITY
            };
        }
        let (w, alpha) = f16::softmax_step(&scores, &mut max, &mut total, |w| w);
        for (e, out) in out.iter_mut().enumerate() {
            let mut acc = *out * alpha;
            for (j, &weight) in w.iter().enumerate().take(take) {
                acc = (weight * value_scale(first + j, e / PART)).mul_add(value(first + j, e) as f32, acc);
            }
            *out = acc;
        }
    }
    let inverse = 1.0 / total;
    for out in out.iter_mut() {
        *out *= inverse;
    }
}

/// Whether [`attend`] runs its vector kernel here (AVX-512 F with FMA) for head size 64.
pub fn accelerated() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        has!("avx512f") && has!("avx2") && has!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`super::bf16::attend`] over an 8-bit cache in this module's layout, with its
/// scales (`key_scales`, `value_scales`: one per 32 elements of `keys` and `values`) and
/// [`reference_head`]'s numbers. The vector kernel needs AVX-512 F ([`accelerated`]) instead
/// of BF16. Panics as that function does, and where `head_dim` is not a multiple of 32 or
/// the scales are not one per 32 elements.
#[allow(clippy::too_many_arguments)]
pub fn attend(
    queries: &[f32],
    head_dim: usize,
    keys: &[i8],
    values: &[i8],
    key_scales: &[f32],
    value_scales: &[f32],
    blocks: &[usize],
    block_size: usize,
    seen: &[usize],
    scale: f32,
    out: &mut [f32],
    ahead: impl Fn(usize),
) {
    assert!(head_dim.is_multiple_of(PART) && block_size > 0);
    assert!(key_scales.len() == keys.len() / PART && value_scales.len() == values.len() / PART);
    let AttendShape { heads, row_len, used } =
        AttendShape::check(queries.len(), out.len(), head_dim, keys.len().min(values.len()), blocks, block_size, seen);
    let blocks = &blocks[..used];
    #[cfg(target_arch = "x86_64")]
    if head_dim == 64 && block_size.is_multiple_of(RUN) && accelerated() {
        let mut running = Vec::new();
        let cache = Cache { keys, values, key_scales, value_scales };
        for first_head in (0..heads).step_by(3) {
            let kernel: Kernel = match (heads - first_head).min(3) {
                1 => heads_avx512::<1>,
                2 => heads_avx512::<2>,
                _ => heads_avx512::<3>,
            };
            let at = first_head * head_dim;
            // SAFETY: AVX-512 F and FMA checked by `accelerated`; every used block's keys,
            // values and scales are inside the cache (asserted above: a block's scales are
            // its elements' range divided by 32); the block size is a multiple of 16; rows of
            // `row_len` elements hold the group's heads from `at` on.
            unsafe {
                kernel(
                    &queries[at..],
                    &mut out[at..],
                    row_len,
                    seen,
                    &cache,
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
    let key_scale = |j: usize, p: usize| {
        let (start, s) = slot(j);
        key_scales[start / PART + scale_index(p, s, block_size)]
    };
    let value_scale = |j: usize, p: usize| {
        let (start, s) = slot(j);
        value_scales[start / PART + scale_index(p, s, block_size)]
    };
    let rows = queries.chunks(row_len).zip(out.chunks_mut(row_len)).zip(seen);
    for ((queries, out), &n) in rows {
        for (query, out) in queries.chunks(head_dim).zip(out.chunks_mut(head_dim)) {
            reference_head(query, n, key, key_scale, value, value_scale, scale, out);
        }
    }
}

/// One layer's 8-bit keys and values and their scales.
#[cfg(target_arch = "x86_64")]
struct Cache<'a> {
    keys: &'a [i8],
    values: &'a [i8],
    key_scales: &'a [f32],
    value_scales: &'a [f32],
}

/// [`heads_avx512`] for one head count.
#[cfg(target_arch = "x86_64")]
type Kernel =
    unsafe fn(&[f32], &mut [f32], usize, &[usize], &Cache, &[usize], usize, f32, &dyn Fn(usize), &mut Vec<Running>);

/// [`attend`]'s kernel for `H` heads of 64 in each of `seen.len()` rows (row `r`'s queries at
/// `r * row_len` in `queries`, its outputs there in `out`). Per run of 16 keys, the run's
/// bytes are widened to f32 (a sign extension and a conversion per 16): once into 8 KB of
/// scratch in L1 where several rows use them, in registers as used where one row does. Then
/// per row ([`run_step`]): the scores of every head in four chains of one vector each, the
/// softmax step in registers, and the weighted sum with each weight scaled by its value's
/// scales. A run's keys and values are read from the cache once for all the rows.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2 and FMA; `block_size` is a multiple of 16; every start in
/// `blocks` begins `64 * block_size` readable keys and values, and their scales at a 32nd of
/// it; `seen` is non-empty and non-decreasing, its last at most `blocks.len() * block_size`;
/// `queries` and `out` hold `(seen.len() - 1) * row_len + 64 H` elements.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn heads_avx512<const H: usize>(
    queries: &[f32],
    out: &mut [f32],
    row_len: usize,
    seen: &[usize],
    cache: &Cache,
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
    // The run's keys element-major (element `e` of the 16 keys in one vector) and values
    // slot-major (16 elements of one key per vector), as f32.
    let mut run_keys = [_mm512_setzero_ps(); K];
    let mut run_values = [[_mm512_setzero_ps(); K / 16]; RUN];
    // SAFETY: the caller's promise for the features, the cache and the sizes; `acc` and
    // `query` hold 64 elements per head.
    unsafe {
        for (row, state) in running.iter_mut().enumerate() {
            state.query[..H * K].copy_from_slice(&queries[row * row_len..][..H * K]);
        }
        for_each_run(blocks, block_size, seen, ahead, |start, first, done, run_len, first_row| {
            let key_base = cache.keys.as_ptr().add(start + first);
            let value_base = cache.values.as_ptr().add(start + first * K);
            let widen = |bytes: *const i8| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(bytes.cast())));
            let key = |e: usize| widen(key_base.add(key_index(e, 0, block_size)));
            let value = |j: usize, v: usize| widen(value_base.add(value_index(16 * v, j, K)));
            let scales = |all: &[f32]| {
                let at = all.as_ptr().add(start / PART + first);
                [_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(scale_index(1, 0, block_size)))]
            };
            let (key_scales, value_scales) = (scales(cache.key_scales), scales(cache.value_scales));
            let active = &mut running[first_row..];
            if let [state] = active {
                // One row: widened in registers as used.
                let take = RUN.min(seen[rows - 1] - done);
                run_step::<H>(state, take, scale, key, key_scales, value, value_scales);
            } else {
                // Several rows: widened once into L1 for all of them.
                for (e, k) in run_keys.iter_mut().enumerate() {
                    *k = key(e);
                }
                for (j, vectors) in run_values.iter_mut().enumerate().take(run_len) {
                    for (v, vector) in vectors.iter_mut().enumerate() {
                        *vector = value(j, v);
                    }
                }
                for (offset, state) in active.iter_mut().enumerate() {
                    let take = RUN.min(seen[first_row + offset] - done);
                    let (keys, values) = (&run_keys, &run_values);
                    run_step::<H>(state, take, scale, |e| keys[e], key_scales, |j, v| values[j][v], value_scales);
                }
            }
        });
        write_rows::<H>(running, out, row_len);
    }
}

/// One row's step of [`heads_avx512`] over a run of 16 keys of which it sees `take`: `key(e)`
/// gives element `e` of the run's 16 keys (a lane per key), `value(j, v)` elements 16v ..
/// 16v + 16 of key `j`'s value; `key_scales[p]` and `value_scales[p]` the 16 keys' scales of
/// part `p`.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2 and FMA; `H <= 3`; `0 < take <= 16`; the closures read only
/// what exists for `e < 64`, `j < take`, `v < 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
#[inline]
unsafe fn run_step<const H: usize>(
    state: &mut Running,
    take: usize,
    scale: std::arch::x86_64::__m512,
    key: impl Fn(usize) -> std::arch::x86_64::__m512,
    key_scales: [std::arch::x86_64::__m512; 2],
    value: impl Fn(usize, usize) -> std::arch::x86_64::__m512,
    value_scales: [std::arch::x86_64::__m512; 2],
) {
    use std::arch::x86_64::*;
    const K: usize = 64;
    // SAFETY: `query` and `acc` hold 64 elements per head, `w` 16 weights per head and part;
    // the closures' reads are the caller's promise.
    unsafe {
        // Chain c takes elements 16c .. 16c + 16 in order; the chains advance together.
        let mut dots = [[_mm512_setzero_ps(); 4]; H];
        for i in 0..16 {
            for chain in 0..4 {
                let e = 16 * chain + i;
                let k = key(e);
                for (h, dots) in dots.iter_mut().enumerate() {
                    dots[chain] = _mm512_fmadd_ps(_mm512_set1_ps(state.query[h * K + e]), k, dots[chain]);
                }
            }
        }
        // The softmax step: keys past `take` score -inf, so weigh 0.
        let keep: __mmask16 = if take == RUN { 0xFFFF } else { (1u16 << take) - 1 };
        let mut w = [[[0f32; RUN]; 2]; H];
        let mut alpha = [1f32; H];
        for h in 0..H {
            let [c0, c1, c2, c3] = dots[h];
            let low = _mm512_mul_ps(_mm512_add_ps(c0, c1), key_scales[0]);
            let high = _mm512_mul_ps(_mm512_add_ps(c2, c3), key_scales[1]);
            let s = _mm512_mul_ps(_mm512_add_ps(low, high), scale);
            let s = _mm512_mask_mov_ps(_mm512_set1_ps(f32::NEG_INFINITY), keep, s);
            let weights;
            (weights, alpha[h]) = softmax_step(s, &mut state.max[h], &mut state.total[h], |w| w);
            for (part, w) in w[h].iter_mut().enumerate() {
                _mm512_storeu_ps(w.as_mut_ptr(), _mm512_mul_ps(weights, value_scales[part]));
            }
        }
        // The weighted sum: all 64 elements of every head, key by key.
        let mut sums = rescaled_sums::<H>(state, &alpha);
        #[allow(clippy::needless_range_loop)] // `j` indexes the keys of `value` and of `w`
        for j in 0..take {
            let values: [__m512; 4] = std::array::from_fn(|v| value(j, v));
            for (h, sums) in sums.iter_mut().enumerate() {
                for (v, (sum, value)) in sums.iter_mut().zip(values).enumerate() {
                    *sum = _mm512_fmadd_ps(_mm512_set1_ps(w[h][v / 2][j]), value, *sum);
                }
            }
        }
        store_sums::<H>(state, &sums);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic bytes, scales and queries.
    fn cache(seed: u32, elements: usize) -> (Vec<i8>, Vec<i8>, Vec<f32>, Vec<f32>) {
        let bytes =
            |s: u32| crate::engine::backend::test_values(elements, s).iter().map(|v| (v * 127.0) as i8).collect();
        let scales = |s: u32| {
            crate::engine::backend::test_values(elements / PART, s).iter().map(|v| 0.002 + 0.01 * v.abs()).collect()
        };
        (bytes(seed), bytes(seed + 1), scales(seed + 2), scales(seed + 3))
    }

    #[test]
    fn the_kernel_equals_the_reference_and_rows_together_equal_each_alone() {
        let (head_dim, block_size, kv_heads) = (64, 16, 2);
        let blocks_total = 12;
        let elements = blocks_total * kv_heads * head_dim * block_size;
        let (keys, values, key_scales, value_scales) = cache(7, elements);
        // Blocks out of order, as a block table gives them; the kv head 1 of each.
        let table = [5usize, 0, 9, 3, 11, 7, 1];
        let starts: Vec<usize> = table.iter().map(|b| (b * kv_heads + 1) * head_dim * block_size).collect();
        for heads in [1usize, 2, 3, 5] {
            // Rows seeing 1 to 100 keys, several ending inside a run, one row alone.
            for seen in [vec![1usize], vec![17], vec![100], vec![30, 31, 32, 33], vec![5, 40, 40, 97]] {
                let rows = seen.len();
                let queries = crate::engine::backend::test_values(rows * heads * head_dim, heads as u32 + rows as u32);
                let mut got = vec![0f32; queries.len()];
                attend(
                    &queries,
                    head_dim,
                    &keys,
                    &values,
                    &key_scales,
                    &value_scales,
                    &starts,
                    block_size,
                    &seen,
                    0.125,
                    &mut got,
                    |_| {},
                );
                for (r, &n) in seen.iter().enumerate() {
                    for h in 0..heads {
                        let at = (r * heads + h) * head_dim;
                        let slot = |j: usize| (starts[j / block_size], j % block_size);
                        let mut want = vec![0f32; head_dim];
                        reference_head(
                            &queries[at..at + head_dim],
                            n,
                            |j, e| keys[slot(j).0 + key_index(e, slot(j).1, block_size)],
                            |j, p| key_scales[slot(j).0 / PART + scale_index(p, slot(j).1, block_size)],
                            |j, e| values[slot(j).0 + value_index(e, slot(j).1, head_dim)],
                            |j, p| value_scales[slot(j).0 / PART + scale_index(p, slot(j).1, block_size)],
                            0.125,
                            &mut want,
                        );
                        let same = want.iter().zip(&got[at..at + head_dim]).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{heads} heads, seen {seen:?}, row {r} head {h}: {:?} vs {:?}",
                            &want[..4],
                            &got[at..at + 4]
                        );
                        // The same row alone.
                        let mut alone = vec![0f32; heads * head_dim];
                        let row = &queries[r * heads * head_dim..][..heads * head_dim];
                        attend(
                            row,
                            head_dim,
                            &keys,
                            &values,
                            &key_scales,
                            &value_scales,
                            &starts,
                            block_size,
                            &[n],
                            0.125,
                            &mut alone,
                            |_| {},
                        );
                        assert_eq!(alone[h * head_dim..][..head_dim], got[at..at + head_dim], "row {r} alone");
                    }
                }
            }
        }
    }

    #[test]
    fn the_reference_is_softmax_attention_over_the_dequantised_cache() {
        // One head, 40 keys of 64 elements in one block of 64 slots.
        let (head_dim, block_size, n) = (64, 64, 40);
        let (keys, values, key_scales, value_scales) = cache(3, head_dim * block_size);
        let query = crate::engine::backend::test_values(head_dim, 9);
        let key = |j: usize, e: usize| {
            keys[key_index(e, j, block_size)] as f64 * key_scales[scale_index(e / PART, j, block_size)] as f64
        };
        let value = |j: usize, e: usize| {
            values[value_index(e, j, head_dim)] as f64 * value_scales[scale_index(e / PART, j, block_size)] as f64
        };
        let scores: Vec<f64> =
            (0..n).map(|j| (0..head_dim).map(|e| query[e] as f64 * key(j, e)).sum::<f64>() * 0.125).collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        let mut got = vec![0f32; head_dim];
        reference_head(
            &query,
            n,
            |j, e| keys[key_index(e, j, block_size)],
            |j, p| key_scales[scale_index(p, j, block_size)],
            |j, e| values[value_index(e, j, head_dim)],
            |j, p| value_scales[scale_index(p, j, block_size)],
            0.125,
            &mut got,
        );
        for (e, &g) in got.iter().enumerate() {
            let want = (0..n).map(|j| weights[j] * value(j, e)).sum::<f64>() / total;
            assert!((g as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()), "element {e}: {g} vs {want}");
        }
    }
}
