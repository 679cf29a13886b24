//! Q5_0 products (most of Qwen2.5's layers) against activations quantised to Q8_0.

use half::f16;

use super::q8_0::ByteColumns;
use super::quantize::*;
use super::tiles::*;

/// Q5_0 weights repacked for the kernel: the 5-bit values unpacked to bytes plus 16 (0..31).
/// candle multiplies Q5_0 with a scalar loop: `sum = sum + (sumi as f32 * d_x) * d_y` per
/// block, reproduced here one output per lane.
pub struct PackedQ5_0(pub(super) ByteColumns);

impl PackedQ5_0 {
    /// Repacks a `[n, k]` Q5_0 matrix from its GGUF bytes (blocks of `d: f16, qh: [u8; 4],
    /// qs: [u8; 16]`).
    pub fn new(raw: &[u8], n: usize, k: usize) -> Option<Self> {
        ByteColumns::new(raw, n, k, 22, |block| {
            let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
            let nibbles = &block[6..22];
            let values = std::array::from_fn(|i| {
                let (nibble, bit) = if i < 16 { (nibbles[i] & 0x0F, i) } else { (nibbles[i - 16] >> 4, i) };
                nibble | ((((qh >> bit) & 1) as u8) << 4)
            });
            (f16::from_le_bytes([block[0], block[1]]), values)
        })
        .map(Self)
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// `x` (`rows x k`, row-major) times the matrix transposed: `rows x n`, with the kernel of
    /// `isa`; with `wanted`, only those blocks. `None` when the CPU lacks the instructions.
    pub(super) fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        wanted: Option<Selection>,
        fill: f32,
    ) -> Option<Vec<f32>> {
        let row_tile = ByteColumns::row_tile(isa, ROW_TILE_Q5);
        // SAFETY: as for Q8_0.
        self.0.matmul(isa, x, rows, row_tile, wanted, fill, |y, r0, r1, g, out| unsafe {
            match isa {
                Isa::Avx512Vnni => self.tile(y, r0, r1, g, out),
                Isa::Avx2 => {
                    for (r, t) in avx2_row_tiles(r0, r1) {
                        match t {
                            1 => self.tile_rows_avx2::<1>(y, r, g, out),
                            2 => self.tile_rows_avx2::<2>(y, r, g, out),
                            3 => self.tile_rows_avx2::<3>(y, r, g, out),
                            _ => self.tile_rows_avx2::<4>(y, r, g, out),
                        }
                    }
                }
            }
        })
    }

    /// The AVX2 kernel for `R` rows from `r0` of group `g`, in two passes over runs of
    /// blocks as Q4_1's: first the integer sums (16-bit pair sums over 4 vectors at a time, at
    /// most 4 x 2 x 31 x 128, widened to 32 bits), then each block's float step.
    ///
    /// Each activation word broadcast serves both halves of a line, and the activations are
    /// read through raw pointers: one half at a time with indexed reads took twice the
    /// broadcasts, and the bounds checks' operands spilled from the general registers.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn tile_rows_avx2<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let cols = &self.0;
        assert!(R <= ROW_TILE_AVX2 && (r0 + R) * y.blocks * 8 <= y.words.len() && y.blocks == cols.blocks);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        // Written before it is read, block by block.
        let mut sums = [std::mem::MaybeUninit::<[[__m256i; 2]; R]>::uninit(); AVX2_RUN_BLOCKS];
        // SAFETY (every access below): rows r0..r0 + R have `blocks` scales, sums and
        // `8 blocks` words each (asserted); group g has `blocks` blocks of 8 aligned lines;
        // `sums` holds a run's blocks.
        unsafe {
            let group = cols.qs.as_ptr().add(g * cols.blocks * 8).cast::<u8>();
            let words = y.words.as_ptr().add(r0 * y.blocks * 8);
            let (yd, ysum) = (y.d.as_ptr().add(r0 * y.blocks), y.sums.as_ptr().add(r0 * y.blocks));
            for run in (0..cols.blocks).step_by(AVX2_RUN_BLOCKS) {
                let run_blocks = (cols.blocks - run).min(AVX2_RUN_BLOCKS);
                for (i, sums) in sums.iter_mut().enumerate().take(run_blocks) {
                    let b = run + i;
                    let block = group.add(b * 8 * 64);
                    // The first row tile streams the group from memory (a hint; past the end
                    // it fetches nothing harmful).
                    let ahead = block.wrapping_add(PREFETCH_BLOCKS * 8 * 64);
                    for line in 0..8 {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64).cast());
                    }
                    let mut wide = [[_mm256_setzero_si256(); 2]; R];
                    for quad in 0..2 {
                        let mut pairs = [[_mm256_setzero_si256(); 2]; R];
                        for j in 0..4 {
                            let l = 4 * quad + j;
                            let w = [
                                _mm256_load_si256(block.add(l * 64).cast()),
                                _mm256_load_si256(block.add(l * 64 + 32).cast()),
                            ];
                            for (t, pair) in pairs.iter_mut().enumerate() {
                                let x = _mm256_set1_epi32(*words.add((t * y.blocks + b) * 8 + l));
                                for (p, w) in pair.iter_mut().zip(&w) {
                                    *p = _mm256_add_epi16(*p, _mm256_maddubs_epi16(*w, x));
                                }
                            }
                        }
                        for (wide, pair) in wide.iter_mut().zip(&pairs) {
                            for (s, p) in wide.iter_mut().zip(pair) {
                                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(*p, ones));
                            }
                        }
                    }
                    sums.write(wide);
                }
                for (i, sums) in sums.iter().enumerate().take(run_blocks) {
                    let b = run + i;
                    // Written by the first pass for every block of the run.
                    let sums = sums.assume_init_ref();
                    for h in 0..2 {
                        let dx = cols.half_scales(g * cols.blocks + b, h);
                        for (t, (a, sum)) in acc.iter_mut().zip(sums).enumerate() {
                            let at = t * y.blocks + b;
                            // The stored values are the weights plus 16: take 16 x the
                            // activations' sum.
                            let sum = _mm256_sub_epi32(sum[h], _mm256_set1_epi32(16 * *ysum.add(at)));
                            let p =
                                _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), dx), _mm256_set1_ps(*yd.add(at)));
                            a[h] = _mm256_add_ps(a[h], p);
                        }
                    }
                }
            }
            for (t, a) in acc.iter().enumerate() {
                for (h, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(out.add((r0 + t) * cols.n + g * LANES + h * 8), *a);
                }
            }
        }
    }

    /// The AVX-512 kernel for rows `r0..r1` (at most [`ROW_TILE_Q5`]) of group `g`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe { by_row_count!(r1 - r0, self.tile_rows(y, r0, g, out)) }
    }

    /// [`Self::tile`] for `R` rows from `r0`: one integer sum per row and block, the rows'
    /// chains interleaved ([`interleave_rows`]), then candle's float step.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    pub(super) unsafe fn tile_rows<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let cols = &self.0;
        debug_assert!(R <= ROW_TILE_Q5 && (r0 + R) * y.blocks <= y.d.len() && y.blocks == cols.blocks);
        let mut acc = [_mm512_setzero_ps(); R];
        // SAFETY (every access below): 8 aligned lines and 16 scales per (group, block),
        // g < n / 16; rows r0..r0 + R of `y` exist (the caller's promise) with 8 words, one
        // scale and one sum per block.
        unsafe {
            let yd = y.d.as_ptr().add(r0 * y.blocks);
            for b in 0..cols.blocks {
                // The stored values are the weights plus 16.
                let sums = cols.block_sums::<R>(y, r0, g, b, 16);
                let dx = cols.scales(g * cols.blocks + b);
                for (t, (a, sum)) in acc.iter_mut().zip(sums).enumerate() {
                    let yd = _mm512_set1_ps(*yd.add(t * y.blocks + b));
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), dx), yd));
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // Row r0 + t < rows of the output, columns g*16..g*16+16 < n.
                _mm512_storeu_ps(out.add((r0 + t) * cols.n + g * LANES), *a);
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn tile(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("matmul checks the instruction set first")
    }
}
