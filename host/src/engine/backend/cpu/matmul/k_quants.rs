//! Q4_K and Q6_K products on the backend's threads ([`super::super::threads`]), several rows per weight
//! read, with candle's results bit for bit.
//!
//! candle-core 0.11.1 multiplies these formats on x86-64 through its repacked tiles (16 output
//! columns per 256-value superblock, the activations quantised to Q8_K) from two rows on, and
//! Q4_K from one row on. It runs them on its own barrier pool, four rows per weight read, and
//! a call made from the engine's threads waits for candle's worker to wake (on
//! Qwen2.5-0.5B the down projections, about a fifth of a serving step, of which the wait
//! was 8% of the samples). These kernels compute the same numbers on the backend's own threads:
//! - activations are quantised as candle's `BlockQ8K::from_float` does (`Q8KRows`);
//! - the integer sums of 4 weights times 4 activations are exact, so their order is free;
//! - the float steps are candle's, lane by lane, in candle's order: per superblock and
//!   sub-block, `acc = fma(float(isum), scale * d, acc)`, then for Q4_K
//!   `acc = -(min * (d * bsum)) + acc` fused, and for Q6_K the sum offset by `32 * bsum`
//!   first (the 6-bit values are stored unsigned). `scale` and `min` are the sub-block's
//!   6-bit (or 8-bit) factor times the superblock's f16 scale, in f32, made once at load.
//!
//! candle's AVX-512 and AVX2 tile kernels make the same float operations per lane, so either
//! kernel here reproduces both: the AVX2 one (two 8-column halves per 64-byte line,
//! `vpmaddubsw` + `vpmaddwd` for the integer sums) and the AVX-512 VNNI one (a line per
//! vector, one `vpdpbusd` per 4 values, 8 rows per weight read; `matmul` bench on a
//! Xeon, Sapphire Rapids: `cargo bench -p dspark-host --bench matmul`). [`matmul_reference`] is the same arithmetic in
//! plain Rust, the specification the tests hold both kernels and candle to. One row's result
//! never depends on the others, which is what the engine's batch-invariant mode needs.

#[cfg(target_arch = "x86_64")]
use super::tiles::{Isa, Outputs, Selection, for_each_tile, interleave_rows};

/// Values per superblock.
const QK_K: usize = 256;
/// Output columns per group (one tile).
const COLUMNS: usize = 16;
/// Rows per AVX2 kernel call: candle's tile width; more spills AVX2's 16 registers.
const ROW_TILE: usize = 4;
/// Rows per AVX-512 kernel call: 8 integer and 8 float accumulators beside the unpacked
/// weights fit AVX-512's 32 registers, and each weight line then serves twice the rows.
const ROW_TILE_AVX512: usize = 8;

/// The two formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Q4K,
    Q6K,
}

impl Format {
    /// Sub-blocks per superblock: 8 of 32 values (Q4_K), 16 of 16 (Q6_K).
    fn subs(self) -> usize {
        match self {
            Self::Q4K => 8,
            Self::Q6K => 16,
        }
    }
}

/// A Q4_K or Q6_K matrix repacked per (group of 16 columns, superblock): the weights as
/// unsigned bytes, four consecutive values of one column per 32-bit lane (Q4_K: two nibbles
/// per byte, values `8g..8g+4` low and `8g+4..8g+8` high in line `g`; Q6_K: one 6-bit value
/// per byte in line `g` holding values `4g..4g+4`), then each sub-block's 16 scales in f32
/// (and Q4_K's 16 minimums). One tile is 3,072 bytes for Q4_K (file: 2,304) and 5,120 for
/// Q6_K (file: 3,360); candle's tiles have the same size.
pub struct PackedK {
    format: Format,
    /// Output columns (weight rows).
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Weight bytes, `tile_bytes` per (group, superblock).
    qs: Vec<u8>,
    /// f32 factors, `subs * 16` (Q4_K: twice, scales then minimums) per (group, superblock).
    factors: Vec<f32>,
}

/// Bytes of one GGUF block.
const Q4K_BLOCK: usize = 144;
const Q6K_BLOCK: usize = 210;

/// The 6-bit scale and minimum of Q4_K sub-block `j` (ggml's `get_scale_min_k4`).
fn scale_min_q4k(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        ((scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4), (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4))
    }
}

fn f16_at(raw: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([raw[at], raw[at + 1]]).to_f32()
}

impl PackedK {
    /// Repacks a `[n, k]` Q4_K (`q6k` false) or Q6_K matrix from its GGUF bytes; `None` when
    /// the bytes do not match the shape or the shape has no tiles (`n % 16`, `k % 256`).
    pub fn new(q6k: bool, raw: &[u8], n: usize, k: usize) -> Option<Self> {
        let format = if q6k { Format::Q6K } else { Format::Q4K };
        let block = if q6k { Q6K_BLOCK } else { Q4K_BLOCK };
        if n == 0
            || k == 0
            || !n.is_multiple_of(COLUMNS)
            || !k.is_multiple_of(QK_K)
            || raw.len() != n * (k / QK_K) * block
        {
            return None;
        }
        let supers = k / QK_K;
        let tiles = n / COLUMNS * supers;
        let tile_bytes = Self::tile_bytes(format);
        let tile_factors = Self::tile_factors(format);
        let mut qs = vec![0u8; tiles * tile_bytes];
        let mut factors = vec![0f32; tiles * tile_factors];
        let mut values = [0u8; QK_K];
        for group in 0..n / COLUMNS {
            for s in 0..supers {
                let tile = group * supers + s;
                let qs = &mut qs[tile * tile_bytes..][..tile_bytes];
                let factors = &mut factors[tile * tile_factors..][..tile_factors];
                for c in 0..COLUMNS {
                    let col = group * COLUMNS + c;
                    let b = &raw[(col * supers + s) * block..][..block];
                    match format {
                        Format::Q4K => {
                            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                            for sub in 0..8 {
                                let (sc, mn) = scale_min_q4k(sub, &b[4..16]);
                                factors[sub * COLUMNS + c] = d * sc as f32;
                                factors[(8 + sub) * COLUMNS + c] = dmin * mn as f32;
                            }
                            // 32-byte chunk `q` holds values `64q..64q+32` in its low nibbles,
                            // `64q+32..64q+64` in its high ones.
                            for (q, chunk) in b[16..].chunks_exact(32).enumerate() {
                                for (j, &byte) in chunk.iter().enumerate() {
                                    values[64 * q + j] = byte & 0x0F;
                                    values[64 * q + 32 + j] = byte >> 4;
                                }
                            }
                            for g in 0..QK_K / 8 {
                                for j in 0..4 {
                                    qs[(g * COLUMNS + c) * 4 + j] = values[8 * g + j] | (values[8 * g + j + 4] << 4);
                                }
                            }
                        }
                        Format::Q6K => {
                            let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
                            let d = f16_at(b, 208);
                            for sub in 0..16 {
                                factors[sub * COLUMNS + c] = d * (scales[sub] as i8) as f32;
                            }
                            // Each half of 128 values: low 4 bits from `ql`, high 2 from `qh`.
                            for h in 0..2 {
                                let (ql, qh, v) = (&ql[64 * h..], &qh[32 * h..], &mut values[128 * h..]);
                                for j in 0..32 {
                                    v[j] = (ql[j] & 0x0F) | ((qh[j] & 3) << 4);
                                    v[j + 32] = (ql[j + 32] & 0x0F) | (((qh[j] >> 2) & 3) << 4);
                                    v[j + 64] = (ql[j] >> 4) | (((qh[j] >> 4) & 3) << 4);
                                    v[j + 96] = (ql[j + 32] >> 4) | (((qh[j] >> 6) & 3) << 4);
                                }
                            }
                            for g in 0..QK_K / 4 {
                                qs[(g * COLUMNS + c) * 4..][..4].copy_from_slice(&values[4 * g..4 * g + 4]);
                            }
                        }
                    }
                }
            }
        }
        Some(Self { format, n, k, qs, factors })
    }

    fn tile_bytes(format: Format) -> usize {
        match format {
            Format::Q4K => QK_K / 2 * COLUMNS,
            Format::Q6K => QK_K * COLUMNS,
        }
    }

    fn tile_factors(format: Format) -> usize {
        match format {
            Format::Q4K => 2 * 8 * COLUMNS,
            Format::Q6K => 16 * COLUMNS,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.qs.len() + 4 * self.factors.len()
    }

    /// `x` (`rows x k`) times the matrix transposed, computing only the column groups
    /// `wanted` asks for (the others are `fill`); `None` where the CPU lacks AVX2.
    pub fn matmul_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        wanted: Option<Selection>,
        fill: f32,
    ) -> Option<Vec<f32>> {
        // The AVX2 kernel needs AVX2 and FMA even where `isa` is AVX-512 (both are then
        // present); candle's float steps are the same per lane at either width (module docs).
        if !isa.available() || !Isa::Avx2.available() || x.len() != rows * self.k {
            return None;
        }
        let y = Q8KRows::quantize(x, rows, self.k);
        let mut out = Outputs::new(rows * self.n, wanted.map(|_| fill));
        let addr = out.addr();
        let row_tile = match isa {
            Isa::Avx512Vnni => ROW_TILE_AVX512,
            Isa::Avx2 => ROW_TILE,
        };
        for_each_tile(rows, self.n / COLUMNS, row_tile, rows * self.n * self.k, wanted, |r0, r1, g| {
            for r in (r0..r1).step_by(row_tile) {
                let tile_rows = (r1 - r).min(row_tile);
                // SAFETY: `isa`'s instructions are available (checked above); rows
                // `r..r + tile_rows` and group `g` are in range, and each (row, group) block
                // is written by one call.
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    match isa {
                        Isa::Avx512Vnni => self.tile_avx512(&y, r, tile_rows, g, addr as *mut f32),
                        Isa::Avx2 => self.tile_avx2(&y, r, tile_rows, g, addr as *mut f32),
                    }
                }
            }
        });
        // SAFETY: without a selection every (row, group) block was written by its tile.
        Some(unsafe { out.finish() })
    }

    /// Rows `r0..r0 + rows` (at most [`ROW_TILE`]) of column group `g` into `out`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2(&self, y: &Q8KRows, r0: usize, rows: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promises, passed on; a row count known at compile time keeps
        // every accumulator in a register.
        unsafe {
            match (self.format, rows) {
                (Format::Q4K, 1) => self.q4k_avx2::<1>(y, r0, g, out),
                (Format::Q4K, 2) => self.q4k_avx2::<2>(y, r0, g, out),
                (Format::Q4K, 3) => self.q4k_avx2::<3>(y, r0, g, out),
                (Format::Q4K, _) => self.q4k_avx2::<4>(y, r0, g, out),
                (Format::Q6K, 1) => self.q6k_avx2::<1>(y, r0, g, out),
                (Format::Q6K, 2) => self.q6k_avx2::<2>(y, r0, g, out),
                (Format::Q6K, 3) => self.q6k_avx2::<3>(y, r0, g, out),
                (Format::Q6K, _) => self.q6k_avx2::<4>(y, r0, g, out),
            }
        }
    }

    /// [`Self::tile_avx2`] for `R` rows of a Q4_K matrix.
    // `h` and `m` index the weight halves and rows of several arrays at once.
    #[allow(clippy::needless_range_loop)]
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn q4k_avx2<const R: usize>(&self, y: &Q8KRows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let nibbles = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for s in 0..self.k / QK_K {
            // SAFETY: superblock `s` of group `g` and rows `r0..r0 + R` are in range (the
            // caller's promise).
            unsafe {
                let SuperblockRows { qs, factors, words, sums, d } = self.superblock::<R>(y, r0, g, s);
                for sub in 0..8 {
                    let mut isum = [[_mm256_setzero_si256(); 2]; R];
                    for g4 in 0..4 {
                        let line = sub * 4 + g4;
                        let at = sub * 8 + g4 * 2;
                        for h in 0..2 {
                            let w = _mm256_loadu_si256(qs.add(line * 64 + h * 32).cast());
                            let lo = _mm256_and_si256(w, nibbles);
                            let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nibbles);
                            for m in 0..R {
                                isum[m][h] = dot(isum[m][h], lo, *words[m].add(at));
                                isum[m][h] = dot(isum[m][h], hi, *words[m].add(at + 1));
                            }
                        }
                    }
                    for h in 0..2 {
                        let scale = _mm256_loadu_ps(factors.add(sub * COLUMNS + h * 8));
                        let min = _mm256_loadu_ps(factors.add((8 + sub) * COLUMNS + h * 8));
                        for m in 0..R {
                            let bsum = (*sums[m].add(2 * sub) as i32 + *sums[m].add(2 * sub + 1) as i32) as f32;
                            let f = _mm256_cvtepi32_ps(isum[m][h]);
                            acc[m][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(scale, _mm256_set1_ps(d[m])), acc[m][h]);
                            acc[m][h] = _mm256_fnmadd_ps(min, _mm256_set1_ps(d[m] * bsum), acc[m][h]);
                        }
                    }
                }
            }
        }
        // SAFETY: rows `r0..r0 + R`, columns `16 g..16 g + 16` of the `rows x n` output.
        unsafe { self.store::<R>(&acc, r0, g, out) }
    }

    /// [`Self::tile_avx2`] for `R` rows of a Q6_K matrix.
    // `h` and `m` index the weight halves and rows of several arrays at once.
    #[allow(clippy::needless_range_loop)]
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn q6k_avx2<const R: usize>(&self, y: &Q8KRows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for s in 0..self.k / QK_K {
            // SAFETY: superblock `s` of group `g` and rows `r0..r0 + R` are in range (the
            // caller's promise).
            unsafe {
                let SuperblockRows { qs, factors, words, sums, d } = self.superblock::<R>(y, r0, g, s);
                for sub in 0..16 {
                    let mut isum = [[_mm256_setzero_si256(); 2]; R];
                    for g4 in 0..4 {
                        let line = sub * 4 + g4;
                        for h in 0..2 {
                            let w = _mm256_loadu_si256(qs.add(line * 64 + h * 32).cast());
                            for m in 0..R {
                                isum[m][h] = dot(isum[m][h], w, *words[m].add(line));
                            }
                        }
                    }
                    for h in 0..2 {
                        let scale = _mm256_loadu_ps(factors.add(sub * COLUMNS + h * 8));
                        for m in 0..R {
                            let offset = _mm256_set1_ps(32.0 * *sums[m].add(sub) as f32);
                            let f = _mm256_sub_ps(_mm256_cvtepi32_ps(isum[m][h]), offset);
                            acc[m][h] = _mm256_fmadd_ps(f, _mm256_mul_ps(scale, _mm256_set1_ps(d[m])), acc[m][h]);
                        }
                    }
                }
            }
        }
        // SAFETY: as in `q4k_avx2`.
        unsafe { self.store::<R>(&acc, r0, g, out) }
    }

    /// Rows `r0..r0 + rows` (at most [`ROW_TILE_AVX512`]) of column group `g` into `out`,
    /// with AVX-512 VNNI.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile_avx512(&self, y: &Q8KRows, r0: usize, rows: usize, g: usize, out: *mut f32) {
        macro_rules! by_rows {
            ($method:ident) => {
                match rows {
                    1 => self.$method::<1>(y, r0, g, out),
                    2 => self.$method::<2>(y, r0, g, out),
                    3 => self.$method::<3>(y, r0, g, out),
                    4 => self.$method::<4>(y, r0, g, out),
                    5 => self.$method::<5>(y, r0, g, out),
                    6 => self.$method::<6>(y, r0, g, out),
                    7 => self.$method::<7>(y, r0, g, out),
                    _ => self.$method::<8>(y, r0, g, out),
                }
            };
        }
        // SAFETY: the caller's promises, passed on.
        unsafe {
            match self.format {
                Format::Q4K => by_rows!(q4k_avx512),
                Format::Q6K => by_rows!(q6k_avx512),
            }
        }
    }

    /// [`Self::tile_avx512`] for `R` rows of a Q4_K matrix: [`Self::q4k_avx2`]'s operations,
    /// each line of 16 columns in one vector.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn q4k_avx512<const R: usize>(&self, y: &Q8KRows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let nibbles = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); R];
        for s in 0..self.k / QK_K {
            // SAFETY: superblock `s` of group `g` and rows `r0..r0 + R` are in range (the
            // caller's promise).
            unsafe {
                let SuperblockRows { qs, factors, words, sums, d } = self.superblock::<R>(y, r0, g, s);
                for sub in 0..8 {
                    let mut isum = [_mm512_setzero_si512(); R];
                    for g4 in 0..4 {
                        let line = sub * 4 + g4;
                        let at = sub * 8 + g4 * 2;
                        let w = _mm512_loadu_si512(qs.add(line * 64).cast());
                        let lo = _mm512_and_si512(w, nibbles);
                        let hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), nibbles);
                        for (m, isum) in isum.iter_mut().enumerate() {
                            *isum = _mm512_dpbusd_epi32(*isum, lo, _mm512_set1_epi32(*words[m].add(at)));
                            *isum = _mm512_dpbusd_epi32(*isum, hi, _mm512_set1_epi32(*words[m].add(at + 1)));
                        }
                        interleave_rows(&mut isum);
                    }
                    let scale = _mm512_loadu_ps(factors.add(sub * COLUMNS));
                    let min = _mm512_loadu_ps(factors.add((8 + sub) * COLUMNS));
                    for (m, (acc, isum)) in acc.iter_mut().zip(isum).enumerate() {
                        let bsum = (*sums[m].add(2 * sub) as i32 + *sums[m].add(2 * sub + 1) as i32) as f32;
                        let f = _mm512_cvtepi32_ps(isum);
                        *acc = _mm512_fmadd_ps(f, _mm512_mul_ps(scale, _mm512_set1_ps(d[m])), *acc);
                        *acc = _mm512_fnmadd_ps(min, _mm512_set1_ps(d[m] * bsum), *acc);
                    }
                }
            }
        }
        // SAFETY: as in `q4k_avx2`.
        unsafe { self.store_avx512::<R>(&acc, r0, g, out) }
    }

    /// [`Self::tile_avx512`] for `R` rows of a Q6_K matrix: [`Self::q6k_avx2`]'s operations,
    /// each line of 16 columns in one vector.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn q6k_avx512<const R: usize>(&self, y: &Q8KRows, r0: usize, g: usize, out: *mut f32) {
        use std::arch::x86_64::*;
        let mut acc = [_mm512_setzero_ps(); R];
        for s in 0..self.k / QK_K {
            // SAFETY: superblock `s` of group `g` and rows `r0..r0 + R` are in range (the
            // caller's promise).
            unsafe {
                let SuperblockRows { qs, factors, words, sums, d } = self.superblock::<R>(y, r0, g, s);
                for sub in 0..16 {
                    let mut isum = [_mm512_setzero_si512(); R];
                    for g4 in 0..4 {
                        let line = sub * 4 + g4;
                        let w = _mm512_loadu_si512(qs.add(line * 64).cast());
                        for (m, isum) in isum.iter_mut().enumerate() {
                            *isum = _mm512_dpbusd_epi32(*isum, w, _mm512_set1_epi32(*words[m].add(line)));
                        }
                        interleave_rows(&mut isum);
                    }
                    let scale = _mm512_loadu_ps(factors.add(sub * COLUMNS));
                    for (m, (acc, isum)) in acc.iter_mut().zip(isum).enumerate() {
                        let offset = _mm512_set1_ps(32.0 * *sums[m].add(sub) as f32);
                        let f = _mm512_sub_ps(_mm512_cvtepi32_ps(isum), offset);
                        *acc = _mm512_fmadd_ps(f, _mm512_mul_ps(scale, _mm512_set1_ps(d[m])), *acc);
                    }
                }
            }
        }
        // SAFETY: as in `q4k_avx2`.
        unsafe { self.store_avx512::<R>(&acc, r0, g, out) }
    }

    /// Where the kernels read superblock `s` of column group `g` and of rows `r0..r0 + R`.
    ///
    /// # Safety
    /// `g`, `s` and rows `r0..r0 + R` of `y` are in range.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn superblock<const R: usize>(&self, y: &Q8KRows, r0: usize, g: usize, s: usize) -> SuperblockRows<R> {
        let supers = self.k / QK_K;
        let tile = g * supers + s;
        let (tile_bytes, tile_factors) = (Self::tile_bytes(self.format), Self::tile_factors(self.format));
        // SAFETY: the caller's promise: the tile and the rows' superblock exist.
        unsafe {
            SuperblockRows {
                qs: self.qs.as_ptr().add(tile * tile_bytes),
                factors: self.factors.as_ptr().add(tile * tile_factors),
                words: std::array::from_fn(|m| y.words_at(r0 + m, s)),
                sums: std::array::from_fn(|m| y.sums_at(r0 + m, s)),
                d: std::array::from_fn(|m| *y.d.get_unchecked((r0 + m) * supers + s)),
            }
        }
    }

    /// Writes `R` rows' accumulators to columns `16 g..16 g + 16` of rows `r0..r0 + R`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn store_avx512<const R: usize>(
        &self,
        acc: &[std::arch::x86_64::__m512; R],
        r0: usize,
        g: usize,
        out: *mut f32,
    ) {
        for (m, acc) in acc.iter().enumerate() {
            // SAFETY: the caller's promise that these outputs are in range and its own.
            unsafe { std::arch::x86_64::_mm512_storeu_ps(out.add((r0 + m) * self.n + g * COLUMNS), *acc) };
        }
    }

    /// Writes `R` rows' accumulators to columns `16 g..16 g + 16` of rows `r0..r0 + R`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn store<const R: usize>(
        &self,
        acc: &[[std::arch::x86_64::__m256; 2]; R],
        r0: usize,
        g: usize,
        out: *mut f32,
    ) {
        use std::arch::x86_64::*;
        for (m, acc) in acc.iter().enumerate() {
            // SAFETY: the caller's promise that these outputs are in range and its own.
            unsafe {
                let at = out.add((r0 + m) * self.n + g * COLUMNS);
                _mm256_storeu_ps(at, acc[0]);
                _mm256_storeu_ps(at.add(8), acc[1]);
            }
        }
    }
}

/// What a kernel reads for one superblock ([`PackedK::superblock`]): the tile's weight bytes
/// and f32 factors, and each row's quantised words, sums of 16 and scale.
#[cfg(target_arch = "x86_64")]
struct SuperblockRows<const R: usize> {
    qs: *const u8,
    factors: *const f32,
    words: [*const i32; R],
    sums: [*const i16; R],
    d: [f32; R],
}

/// `acc` plus the sums of each lane's four unsigned weight bytes times the four activation
/// bytes of `a`: `vpmaddubsw` + `vpmaddwd` standing in for `vpdpbusd` (pairs are summed in 16
/// bits, at most 2 * 63 * 128, so nothing saturates).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
fn dot(acc: std::arch::x86_64::__m256i, w: std::arch::x86_64::__m256i, a: i32) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(a));
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// Activations quantised to Q8_K, exactly as candle's `BlockQ8K::from_float`: per superblock
/// the value of largest magnitude `max` (the first such), `iscale = -127 / max`, each value
/// `round(iscale * x)` clamped to `[-128, 127]`, `d = 1 / iscale`, and the sums of each run
/// of 16 quantised values.
struct Q8KRows {
    supers: usize,
    /// The quantised values as little-endian 4-byte words (64 per superblock).
    words: Vec<i32>,
    d: Vec<f32>,
    sums: Vec<i16>,
}

/// One superblock's input values, and its words, scale and sums to write.
type BlockParts<'a> = ((&'a [f32], &'a mut [i32]), (&'a mut f32, &'a mut [i16]));

impl Q8KRows {
    fn quantize(x: &[f32], rows: usize, k: usize) -> Self {
        let supers = k / QK_K;
        let blocks = rows * supers;
        let mut words = vec![0i32; blocks * QK_K / 4];
        let mut d = vec![0f32; blocks];
        let mut sums = vec![0i16; blocks * 16];
        let quantize_block = |((x, words), (d, sums)): BlockParts| {
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in x {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax == 0.0 {
                *d = 0.0;
                return; // words and sums stay zero
            }
            let iscale = -127f32 / max;
            #[cfg(target_arch = "x86_64")]
            if Isa::Avx512Vnni.available() {
                // SAFETY: AVX-512 was checked; 256 values, 64 words and 16 sums.
                unsafe { round_superblock_avx512(x, iscale, words, sums) };
                *d = 1.0 / iscale;
                return;
            }
            round_superblock(x, iscale, words, sums);
            *d = 1.0 / iscale;
        };
        let parts =
            x.chunks_exact(QK_K).zip(words.chunks_exact_mut(QK_K / 4)).zip(d.iter_mut().zip(sums.chunks_exact_mut(16)));
        if rows > 1 {
            // Runs of 8 superblocks: one is too little work to hand out alone.
            let mut parts: Vec<Option<BlockParts>> = parts.map(Some).collect();
            super::super::threads::for_each_chunk_mut(&mut parts, 8, |_, run| {
                run.iter_mut().filter_map(Option::take).for_each(quantize_block);
            });
        } else {
            parts.for_each(quantize_block);
        }
        Self { supers, words, d, sums }
    }

    /// The first of superblock `s` of row `r`'s 64 words (the caller keeps both in range).
    fn words_at(&self, r: usize, s: usize) -> *const i32 {
        self.words.as_ptr().wrapping_add((r * self.supers + s) * QK_K / 4)
    }

    /// The first of superblock `s` of row `r`'s 16 sums (the caller keeps both in range).
    fn sums_at(&self, r: usize, s: usize) -> *const i16 {
        self.sums.as_ptr().wrapping_add((r * self.supers + s) * 16)
    }

    /// Superblock `s` of row `r` as 64 words.
    fn words(&self, r: usize, s: usize) -> &[i32] {
        &self.words[(r * self.supers + s) * QK_K / 4..][..QK_K / 4]
    }

    /// The 16 sums of superblock `s` of row `r`.
    fn bsums(&self, r: usize, s: usize) -> &[i16] {
        &self.sums[(r * self.supers + s) * 16..][..16]
    }
}

/// A superblock's quantised values `round(iscale * x)` (half away from zero, as `f32::round`)
/// clamped to `[-128, 127]`, as little-endian words, and the sums of each run of 16: candle's
/// `BlockQ8K::from_float` after its scale, value by value.
fn round_superblock(x: &[f32], iscale: f32, words: &mut [i32], sums: &mut [i16]) {
    let mut q = [0i8; QK_K];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (iscale * v).round().clamp(-128.0, 127.0) as i8;
    }
    for (word, q) in words.iter_mut().zip(q.chunks_exact(4)) {
        *word = i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
    }
    for (sum, q) in sums.iter_mut().zip(q.chunks_exact(16)) {
        *sum = q.iter().map(|&v| v as i32).sum::<i32>() as i16;
    }
}

/// [`round_superblock`] 16 values at a time, bit for bit: the product is the same, rounding
/// half away from zero is truncation plus one step where the part cut off is at least a half
/// (exact: that difference is exact in f32), and the clamp keeps a NaN a NaN (`vminps`
/// returns its second operand then), which converts to 0 as `as i8` does. `f32::round` in a
/// loop is a libm call per value: 6% of a Qwen2.5 `engine-bench` run.
///
/// # Safety
/// The CPU has AVX-512 F and BW; `x` has 256 values, `words` 64 and `sums` 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn round_superblock_avx512(x: &[f32], iscale: f32, words: &mut [i32], sums: &mut [i16]) {
    use std::arch::x86_64::*;
    debug_assert!(x.len() == QK_K && words.len() == QK_K / 4 && sums.len() == 16);
    let (scale, half, one, sign) =
        (_mm512_set1_ps(iscale), _mm512_set1_ps(0.5), _mm512_set1_ps(1.0), _mm512_set1_ps(-0.0));
    let (low, high) = (_mm512_set1_ps(-128.0), _mm512_set1_ps(127.0));
    let bytes = words.as_mut_ptr().cast::<u8>();
    for (run, sum) in sums.iter_mut().enumerate() {
        // SAFETY: run < 16: values 16 run.. and bytes 16 run.. are in range.
        unsafe {
            let y = _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr().add(16 * run)), scale);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
            let away = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(_mm512_abs_ps(_mm512_sub_ps(y, t)), half);
            // (Integer and/or: the float ones are AVX-512 DQ, not enabled here.)
            let step = _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_castps_si512(one),
                _mm512_and_si512(_mm512_castps_si512(y), _mm512_castps_si512(sign)),
            ));
            let r = _mm512_max_ps(low, _mm512_min_ps(high, _mm512_mask_add_ps(t, away, t, step)));
            let q = _mm512_cvttps_epi32(r);
            _mm_storeu_si128(bytes.add(16 * run).cast(), _mm512_cvtepi32_epi8(q));
            *sum = _mm512_reduce_add_epi32(q) as i16;
        }
    }
}

/// The kernel's arithmetic in plain Rust, one value at a time (the specification the tests
/// hold the kernel and candle to): `rows x n` outputs.
pub fn matmul_reference(packed: &PackedK, x: &[f32], rows: usize) -> Vec<f32> {
    let (n, k, format) = (packed.n, packed.k, packed.format);
    let supers = k / QK_K;
    let y = Q8KRows::quantize(x, rows, k);
    let (tile_bytes, tile_factors) = (PackedK::tile_bytes(format), PackedK::tile_factors(format));
    let mut out = vec![0f32; rows * n];
    for r in 0..rows {
        for col in 0..n {
            let (g, c) = (col / COLUMNS, col % COLUMNS);
            let mut acc = 0f32;
            for s in 0..supers {
                let tile = g * supers + s;
                let qs = &packed.qs[tile * tile_bytes..][..tile_bytes];
                let factors = &packed.factors[tile * tile_factors..][..tile_factors];
                let a: Vec<i8> = y.words(r, s).iter().flat_map(|w| w.to_le_bytes()).map(|b| b as i8).collect();
                let (d, bsums) = (y.d[r * supers + s], y.bsums(r, s));
                for sub in 0..format.subs() {
                    let scale = factors[sub * COLUMNS + c];
                    let isum: i32 = match format {
                        Format::Q4K => (0..32)
                            .map(|i| {
                                let (line, j) = (sub * 4 + i / 8, i % 8);
                                let byte = qs[(line * COLUMNS + c) * 4 + j % 4];
                                let w = if j < 4 { byte & 0x0F } else { byte >> 4 };
                                w as i32 * a[sub * 32 + i] as i32
                            })
                            .sum(),
                        Format::Q6K => (0..16)
                            .map(|i| qs[((sub * 4 + i / 4) * COLUMNS + c) * 4 + i % 4] as i32 * a[sub * 16 + i] as i32)
                            .sum(),
                    };
                    match format {
                        Format::Q4K => {
                            let min = factors[(8 + sub) * COLUMNS + c];
                            let bsum = (bsums[2 * sub] as i32 + bsums[2 * sub + 1] as i32) as f32;
                            acc = (isum as f32).mul_add(scale * d, acc);
                            acc = (-min).mul_add(d * bsum, acc);
                        }
                        Format::Q6K => {
                            let f = isum as f32 - 32.0 * bsums[sub] as f32;
                            acc = f.mul_add(scale * d, acc);
                        }
                    }
                }
            }
            out[r * n + col] = acc;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::backend::test_values as values;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// The kernel, the plain-Rust specification and candle's tiles (reached with two or more
    /// rows) give the same bits, for both formats, for row counts on either side of the row
    /// tile and of candle's AMX threshold, with an all-zero row (`d = 0`) among them.
    #[test]
    fn the_kernel_reproduces_candle_bit_for_bit() {
        let isas: Vec<Isa> = [Isa::Avx512Vnni, Isa::Avx2].into_iter().filter(|i| i.available()).collect();
        if isas.is_empty() {
            eprintln!("no packed kernels on this CPU; nothing to compare");
            return;
        }
        for isa in isas {
            the_kernel_of_reproduces_candle(isa);
        }
    }

    fn the_kernel_of_reproduces_candle(isa: Isa) {
        for (dtype, q6k) in [(GgmlDType::Q4K, false), (GgmlDType::Q6K, true)] {
            for (n, k) in [(32usize, 512usize), (48, 768)] {
                let w = Tensor::from_vec(values(n * k, 7), (n, k), &Device::Cpu).unwrap();
                let q = QTensor::quantize(&w, dtype).unwrap();
                let packed = PackedK::new(q6k, &q.data().unwrap(), n, k).unwrap();
                let candle = QMatMul::from_qtensor(q).unwrap();
                for rows in [2usize, 3, 5, 8, 9, 17, 31] {
                    let mut x = values(rows * k, 13 + rows as u32);
                    x[k..2 * k].fill(0.0);
                    let got = packed.matmul_with(isa, &x, rows, None, 0.0).unwrap();
                    let spec = matmul_reference(&packed, &x, rows);
                    let input = Tensor::from_slice(&x, (rows, k), &Device::Cpu).unwrap();
                    let want = candle.forward(&input).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&spec),
                        "{isa:?} {dtype:?} {n}x{k}, {rows} rows: kernel vs specification"
                    );
                    assert_eq!(bits(&spec), bits(&want), "{dtype:?} {n}x{k}, {rows} rows: specification vs candle");
                }
                // One row: candle's Q4_K takes the tiles, so it must agree too.
                if !q6k {
                    let x = values(k, 99);
                    let input = Tensor::from_slice(&x, (1, k), &Device::Cpu).unwrap();
                    let want = candle.forward(&input).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    assert_eq!(packed.matmul_with(isa, &x, 1, None, 0.0).unwrap(), want, "{isa:?} Q4_K, one row");
                }
            }
        }
    }

    /// The vector rounding of a superblock equals the scalar one: ties (x.5 after scaling),
    /// values at the clamp, zeros, a NaN and random superblocks.
    #[test]
    fn vector_rounding_equals_the_scalar_one() {
        if !Isa::Avx512Vnni.available() {
            eprintln!("no AVX-512 on this CPU; nothing to compare");
            return;
        }
        let mut cases: Vec<(Vec<f32>, f32)> = vec![(vec![0.0; QK_K], 1.0)];
        let ties: Vec<f32> = (0..QK_K).map(|i| (i as f32 - 128.0) + 0.5).collect();
        cases.push((ties.clone(), 1.0));
        cases.push((ties.iter().map(|v| -v).collect(), 1.0));
        cases.push((ties.clone(), 1.01));
        let mut nan = values(QK_K, 5);
        nan[17] = f32::NAN;
        cases.push((nan, 100.0));
        for seed in 0..32 {
            let x = values(QK_K, seed);
            let max = x.iter().fold(0f32, |m, v| if m.abs() < v.abs() { *v } else { m });
            cases.push((x, -127.0 / max));
        }
        for (x, iscale) in &cases {
            let (mut wa, mut sa) = ([0i32; QK_K / 4], [0i16; 16]);
            let (mut wb, mut sb) = ([0i32; QK_K / 4], [0i16; 16]);
            // SAFETY: AVX-512 was checked; the sizes are the function's.
            unsafe { round_superblock_avx512(x, *iscale, &mut wa, &mut sa) };
            round_superblock(x, *iscale, &mut wb, &mut sb);
            assert_eq!((wa, sa), (wb, sb), "iscale {iscale}, {x:?}");
        }
    }

    /// Shapes without tiles and byte counts that do not match are refused.
    #[test]
    fn shapes_without_tiles_are_refused() {
        assert!(PackedK::new(false, &vec![0; 20 * 2 * Q4K_BLOCK], 20, 512).is_none());
        assert!(PackedK::new(true, &vec![0; 16 * Q6K_BLOCK], 16, 256 + 32).is_none());
        assert!(PackedK::new(true, &vec![0; 16 * Q6K_BLOCK - 1], 16, 256).is_none());
        assert!(PackedK::new(true, &vec![0; 16 * Q6K_BLOCK], 16, 256).is_some());
    }
}
