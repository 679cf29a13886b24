//! Q4_1 products (SmolLM2's layers) against activations quantised to Q8_1.

use super::quantize::*;
use super::tiles::*;

/// Q4_1 weights repacked for the kernel: for each group of 16 output columns and each block,
/// five cache lines, read front to back: four 64-byte vectors (lane `c` of vector `j` holds
/// bytes `4j..4j+4` of column `c`'s block, i.e. the weights of positions `4j..4j+4` in its
/// low nibbles and `16+4j..16+4j+4` in its high nibbles), then the 16 scales and the 16
/// minimums as the file's f16 (widened to f32 in the kernel, exactly). The layout holds the
/// GGUF's 20 bytes per block and column and no more: a decode step streams every weight
/// once, so its time is these bytes over the memory bandwidth.
pub struct PackedQ4_1 {
    /// Output columns (weight rows).
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    pub(super) blocks: usize,
    pub(super) lines: Vec<Line>,
}

/// Cache lines per (group, block) of [`PackedQ4_1`].
pub(super) const Q4_1_LINES: usize = 5;

impl PackedQ4_1 {
    /// Repacks a `[n, k]` Q4_1 matrix from its GGUF bytes (blocks of `d: f16, m: f16,
    /// qs: [u8; 16]`, row by row). `None` when the shape does not suit the kernel (`n` not a
    /// multiple of 16, `k` not a multiple of 32) or the bytes do not match it.
    pub fn new(raw: &[u8], n: usize, k: usize) -> Option<Self> {
        if n == 0 || !n.is_multiple_of(LANES) || k == 0 || !k.is_multiple_of(BLOCK) {
            return None;
        }
        let blocks = k / BLOCK;
        if raw.len() != n * blocks * 20 {
            return None;
        }
        let groups = n / LANES;
        let mut packed = lines(groups * blocks * Q4_1_LINES);
        for col in 0..n {
            let (g, c) = (col / LANES, col % LANES);
            for b in 0..blocks {
                let block = &raw[(col * blocks + b) * 20..][..20];
                let at = &mut packed[(g * blocks + b) * Q4_1_LINES..][..Q4_1_LINES];
                for j in 0..4 {
                    at[j].0[c * 4..][..4].copy_from_slice(&block[4 + 4 * j..][..4]);
                }
                // d and m stay f16, in the file's byte order.
                at[4].0[c * 2..][..2].copy_from_slice(&block[0..2]);
                at[4].0[32 + c * 2..][..2].copy_from_slice(&block[2..4]);
            }
        }
        Some(Self { n, k, blocks, lines: packed })
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }

    /// `x` (`rows x k`, row-major) times the matrix transposed: `rows x n`, with the kernel of
    /// `isa`; with `wanted`, only those (row, group) blocks, the rest `fill`
    /// ([`Packed::matmul_selected`]). `None` when the CPU lacks the instructions.
    pub(super) fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        wanted: Option<Selection>,
        fill: f32,
    ) -> Option<Vec<f32>> {
        if !isa.available() || x.len() != rows * self.k {
            return None;
        }
        let y = Q8_1Rows::quantize(isa, x, rows, self.k);
        let mut out = Outputs::new(rows * self.n, wanted.map(|_| fill));
        let out_addr = out.addr();
        for_each_tile(rows, self.n / LANES, Self::row_tile(isa), rows * self.n * self.k, wanted, |r0, r1, g| {
            // SAFETY: `isa` is available; each (row, group) output block is written by at most
            // one call, and `out` outlives them all.
            unsafe { self.tile(isa, &y, r0, r1, g, out_addr as *mut f32) }
        });
        // SAFETY: without a selection the tiles cover every (row, group) block.
        Some(unsafe { out.finish() })
    }

    /// Rows per call of [`Self::tile`]. The AVX2 kernel takes all the rows at once and tiles
    /// them itself, so one group's weights (a few KB) stay in L1 for every row tile.
    pub(super) fn row_tile(isa: Isa) -> usize {
        match isa {
            Isa::Avx512Vnni => ROW_TILE_Q4,
            Isa::Avx2 => usize::MAX,
        }
    }

    /// Outputs of group `g` for rows `r0..r1` (at most [`Self::row_tile`]).
    #[cfg(target_arch = "x86_64")]
    pub(super) unsafe fn tile(&self, isa: Isa, y: &Q8_1Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe {
            match isa {
                Isa::Avx512Vnni => self.tile_avx512(y, r0, r1, g, out),
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
        }
    }

    /// The AVX-512 kernel for rows `r0..r1` (at most [`ROW_TILE_Q4`]) of group `g`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile_avx512(&self, y: &Q8_1Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe { by_row_count!(r1 - r0, self.tile_rows(y, r0, g, out)) }
    }

    /// [`Self::tile`] for `R` rows from `r0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    pub(super) unsafe fn tile_rows<const R: usize>(&self, y: &Q8_1Rows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        debug_assert!(R <= ROW_TILE_Q4 && (r0 + R) * y.blocks * 8 <= y.words.len() && y.blocks == self.blocks);
        let nibble = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); R];
        // SAFETY (every access below): `lines` holds 5 aligned lines per (group, block),
        // g < n / 16; rows r0..r0 + R of `y` exist (the caller's promise) with
        // 8 words, one scale and one sum per block.
        unsafe {
            let group = self.lines.as_ptr().add(g * self.blocks * Q4_1_LINES).cast::<u8>();
            let words = y.words.as_ptr().add(r0 * y.blocks * 8);
            let (yd, ys) = (y.d.as_ptr().add(r0 * y.blocks), y.s.as_ptr().add(r0 * y.blocks));
            for b in 0..self.blocks {
                // One integer accumulator per row: integer sums are exact in any order, and
                // the rows' chains are independent.
                let mut sums = [_mm512_setzero_si512(); R];
                let block = group.add(b * Q4_1_LINES * 64);
                // The weights a few blocks ahead (a hint: harmless past the end).
                let ahead = block.wrapping_add(PREFETCH_BLOCKS * Q4_1_LINES * 64);
                for line in 0..Q4_1_LINES {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64).cast());
                }
                for j in 0..4 {
                    let w = _mm512_load_si512(block.add(j * 64).cast());
                    let lo = _mm512_and_si512(w, nibble);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibble);
                    for (t, sum) in sums.iter_mut().enumerate() {
                        let row = words.add((t * y.blocks + b) * 8);
                        *sum = _mm512_dpbusd_epi32(*sum, lo, _mm512_set1_epi32(*row.add(j)));
                        *sum = _mm512_dpbusd_epi32(*sum, hi, _mm512_set1_epi32(*row.add(4 + j)));
                    }
                    interleave_rows(&mut sums);
                }
                let dx = _mm512_cvtph_ps(_mm256_load_si256(block.add(4 * 64).cast()));
                let mx = _mm512_cvtph_ps(_mm256_load_si256(block.add(4 * 64 + 32).cast()));
                for (t, (a, sum)) in acc.iter_mut().zip(sums).enumerate() {
                    let at = t * y.blocks + b;
                    let p = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), dx), _mm512_set1_ps(*yd.add(at)));
                    // `p + m_x * s_y` in one rounding: the product is exact (module docs).
                    *a = _mm512_add_ps(*a, _mm512_fmadd_ps(mx, _mm512_set1_ps(*ys.add(at)), p));
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // Row r0 + t < rows of the output, columns g*16..g*16+16 < n.
                _mm512_storeu_ps(out.add((r0 + t) * self.n + g * LANES), *a);
            }
        }
    }

    /// The AVX2 kernel for `R` rows from `r0` of group `g`: the same sums as
    /// [`Self::tile_rows`], each 64-byte line taken as two halves of 8 columns.
    ///
    /// Two passes over each run of [`AVX2_RUN_BLOCKS`] blocks: the integer sums of every
    /// (row, block, half) into a buffer in L1, then the float steps in candle's order. In one
    /// pass the float accumulators took 8 of the 16 registers and spilled, and each block's
    /// long float chain (convert, three multiplies, two adds) stalled the next block's integer
    /// work; split, each pass keeps its values in registers, and each activation word
    /// broadcast serves both halves of the line (an ad-hoc harness: 1.27x on 16 rows of the
    /// 1536x576 gate product, single-threaded; the `matmul` bench, which also
    /// quantises the activations and streams the weights, 5-15%: `dspark engine-bench`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn tile_rows_avx2<const R: usize>(&self, y: &Q8_1Rows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        debug_assert!(R <= ROW_TILE_AVX2 && (r0 + R) * y.blocks * 8 <= y.words.len() && y.blocks == self.blocks);
        let nibble = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        // Written before it is read, block by block; zeroing it cost 5% of a serving step.
        let mut sums = [std::mem::MaybeUninit::<[[__m256i; 2]; R]>::uninit(); AVX2_RUN_BLOCKS];
        // SAFETY (every access below): as in `tile_rows`; a half line is 32-byte aligned and
        // its 8 scales 16-byte aligned; `sums` holds a run's blocks.
        unsafe {
            let group = self.lines.as_ptr().add(g * self.blocks * Q4_1_LINES).cast::<u8>();
            let words = y.words.as_ptr().add(r0 * y.blocks * 8);
            let (yd, ys) = (y.d.as_ptr().add(r0 * y.blocks), y.s.as_ptr().add(r0 * y.blocks));
            for run in (0..self.blocks).step_by(AVX2_RUN_BLOCKS) {
                let run_blocks = (self.blocks - run).min(AVX2_RUN_BLOCKS);
                for (i, sums) in sums.iter_mut().enumerate().take(run_blocks) {
                    let b = run + i;
                    let block = group.add(b * Q4_1_LINES * 64);
                    // The first row tile streams the group from memory: ask for the lines a
                    // few blocks ahead (a hint; past the end it fetches nothing harmful).
                    let ahead = block.wrapping_add(PREFETCH_BLOCKS * Q4_1_LINES * 64);
                    for line in 0..Q4_1_LINES {
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64).cast());
                    }
                    // Byte-pair sums in 16 bits: at most 30,720 over the block (module docs).
                    let mut pairs = [[_mm256_setzero_si256(); 2]; R];
                    for j in 0..4 {
                        let w0 = _mm256_load_si256(block.add(j * 64).cast());
                        let w1 = _mm256_load_si256(block.add(j * 64 + 32).cast());
                        let lo = [_mm256_and_si256(w0, nibble), _mm256_and_si256(w1, nibble)];
                        let hi = [
                            _mm256_and_si256(_mm256_srli_epi16(w0, 4), nibble),
                            _mm256_and_si256(_mm256_srli_epi16(w1, 4), nibble),
                        ];
                        for (t, pair) in pairs.iter_mut().enumerate() {
                            let row = words.add((t * y.blocks + b) * 8);
                            let (xl, xh) = (_mm256_set1_epi32(*row.add(j)), _mm256_set1_epi32(*row.add(4 + j)));
                            for h in 0..2 {
                                let a = _mm256_maddubs_epi16(lo[h], xl);
                                let c = _mm256_maddubs_epi16(hi[h], xh);
                                pair[h] = _mm256_add_epi16(pair[h], _mm256_add_epi16(a, c));
                            }
                        }
                    }
                    for pair in pairs.iter_mut() {
                        for p in pair.iter_mut() {
                            *p = _mm256_madd_epi16(*p, ones);
                        }
                    }
                    sums.write(pairs);
                }
                for (i, sums) in sums.iter().enumerate().take(run_blocks) {
                    let b = run + i;
                    // Written by the first pass for every block of the run.
                    let sums = sums.assume_init_ref();
                    let scales = group.add((b * Q4_1_LINES + 4) * 64);
                    for h in 0..2 {
                        let dx = _mm256_cvtph_ps(_mm_load_si128(scales.add(h * 16).cast()));
                        let mx = _mm256_cvtph_ps(_mm_load_si128(scales.add(32 + h * 16).cast()));
                        for (t, (a, sum)) in acc.iter_mut().zip(sums).enumerate() {
                            let at = t * y.blocks + b;
                            let p = _mm256_mul_ps(
                                _mm256_mul_ps(_mm256_cvtepi32_ps(sum[h]), dx),
                                _mm256_set1_ps(*yd.add(at)),
                            );
                            // `p + m_x * s_y` in one rounding (exact product, module docs).
                            a[h] = _mm256_add_ps(a[h], _mm256_fmadd_ps(mx, _mm256_set1_ps(*ys.add(at)), p));
                        }
                    }
                }
            }
            for (t, a) in acc.iter().enumerate() {
                for (h, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(out.add((r0 + t) * self.n + g * LANES + h * 8), *a);
                }
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn tile(&self, _: Isa, _: &Q8_1Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("matmul checks the instruction set first")
    }
}
