//! Q8_0 products (SmolLM2's embedding and output projection; Qwen2.5's output and value
//! projections) against activations quantised to Q8_0, in candle's order and, for the logits,
//! in the kernel's fastest order ([`PackedQ8_0::logits_with`]). [`ByteColumns`] is the
//! one-byte-per-weight layout Q5_0 shares.

use half::f16;

use super::quantize::*;
use super::tiles::*;

/// Weights unpacked to one byte each (made unsigned by an offset), for the kernels whose
/// activations are Q8_0: for each group of 16 output columns and each block, eight 64-byte
/// vectors, one cache line each (lane `c` of vector `l` holds values `4l..4l+4` of column `c`'s
/// block); beside them the 16 scales per (group, block) as the file's f16.
pub(super) struct ByteColumns {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) blocks: usize,
    pub(super) qs: Vec<Line>,
    pub(super) d: Vec<f16>,
}

impl ByteColumns {
    /// Repacks `[n, k]` blocks of `block_bytes` each; `unpack` turns one block into its scale
    /// and its 32 offset values.
    pub(super) fn new(
        raw: &[u8],
        n: usize,
        k: usize,
        block_bytes: usize,
        unpack: impl Fn(&[u8]) -> (f16, [u8; BLOCK]),
    ) -> Option<Self> {
        if n == 0 || !n.is_multiple_of(LANES) || k == 0 || !k.is_multiple_of(BLOCK) {
            return None;
        }
        let blocks = k / BLOCK;
        if raw.len() != n * blocks * block_bytes {
            return None;
        }
        let groups = n / LANES;
        let mut qs = lines(groups * blocks * 8);
        let mut d = vec![f16::ZERO; groups * blocks * LANES];
        for col in 0..n {
            let (g, c) = (col / LANES, col % LANES);
            for b in 0..blocks {
                let (scale, values) = unpack(&raw[(col * blocks + b) * block_bytes..][..block_bytes]);
                d[(g * blocks + b) * LANES + c] = scale;
                let base = (g * blocks + b) * 8;
                for l in 0..8 {
                    qs[base + l].0[c * 4..][..4].copy_from_slice(&values[4 * l..4 * l + 4]);
                }
            }
        }
        Some(Self { n, k, blocks, qs, d })
    }

    pub(super) fn bytes(&self) -> usize {
        self.qs.len() * 64 + 2 * self.d.len()
    }

    /// Quantises `x` to Q8_0 and runs `tile` over every (row tile, column group), or only
    /// over the `wanted` blocks with the rest `fill`.
    #[allow(clippy::too_many_arguments)] // the product, its selection and its kernel
    pub(super) fn matmul(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        row_tile: usize,
        wanted: Option<Selection>,
        fill: f32,
        tile: impl Fn(&Q8_0Rows, usize, usize, usize, *mut f32) + Sync,
    ) -> Option<Vec<f32>> {
        if !isa.available() || x.len() != rows * self.k {
            return None;
        }
        let y = Q8_0Rows::quantize(isa, x, rows, self.k);
        let mut out = Outputs::new(rows * self.n, wanted.map(|_| fill));
        let out_addr = out.addr();
        for_each_tile(rows, self.n / LANES, row_tile, rows * self.n * self.k, wanted, |r0, r1, g| {
            tile(&y, r0, r1, g, out_addr as *mut f32)
        });
        // SAFETY: without a selection every (row, group) block is written by its tile (the
        // `tile` contract).
        Some(unsafe { out.finish() })
    }

    /// Asks for the weights of group `g + 1` into L2 while group `g` is computed: the AVX2
    /// kernels read a group several times (row tiles, halves, passes), and the first reading
    /// stalled on memory for want of lines asked for early enough. A hint: harmless past the
    /// end.
    #[cfg(target_arch = "x86_64")]
    pub(super) fn prefetch_next_group(&self, g: usize) {
        use std::arch::x86_64::{_MM_HINT_T1, _mm_prefetch};
        let next = self.qs.as_ptr().wrapping_add((g + 1) * self.blocks * 8);
        for line in 0..self.blocks * 8 {
            // SAFETY: a prefetch does not access memory; any address is allowed.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(line).cast()) };
        }
    }

    /// The 64-byte vector `l` of (group, block) `gb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn vector(&self, gb: usize, l: usize) -> std::arch::x86_64::__m512i {
        // SAFETY: 8 aligned lines per (group, block); the caller keeps l < 8.
        unsafe { std::arch::x86_64::_mm512_load_si512(self.qs.as_ptr().add(gb * 8 + l).cast()) }
    }

    /// The 16 scales of (group, block) `gb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn scales(&self, gb: usize) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: 16 scales per (group, block); f16 to f32 is exact.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(self.d.as_ptr().add(gb * LANES).cast())) }
    }

    /// The exact dot products of block `b` of group `g` with rows `r0..r0 + R` of `y`, each
    /// stored weight being the true one plus `offset` (`offset x` the row's block sum comes
    /// off): one `vpdpbusd` chain per row, the rows interleaved ([`interleave_rows`]).
    ///
    /// # Safety
    /// The CPU has AVX-512 VNNI; `g` and `b` are in range, and rows `r0..r0 + R` of `y` exist.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    pub(super) unsafe fn block_sums<const R: usize>(
        &self,
        y: &Q8_0Rows,
        r0: usize,
        g: usize,
        b: usize,
        offset: i32,
    ) -> [std::arch::x86_64::__m512i; R] {
        use std::arch::x86_64::*;
        let gb = g * self.blocks + b;
        let mut sums = [_mm512_setzero_si512(); R];
        // SAFETY: the caller's promise: 8 words and one sum per row and block.
        unsafe {
            let words = y.words.as_ptr().add(r0 * y.blocks * 8);
            for l in 0..8 {
                let w = self.vector(gb, l);
                for (t, sum) in sums.iter_mut().enumerate() {
                    let x = _mm512_set1_epi32(*words.add((t * y.blocks + b) * 8 + l));
                    *sum = _mm512_dpbusd_epi32(*sum, w, x);
                }
                interleave_rows(&mut sums);
            }
            let sums_of_rows = y.sums.as_ptr().add(r0 * y.blocks);
            for (t, sum) in sums.iter_mut().enumerate() {
                *sum = _mm512_sub_epi32(*sum, _mm512_set1_epi32(offset * *sums_of_rows.add(t * y.blocks + b)));
            }
        }
        sums
    }

    /// Half `half` (columns `8 half..8 half + 8`) of the vector `l` of (group, block) `gb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn half_vector(&self, gb: usize, l: usize, half: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: 8 aligned lines per (group, block); the caller keeps l < 8, half < 2.
        unsafe { _mm256_load_si256(self.qs.as_ptr().add(gb * 8 + l).cast::<u8>().add(half * 32).cast()) }
    }

    /// The 8 scales of half `half` of (group, block) `gb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn half_scales(&self, gb: usize, half: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 16 scales per (group, block); f16 to f32 is exact.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.d.as_ptr().add(gb * LANES + half * 8).cast())) }
    }

    /// Rows per call of a tile function: the AVX2 kernels take all the rows and tile them
    /// themselves, so one group's weights stay in L1 for every row tile.
    pub(super) fn row_tile(isa: Isa, avx512: usize) -> usize {
        match isa {
            Isa::Avx512Vnni => avx512,
            Isa::Avx2 => usize::MAX,
        }
    }
}

/// Q8_0 weights repacked for the kernel (stored plus 128).
pub struct PackedQ8_0(pub(super) ByteColumns);

impl PackedQ8_0 {
    /// Repacks a `[n, k]` Q8_0 matrix from its GGUF bytes (blocks of `d: f16, qs: [i8; 32]`).
    /// Where `k` is a multiple of 256, candle multiplies Q8_0 with its own VNNI kernel (other
    /// numerics): those matrices are left to it (`None`).
    pub fn new(raw: &[u8], n: usize, k: usize) -> Option<Self> {
        if k.is_multiple_of(256) {
            return None;
        }
        ByteColumns::new(raw, n, k, 34, |block| {
            (f16::from_le_bytes([block[0], block[1]]), std::array::from_fn(|i| block[2 + i] ^ 0x80))
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
        let row_tile = ByteColumns::row_tile(isa, ROW_TILE_Q8);
        // SAFETY: `ByteColumns::matmul` checked that `isa` is available; each (row, group)
        // output block is written by at most one call.
        self.0.matmul(isa, x, rows, row_tile, wanted, fill, |y, r0, r1, g, out| unsafe {
            match isa {
                Isa::Avx512Vnni => self.tile(y, r0, r1, g, out),
                Isa::Avx2 => self.tile_avx2(y, r0, r1, g, out),
            }
        })
    }

    /// The output projection in the logits order ([`Packed::logits`]): each block's 32
    /// products summed as one integer and scaled once,
    ///
    /// ```text
    /// for every block b:  acc = fma(d_x * d_y, (sum_i w_i q_i) as f32, acc)
    /// ```
    ///
    /// 12 vector operations per block, row and 16 columns, where candle's order (8 float
    /// partial sums per output, [`Self::tile`]) takes 33. The sums differ from candle's in
    /// the last bits only (the integer sums are exact; `|sum| < 2^20` converts exactly). The
    /// AVX2 kernel ([`Self::tile_logits_avx2`]) computes the same values bit for bit, so the
    /// logits do not depend on the instruction set.
    pub(super) fn logits_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        wanted: Option<Selection>,
        fill: f32,
    ) -> Option<Vec<f32>> {
        let row_tile = ByteColumns::row_tile(isa, ROW_TILE_Q8_LOGITS);
        // SAFETY: `ByteColumns::matmul` checked that `isa` is available; each (row, group)
        // output block is written by at most one call.
        self.0.matmul(isa, x, rows, row_tile, wanted, fill, |y, r0, r1, g, out| unsafe {
            match isa {
                Isa::Avx512Vnni => self.tile_logits(y, r0, r1, g, out),
                Isa::Avx2 => self.tile_logits_avx2(y, r0, r1, g, out),
            }
        })
    }

    /// The logits kernel with AVX2: rows `r0..r1` of group `g`, in tiles of up to
    /// [`ROW_TILE_AVX2`] rows, each 64-byte line taken as two halves of 8 columns. The same
    /// values as [`Self::tile_logits`] bit for bit: each block's integer sum is exact either
    /// way (`vpmaddubsw` cannot saturate: the weights' signs are moved onto the activations,
    /// whose magnitudes are at most 127 from the quantiser, so a pair sums to at most 2 x 128 x
    /// 127), and the float steps are the same.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_logits_avx2(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        self.0.prefetch_next_group(g);
        for (r, t) in avx2_row_tiles(r0, r1) {
            // SAFETY: the caller's promise, for the tile's rows.
            unsafe {
                match t {
                    1 => self.tile_logits_rows_avx2::<1>(y, r, g, out),
                    2 => self.tile_logits_rows_avx2::<2>(y, r, g, out),
                    3 => self.tile_logits_rows_avx2::<3>(y, r, g, out),
                    _ => self.tile_logits_rows_avx2::<4>(y, r, g, out),
                }
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn tile_logits_avx2(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("logits_with checks the instruction set first")
    }

    /// [`Self::tile_logits_avx2`] for `R` rows from `r0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn tile_logits_rows_avx2<const R: usize>(
        &self,
        y: &Q8_0Rows,
        r0: usize,
        g: usize,
        out: *mut f32,
    ) {
        use std::arch::x86_64::*;
        let cols = &self.0;
        debug_assert!(R <= ROW_TILE_AVX2 && (r0 + R) * y.blocks <= y.d.len() && y.blocks == cols.blocks);
        let ones = _mm256_set1_epi16(1);
        let flip = _mm256_set1_epi8(-128);
        // Each row's scales and words from raw pointers, as in `tile_rows_avx2`.
        let row_d: [*const f32; R] = std::array::from_fn(|t| y.d[(r0 + t) * y.blocks..].as_ptr());
        let row_words: [*const i32; R] = std::array::from_fn(|t| y.words[(r0 + t) * y.blocks * 8..].as_ptr());
        for half in 0..2 {
            let mut acc = [_mm256_setzero_ps(); R];
            for b in 0..cols.blocks {
                let gb = g * cols.blocks + b;
                if half == 0 {
                    let ahead = cols.qs.as_ptr().wrapping_add((gb + PREFETCH_BLOCKS) * 8);
                    for line in 0..8 {
                        // A hint: harmless past the end.
                        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                    }
                }
                let mut sums = [_mm256_setzero_si256(); R];
                for l in 0..8 {
                    // SAFETY: the features are enabled; gb is in range, l < 8, half < 2. The
                    // stored bytes are the weights plus 128.
                    let w = _mm256_xor_si256(unsafe { cols.half_vector(gb, l, half) }, flip);
                    let magnitude = _mm256_abs_epi8(w);
                    for (t, sum) in sums.iter_mut().enumerate() {
                        // SAFETY: row r0 + t < rows has `8 blocks` words (sliced above).
                        let x = _mm256_set1_epi32(unsafe { *row_words[t].add(b * 8 + l) });
                        let p = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, w));
                        *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(p, ones));
                    }
                }
                // SAFETY: the features are enabled; gb is in range, half < 2.
                let dx = unsafe { cols.half_scales(gb, half) };
                for (t, (a, sum)) in acc.iter_mut().zip(sums).enumerate() {
                    // SAFETY: row r0 + t < rows has `blocks` scales (sliced above).
                    let scale = _mm256_mul_ps(dx, _mm256_set1_ps(unsafe { *row_d[t].add(b) }));
                    *a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), *a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // SAFETY: row r0 + t < rows of the output, columns g*16 + half*8.. + 8 <= n.
                unsafe { _mm256_storeu_ps(out.add((r0 + t) * cols.n + g * LANES + half * 8), *a) };
            }
        }
    }

    /// The logits kernel for rows `r0..r1` (at most [`ROW_TILE_Q8_LOGITS`]) of group `g`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile_logits(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe { by_row_count!(r1 - r0, self.tile_logits_rows(y, r0, g, out)) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn tile_logits(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("logits_with checks the instruction set first")
    }

    /// [`Self::tile_logits`] for `R` rows from `r0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    pub(super) unsafe fn tile_logits_rows<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let cols = &self.0;
        debug_assert!(R <= ROW_TILE_Q8_LOGITS && (r0 + R) * y.blocks <= y.d.len() && y.blocks == cols.blocks);
        let mut acc = [_mm512_setzero_ps(); R];
        // SAFETY (every access below): 8 aligned lines and 16 scales per (group, block),
        // g < n / 16; rows r0..r0 + R of `y` exist (the caller's promise) with 8 words, one
        // scale and one sum per block.
        unsafe {
            let yd = y.d.as_ptr().add(r0 * y.blocks);
            for b in 0..cols.blocks {
                // The weights are stored plus 128.
                let sums = cols.block_sums::<R>(y, r0, g, b, 128);
                let dx = cols.scales(g * cols.blocks + b);
                for (t, (a, sumi)) in acc.iter_mut().zip(sums).enumerate() {
                    let scale = _mm512_mul_ps(dx, _mm512_set1_ps(*yd.add(t * y.blocks + b)));
                    *a = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sumi), *a);
                }
            }
            for (t, a) in acc.iter().enumerate() {
                // Row r0 + t < rows of the output, columns g*16..g*16+16 < n.
                _mm512_storeu_ps(out.add((r0 + t) * cols.n + g * LANES), *a);
            }
        }
    }

    /// The AVX2 kernel: rows `r0..r1` of group `g`, in tiles of up to [`ROW_TILE_AVX2`] rows.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn tile_avx2(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        self.0.prefetch_next_group(g);
        for (r, t) in avx2_row_tiles(r0, r1) {
            // SAFETY: the caller's promise, for the tile's rows.
            unsafe {
                match t {
                    1 => self.tile_rows_avx2::<1, 8>(y, r, g, out),
                    2 => self.tile_rows_avx2::<2, 4>(y, r, g, out),
                    3 => self.tile_rows_avx2::<3, 2>(y, r, g, out),
                    _ => self.tile_rows_avx2::<4, 2>(y, r, g, out),
                }
            }
        }
    }

    /// The AVX2 kernel for `R` rows from `r0` of group `g`, `L` of each output's 8
    /// accumulators at a time, the weights' signs moved onto the activations so
    /// `vpmaddubsw` cannot saturate.
    ///
    /// candle's order keeps 8 float accumulators per output (one per 4 bytes of a block): with
    /// one row they all fit AVX2's 16 registers, with several they do not. Each accumulator's
    /// chain over the blocks is independent of the others, so several rows run `L = 8 / R`
    /// (rounded to 2 or 4) of them at a time, in the pairs the final sum adds first
    /// (`acc_0 + acc_4`, then `acc_2 + acc_6`, ...): each weight vector is loaded and its
    /// signs taken once for the tile's `R` rows. One row at a time redid that work for every
    /// row: 42 GMAC/s for 16 rows of the 49,152-column output product, against 100 for the
    /// Q4_1 and Q5_0 kernels.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    pub(super) unsafe fn tile_rows_avx2<const R: usize, const L: usize>(
        &self,
        y: &Q8_0Rows,
        r0: usize,
        g: usize,
        out: *mut f32,
    ) {
        use std::arch::x86_64::*;
        /// The accumulators in the order the final sum pairs them.
        const ORDER: [usize; 8] = [0, 4, 2, 6, 1, 5, 3, 7];
        let cols = &self.0;
        let ones = _mm256_set1_epi16(1);
        let flip = _mm256_set1_epi8(-128);
        for half in 0..2 {
            // (acc_0 + acc_4, acc_2 + acc_6, acc_1 + acc_5, acc_3 + acc_7) per row.
            let mut pair_sums = [[_mm256_setzero_ps(); 4]; R];
            for pass in 0..8 / L {
                let lanes: [usize; L] = std::array::from_fn(|i| ORDER[pass * L + i]);
                let mut acc = [[_mm256_setzero_ps(); L]; R];
                // Each row's scales and words from raw pointers: with indices, the bounds
                // checks and their operands took the general registers and spilled.
                let row_d: [*const f32; R] = std::array::from_fn(|t| y.d[(r0 + t) * y.blocks..].as_ptr());
                let row_words: [*const i32; R] = std::array::from_fn(|t| y.words[(r0 + t) * y.blocks * 8..].as_ptr());
                for b in 0..cols.blocks {
                    let gb = g * cols.blocks + b;
                    if half == 0 && pass == 0 {
                        // The first pass streams the group from memory (as in Q4_1's kernel).
                        let ahead = cols.qs.as_ptr().wrapping_add((gb + PREFETCH_BLOCKS) * 8);
                        for line in 0..8 {
                            // A hint: harmless past the end.
                            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                        }
                    }
                    // SAFETY: the features are enabled; gb is in range.
                    let dx = unsafe { cols.half_scales(gb, half) };
                    // SAFETY: every lane < 8, half < 2. The stored bytes are the weights plus 128.
                    let w: [__m256i; L] = std::array::from_fn(|i| {
                        _mm256_xor_si256(unsafe { cols.half_vector(gb, lanes[i], half) }, flip)
                    });
                    let magnitude: [__m256i; L] = std::array::from_fn(|i| _mm256_abs_epi8(w[i]));
                    for (t, acc) in acc.iter_mut().enumerate() {
                        // SAFETY: row r0 + t < rows has `blocks` scales and `8 blocks` words
                        // (sliced above); b < blocks, every lane < 8.
                        let scale = _mm256_mul_ps(dx, _mm256_set1_ps(unsafe { *row_d[t].add(b) }));
                        for (i, a) in acc.iter_mut().enumerate() {
                            let x = _mm256_set1_epi32(unsafe { *row_words[t].add(b * 8 + lanes[i]) });
                            let p = _mm256_maddubs_epi16(magnitude[i], _mm256_sign_epi8(x, w[i]));
                            let sum = _mm256_madd_epi16(p, ones);
                            *a = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sum), *a);
                        }
                    }
                }
                for (sums, acc) in pair_sums.iter_mut().zip(&acc) {
                    for i in (0..L).step_by(2) {
                        sums[(pass * L + i) / 2] = _mm256_add_ps(acc[i], acc[i + 1]);
                    }
                }
            }
            for (t, [s04, s26, s15, s37]) in pair_sums.into_iter().enumerate() {
                let total = _mm256_add_ps(_mm256_add_ps(s04, s26), _mm256_add_ps(s15, s37));
                // SAFETY: row r0 + t < rows of the output, columns g*16 + half*8.. + 8 <= n.
                unsafe { _mm256_storeu_ps(out.add((r0 + t) * cols.n + g * LANES + half * 8), total) };
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn tile(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let rows = r1 - r0;
        let cols = &self.0;
        let mut acc = [[_mm512_setzero_ps(); 8]; ROW_TILE_Q8];
        for b in 0..cols.blocks {
            let gb = g * cols.blocks + b;
            // SAFETY: the features are enabled; gb is in range.
            let dx = unsafe { cols.scales(gb) };
            let mut scale = [_mm512_setzero_ps(); ROW_TILE_Q8];
            for (t, sc) in scale.iter_mut().enumerate().take(rows) {
                *sc = _mm512_mul_ps(dx, _mm512_set1_ps(y.d[(r0 + t) * y.blocks + b]));
            }
            #[allow(clippy::needless_range_loop)] // `l` indexes the weights, the bytes and `acc[t]`
            for l in 0..8 {
                // SAFETY: l < 8.
                let w = unsafe { cols.vector(gb, l) };
                for t in 0..rows {
                    let at = (r0 + t) * y.blocks + b;
                    let a = y.words[at * 8 + l];
                    let sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_set1_epi32(a));
                    let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(y.offset[at * 8 + l]));
                    acc[t][l] = _mm512_fmadd_ps(scale[t], _mm512_cvtepi32_ps(sum), acc[t][l]);
                }
            }
        }
        for (t, a) in acc.iter().enumerate().take(rows) {
            let s04 = _mm512_add_ps(a[0], a[4]);
            let s15 = _mm512_add_ps(a[1], a[5]);
            let s26 = _mm512_add_ps(a[2], a[6]);
            let s37 = _mm512_add_ps(a[3], a[7]);
            let total = _mm512_add_ps(_mm512_add_ps(s04, s26), _mm512_add_ps(s15, s37));
            // SAFETY: row r0 + t < rows of the output, columns g*16..g*16+16 < n.
            unsafe { _mm512_storeu_ps(out.add((r0 + t) * cols.n + g * LANES), total) };
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn tile(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("matmul checks the instruction set first")
    }
}
