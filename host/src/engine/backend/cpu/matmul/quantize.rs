//! Activations quantised as candle quantises them: Q8_1 for the Q4_1 kernels ([`Q8_1Rows`]),
//! Q8_0 for the Q8_0 and Q5_0 ones ([`Q8_0Rows`]), block by block with AVX-512 or AVX2, rows in
//! parallel from four rows on.

use half::f16;

use super::tiles::*;

/// Activations quantised to Q8_1, exactly as candle's `BlockQ8_1::from_float`.
pub(super) struct Q8_1Rows {
    pub(super) blocks: usize,
    /// The quantised values as little-endian 4-byte words (8 per block), the broadcast unit.
    pub(super) words: Vec<i32>,
    pub(super) d: Vec<f32>,
    pub(super) s: Vec<f32>,
}

/// Activations quantised to Q8_0 (candle's `BlockQ8_0::from_float`), with `128 x` the sum of
/// every 4 consecutive values (the offset correction).
pub(super) struct Q8_0Rows {
    pub(super) blocks: usize,
    /// The quantised values as little-endian 4-byte words (8 per block).
    pub(super) words: Vec<i32>,
    pub(super) d: Vec<f32>,
    pub(super) offset: Vec<i32>,
    /// The sum of each block's values (Q5_0's offset correction).
    pub(super) sums: Vec<i32>,
}

impl Q8_0Rows {
    /// Quantises `rows x k` values as candle's `quantize_row_q8_0`: `d = amax / 127` (kept as
    /// f16), `q = round(x / d)`. With [`quantize_row`] (Q8_1's quantiser: the same `q`; a
    /// scalar loop here was 9% of a Qwen2.5 `engine-bench` run) and [`word_sums`], rows in
    /// parallel from 4 rows on.
    pub(super) fn quantize(isa: Isa, x: &[f32], rows: usize, k: usize) -> Self {
        let blocks = k / BLOCK;
        let mut out = Self {
            blocks,
            words: vec![0i32; rows * k / 4],
            d: vec![0f32; rows * blocks],
            offset: vec![0i32; rows * blocks * 8],
            sums: vec![0i32; rows * blocks],
        };
        if k == 0 || blocks == 0 {
            return out;
        }
        let quantize_row = |(((x, words), d), (offset, sums)): Q8_0RowParts| {
            // The block maxima go to `d` first, then become the f16 scales in place.
            quantize_row(isa, x, words, d, sums);
            for amax in d.iter_mut() {
                *amax = f16::from_f32(*amax / 127.0).to_f32();
            }
            word_sums(isa, words, offset);
            for offset in offset.iter_mut() {
                *offset *= 128;
            }
        };
        let x = &x[..rows * k];
        if rows >= 4 {
            let inputs = x.chunks_exact(k).zip(out.words.chunks_exact_mut(k / 4)).zip(out.d.chunks_exact_mut(blocks));
            let sums = out.offset.chunks_exact_mut(blocks * 8).zip(out.sums.chunks_exact_mut(blocks));
            let mut parts: Vec<Option<Q8_0RowParts>> = inputs.zip(sums).map(Some).collect();
            super::super::threads::for_each_mut(&mut parts, |_, part| part.take().into_iter().for_each(quantize_row));
        } else {
            let inputs = x.chunks_exact(k).zip(out.words.chunks_exact_mut(k / 4)).zip(out.d.chunks_exact_mut(blocks));
            let sums = out.offset.chunks_exact_mut(blocks * 8).zip(out.sums.chunks_exact_mut(blocks));
            inputs.zip(sums).for_each(quantize_row);
        }
        out
    }
}

/// One row's input values, and its words, scales, offsets and sums to write
/// ([`Q8_0Rows::quantize`]).
pub(super) type Q8_0RowParts<'a> = (((&'a [f32], &'a mut [i32]), &'a mut [f32]), (&'a mut [i32], &'a mut [i32]));

/// One row's input values and its quantised words, scales and sums, as [`Q8_1Rows::quantize`]
/// hands them out.
pub(super) type RowParts<'a> = ((&'a [f32], &'a mut [i32]), (&'a mut [f32], &'a mut [f32]));

impl Q8_1Rows {
    /// Quantises `rows x k` values block by block, as candle's `quantize_row_q8_1` does:
    /// `d = amax / 127`, `q = round(x / d)`, `s = f16(sum q) * f16(d)` rounded to f16.
    pub(super) fn quantize(isa: Isa, x: &[f32], rows: usize, k: usize) -> Self {
        let blocks = k / BLOCK;
        let mut out = Self {
            blocks,
            words: vec![0i32; rows * k / 4],
            d: vec![0f32; rows * blocks],
            s: vec![0f32; rows * blocks],
        };
        let quantize_row = |((x, words), (d, s)): RowParts| {
            // The block maxima go to `d` and the sums of the quantised values to `s` first,
            // then become the f16 scale and the scaled sum in place.
            let mut sums = [0i32; SUM_RUN];
            let runs = x.chunks(SUM_RUN * BLOCK).zip(words.chunks_mut(SUM_RUN * 8));
            for (((x, words), d), s) in runs.zip(d.chunks_mut(SUM_RUN)).zip(s.chunks_mut(SUM_RUN)) {
                let sums = &mut sums[..d.len()];
                quantize_row(isa, x, words, d, sums);
                for ((d, s), &sum) in d.iter_mut().zip(s.iter_mut()).zip(sums.iter()) {
                    let dh = f16::from_f32(*d / 127.0);
                    *d = dh.to_f32();
                    *s = (f16::from_f32(sum as f32) * dh).to_f32();
                }
            }
        };
        if k == 0 || blocks == 0 {
            return out;
        }
        // Rows are independent; a batch's rows are quantised in parallel (the same values).
        if rows >= 4 {
            let inputs = x.chunks_exact(k).zip(out.words.chunks_exact_mut(k / 4));
            let scales = out.d.chunks_exact_mut(blocks).zip(out.s.chunks_exact_mut(blocks));
            let mut parts: Vec<Option<RowParts>> = inputs.zip(scales).map(Some).collect();
            super::super::threads::for_each_mut(&mut parts, |_, part| part.take().into_iter().for_each(quantize_row));
        } else {
            let inputs = x.chunks_exact(k).zip(out.words.chunks_exact_mut(k / 4));
            let scales = out.d.chunks_exact_mut(blocks).zip(out.s.chunks_exact_mut(blocks));
            inputs.zip(scales).for_each(quantize_row);
        }
        out
    }
}

/// Blocks per run of [`Q8_1Rows::quantize`]: the sums of a run's quantised values wait on
/// the stack until they become the blocks' scaled sums.
pub(super) const SUM_RUN: usize = 64;

/// [`quantize_block`] for every block of a row `x`: the quantised values to `words` (8 per
/// block), each block's amax to `amax` and the sum of its quantised values to `sums`.
pub(super) fn quantize_row(isa: Isa, x: &[f32], words: &mut [i32], amax: &mut [f32], sums: &mut [i32]) {
    let blocks = x.len() / BLOCK;
    assert!(words.len() == 8 * blocks && amax.len() == blocks && sums.len() == blocks);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.available() {
        // SAFETY: the instructions were checked, the lengths asserted.
        return unsafe { quantize_row_avx512(&x[..blocks * BLOCK], words, amax, sums) };
    }
    for (i, block) in x.chunks_exact(BLOCK).enumerate() {
        (amax[i], sums[i]) = quantize_block(isa, block, &mut words[i * 8..][..8]);
    }
}

/// Quantises `x` (whole blocks of 32 values) as Q8_0 and Q8_1 round their blocks, to one
/// signed byte per value (as little-endian 4-byte words, 8 per block) and one f32 scale per
/// block: `d = amax / 127`, `q = round(x / d)` half away from zero. What the 8-bit KV cache
/// stores ([`super::super::attention::int8`]); `sums` is scratch of one per block.
pub fn quantize_q8(x: &[f32], words: &mut [i32], scales: &mut [f32], sums: &mut [i32]) {
    match Isa::detect() {
        Some(isa) => quantize_row(isa, x, words, scales, sums),
        None => {
            for (i, block) in x.chunks_exact(BLOCK).enumerate() {
                (scales[i], sums[i]) = quantize_block_scalar(block, &mut words[i * 8..][..8]);
            }
        }
    }
    for scale in scales.iter_mut() {
        *scale /= 127.0;
    }
}

/// The sum of the 4 signed bytes of each word of `words`, into `sums`.
pub(super) fn word_sums(isa: Isa, words: &[i32], sums: &mut [i32]) {
    assert_eq!(words.len(), sums.len());
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512Vnni && isa.available() {
        // SAFETY: the instructions were checked, the lengths asserted.
        return unsafe { word_sums_avx512(words, sums) };
    }
    for (sum, word) in sums.iter_mut().zip(words) {
        *sum = word.to_le_bytes().iter().map(|&b| b as i8 as i32).sum();
    }
}

/// [`word_sums`] with `vpdpbusd` against bytes of 1, 16 words at a time.
///
/// # Safety
/// The CPU has AVX-512 F and VNNI; `sums` is as long as `words`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn word_sums_avx512(words: &[i32], sums: &mut [i32]) {
    use std::arch::x86_64::*;
    let ones = _mm512_set1_epi8(1);
    for first in (0..words.len()).step_by(16) {
        let keep: __mmask16 = if words.len() - first >= 16 { 0xFFFF } else { (1u16 << (words.len() - first)) - 1 };
        // SAFETY: the masked lanes are words first..first + 16 that exist in both slices.
        unsafe {
            let w = _mm512_maskz_loadu_epi32(keep, words.as_ptr().add(first));
            let total = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, w);
            _mm512_mask_storeu_epi32(sums.as_mut_ptr().add(first), keep, total);
        }
    }
}

/// [`quantize_row`] with AVX-512, 16 blocks at a time: each block's amax and sum are reduced
/// across blocks (a transposition tree, [`lane_totals`]) instead of one block's vector at a
/// time, and the scales of 16 blocks are divided in one vector. Bit for bit
/// [`quantize_block_scalar`]: the maximum and the integer sum do not depend on the order,
/// IEEE division rounds the same in a vector, and rounding half away from zero is truncation
/// plus one step away from zero where the (exact) remainder is at least one half.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `x` holds whole blocks, `words` 8 per block, `amax`
/// and `sums` one per block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn quantize_row_avx512(x: &[f32], words: &mut [i32], amax: &mut [f32], sums: &mut [i32]) {
    use std::arch::x86_64::*;
    let blocks = x.len() / BLOCK;
    let (half, one, magnitude) = (_mm512_set1_ps(0.5), _mm512_set1_epi32(1), _mm512_set1_epi32(0x7FFF_FFFF));
    let abs = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), magnitude));
    for first in (0..blocks).step_by(16) {
        let n = (blocks - first).min(16);
        let keep: __mmask16 = if n == 16 { 0xFFFF } else { (1u16 << n) - 1 };
        // SAFETY: blocks first..first + n exist in `x`, `words`, `amax` and `sums`.
        unsafe {
            let values = x.as_ptr().add(first * BLOCK);
            let load = |i: usize, half: usize| _mm512_loadu_ps(values.add(i * BLOCK + 16 * half));
            let mut maxima = [_mm512_setzero_ps(); 16];
            for (i, m) in maxima.iter_mut().enumerate().take(n) {
                *m = _mm512_max_ps(abs(load(i, 0)), abs(load(i, 1)));
            }
            let block_max = lane_totals(maxima, |a, b| _mm512_max_ps(a, b));
            _mm512_mask_storeu_ps(amax.as_mut_ptr().add(first), keep, block_max);
            let scale = _mm512_div_ps(block_max, _mm512_set1_ps(127.0));
            // `if scale != 0.0 { 1.0 / scale } else { 0.0 }`, NaN counting as not zero.
            let nonzero = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(scale, _mm512_setzero_ps());
            let mut inverses = [0f32; 16];
            _mm512_storeu_ps(inverses.as_mut_ptr(), _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(1.0), scale));
            let mut totals = [_mm512_setzero_ps(); 16];
            let bytes = words.as_mut_ptr().add(first * 8).cast::<u8>();
            for (i, total) in totals.iter_mut().enumerate().take(n) {
                let inverse = _mm512_set1_ps(inverses[i]);
                let round = |v: __m512| {
                    let x = _mm512_mul_ps(v, inverse);
                    let q = _mm512_cvttps_epi32(x);
                    let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(abs(_mm512_sub_ps(x, _mm512_cvtepi32_ps(q))), half);
                    // One step away from zero: +1, or -1 where x's sign bit is set.
                    let step = _mm512_or_si512(one, _mm512_srai_epi32::<31>(_mm512_castps_si512(x)));
                    _mm512_mask_add_epi32(q, away, q, step)
                };
                let (qa, qb) = (round(load(i, 0)), round(load(i, 1)));
                _mm_storeu_si128(bytes.add(i * BLOCK).cast(), _mm512_cvtepi32_epi8(qa));
                _mm_storeu_si128(bytes.add(i * BLOCK + 16).cast(), _mm512_cvtepi32_epi8(qb));
                *total = _mm512_castsi512_ps(_mm512_add_epi32(qa, qb));
            }
            let block_sums = lane_totals(totals, |a, b| {
                _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))
            });
            _mm512_mask_storeu_epi32(sums.as_mut_ptr().add(first), keep, _mm512_castps_si512(block_sums));
        }
    }
}

/// Lane `i` of the result: `op` over the 16 lanes of `v[i]` (an associative and commutative
/// `op`, as its order is a tree). Four levels of shuffles halve the partial results per
/// vector while doubling the vectors per register: 15 operations and 30 shuffles for 16
/// vectors, where one vector's own reduction takes 4 and 4.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn lane_totals(
    v: [std::arch::x86_64::__m512; 16],
    op: impl Fn(std::arch::x86_64::__m512, std::arch::x86_64::__m512) -> std::arch::x86_64::__m512,
) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // 128-bit quarters: `w[k]` holds 4 partials of each of v[2k] (quarters 0, 1) and v[2k + 1]
    // (2, 3); `x[k]` quarter j 4 partials of v[4k + j]; `y[k]` quarter j 2 partials of
    // v[8k + j], then 2 of v[8k + 4 + j]; `z` quarter j one total each of v[j], v[4 + j],
    // v[8 + j], v[12 + j].
    let w: [__m512; 8] = std::array::from_fn(|k| {
        let (a, b) = (v[2 * k], v[2 * k + 1]);
        op(_mm512_shuffle_f32x4::<0x44>(a, b), _mm512_shuffle_f32x4::<0xEE>(a, b))
    });
    let x: [__m512; 4] = std::array::from_fn(|k| {
        let (a, b) = (w[2 * k], w[2 * k + 1]);
        op(_mm512_shuffle_f32x4::<0x88>(a, b), _mm512_shuffle_f32x4::<0xDD>(a, b))
    });
    let y: [__m512; 2] = std::array::from_fn(|k| {
        let (a, b) = (x[2 * k], x[2 * k + 1]);
        op(_mm512_shuffle_ps::<0x44>(a, b), _mm512_shuffle_ps::<0xEE>(a, b))
    });
    let z = op(_mm512_shuffle_ps::<0x88>(y[0], y[1]), _mm512_shuffle_ps::<0xDD>(y[0], y[1]));
    // Total of v[i] is at 4 (i % 4) + i / 4.
    _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z)
}

/// Quantises one block of 32 values to `round(v / (amax / 127))` (half away from zero, as
/// `f32::round`), written as bytes into `words`; returns the block's amax and the sum of the
/// quantised values.
pub(super) fn quantize_block(isa: Isa, block: &[f32], words: &mut [i32]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if isa.available() {
        // SAFETY: the instructions were checked; the slices have 32 values / 8 words.
        return unsafe {
            match isa {
                Isa::Avx512Vnni => quantize_block_avx512(block, words),
                Isa::Avx2 => quantize_block_avx2(block, words),
            }
        };
    }
    quantize_block_scalar(block, words)
}

pub(super) fn quantize_block_scalar(block: &[f32], words: &mut [i32]) -> (f32, i32) {
    let amax = block.iter().fold(0f32, |a, v| a.max(v.abs()));
    let scale = amax / 127.0;
    let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    let mut sum = 0i32;
    let mut bytes = [0u8; BLOCK];
    for (q, &v) in bytes.iter_mut().zip(block) {
        let r = f32::round(v * inverse) as i8;
        sum += r as i32;
        *q = r as u8;
    }
    for (w, b) in words.iter_mut().zip(bytes.chunks_exact(4)) {
        *w = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    (amax, sum)
}

/// [`quantize_block_scalar`] with AVX-512, bit for bit: `v * inverse` is the same product,
/// and rounding half away from zero is truncation plus one step away from zero where the
/// (exact) remainder is at least one half.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn quantize_block_avx512(block: &[f32], words: &mut [i32]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert!(block.len() == BLOCK && words.len() == 8);
    // SAFETY: 32 values to read, 8 words (32 bytes) to write.
    unsafe {
        let a = _mm512_loadu_ps(block.as_ptr());
        let b = _mm512_loadu_ps(block.as_ptr().add(16));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
        let scale = amax / 127.0;
        let inverse = _mm512_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
        let half = _mm512_set1_ps(0.5);
        let round = |v: __m512| {
            let x = _mm512_mul_ps(v, inverse);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(x, t)), half);
            // One step away from zero: +1 or -1 with x's sign.
            // (Integer and/or: the float ones are AVX-512 DQ, not enabled here.)
            let sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN));
            let step = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(_mm512_set1_ps(1.0)), sign));
            _mm512_cvttps_epi32(_mm512_mask_add_ps(t, away, t, step))
        };
        let (qa, qb) = (round(a), round(b));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
        let dst = words.as_mut_ptr().cast::<u8>();
        _mm_storeu_si128(dst.cast(), _mm512_cvtepi32_epi8(qa));
        _mm_storeu_si128(dst.add(16).cast(), _mm512_cvtepi32_epi8(qb));
        (amax, sum)
    }
}

/// [`quantize_block_scalar`] with AVX2, bit for bit, the same way as
/// [`quantize_block_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_block_avx2(block: &[f32], words: &mut [i32]) -> (f32, i32) {
    use std::arch::x86_64::*;
    debug_assert!(block.len() == BLOCK && words.len() == 8);
    // SAFETY: 32 values to read, 8 words (32 bytes) to write.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(block.as_ptr().add(8 * i)));
        let abs = v.map(|v| _mm256_andnot_ps(sign, v));
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<1>(m, m)));
        let scale = amax / 127.0;
        let inverse = _mm256_set1_ps(if scale != 0.0 { 1.0 / scale } else { 0.0 });
        let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
        let q = v.map(|v| {
            let x = _mm256_mul_ps(v, inverse);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(x);
            let away = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_andnot_ps(sign, _mm256_sub_ps(x, t)), half);
            // One step away from zero where the remainder is at least one half.
            let step = _mm256_and_ps(away, _mm256_or_ps(one, _mm256_and_ps(x, sign)));
            _mm256_cvttps_epi32(_mm256_add_ps(t, step))
        });
        let total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        let total = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256::<1>(total));
        let total = _mm_add_epi32(total, _mm_unpackhi_epi64(total, total));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(total, _mm_shuffle_epi32::<1>(total)));
        // The values fit a byte (|q| <= 127): pack without saturating, then undo the packs'
        // interleaving of the two 128-bit halves.
        let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(words.as_mut_ptr().cast(), bytes);
        (amax, sum)
    }
}
