//! Matrix products for x86 CPUs that give exactly candle's results, for the formats of the two
//! test models: Q4_1 (SmolLM2's layers), Q8_0 (SmolLM2's embedding, tied
//! to the output projection; Qwen2.5's output and value projections) and Q5_0 (most of
//! Qwen2.5's layers). Q4_K and Q6_K (Qwen2.5's down projections) are [`super::packed_k`]'s,
//! behind the same [`Packed`] type.
//!
//! candle multiplies Q4_1 and Q5_0 with portable scalar loops and Q8_0 with AVX2, one row and one
//! output at a time, re-reading and unpacking every weight block for every row. These kernels
//! repack the weights once at load (16 output columns side by side, so one `vpdpbusd`
//! advances 16 dot products by 4 products each) and, for a chunk of rows, unpack each weight
//! block once and multiply it with every row of the tile. That is what makes a fast-forward
//! chunk or a batch cost much less than its rows one by one.
//!
//! Two instruction sets run the same packed layout ([`Isa`]): AVX-512 VNNI, a 64-byte line per
//! vector and `vpdpbusd`; and AVX2 (every x86-64-v3 CPU, the build's baseline), each line as two
//! 32-byte halves of 8 columns, with `vpmaddubsw` (byte pairs to 16 bits) and `vpmaddwd` (to 32
//! bits) in place of `vpdpbusd`. Without either, candle's own kernels run. On AVX2 the 16-bit
//! sums stay below 2^15: a Q4_1 block adds at most 8 x 2 x 15 x 128 = 30,720, Q5_0 adds 4 pairs
//! of at most 2 x 31 x 128 before widening, and Q8_0 takes the signs off the weights onto the
//! activations first (`|w| <= 128`, `|y| <= 127`), as candle's AVX2 loop does.
//!
//! Both reproduce candle bit for bit, so the engine's reference tests hold whichever kernel
//! runs. Integer dot products are exact in any order; the float steps are the same IEEE
//! operations in the same order, one output per vector lane:
//!
//! ```text
//! Q4_1 (candle's scalar loop), for every block b:
//!     sum = sum + ((sumi_b as f32 * d_x) * d_y + m_x * s_y)        no fused multiply-add
//!     (computed as sum + fma(m_x, s_y, (sumi_b as f32 * d_x) * d_y): the same value, since
//!     m_x and s_y are f16 values, whose 11-bit significands multiply to at most 22 bits, so
//!     m_x * s_y is exact in f32 and the fused add rounds once, as candle's add does)
//! Q5_0 (candle's scalar loop), for every block b:
//!     sum = sum + (sumi_b as f32 * d_x) * d_y
//! Q8_0 (candle's AVX2 loop), 8 partial sums per output, lane l over bytes 4l..4l+4:
//!     acc_l = fma(d_x * d_y, sumi_{b,l} as f32, acc_l)
//!     out = ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7))
//! ```
//!
//! Activations are quantised exactly as candle quantises them (Q8_1 for Q4_1, Q8_0 for Q8_0).
//! `vpdpbusd` multiplies unsigned by signed bytes: Q4_1's nibbles are unsigned already; Q8_0's
//! signed weights are stored plus 128 and `128 x (sum of the 4 activations)` is subtracted,
//! Q5_0's plus 16 and `16 x (sum of the block's activations)`.

use half::f16;

use super::packed_k::PackedK;

/// Calls `$this.$method::<R>(args)` with `R` the row count `$rows` (1 to 8; more takes 8): a
/// fixed count keeps every accumulator of a tile in a register.
macro_rules! by_row_count {
    ($rows:expr, $this:ident.$method:ident($($arg:expr),*)) => {
        match $rows {
            1 => $this.$method::<1>($($arg),*),
            2 => $this.$method::<2>($($arg),*),
            3 => $this.$method::<3>($($arg),*),
            4 => $this.$method::<4>($($arg),*),
            5 => $this.$method::<5>($($arg),*),
            6 => $this.$method::<6>($($arg),*),
            7 => $this.$method::<7>($($arg),*),
            _ => $this.$method::<8>($($arg),*),
        }
    };
}

/// Values per Q4_1 / Q8_1 block.
const BLOCK: usize = 32;
/// Output columns side by side in the packed layout (one 512-bit lane each).
const LANES: usize = 16;
/// Rows per Q4_1 tile: 8 integer and 8 float accumulators fit the 32 vector registers beside
/// the unpacked weights, and each unpacked block serves twice as many rows as with 4.
const ROW_TILE_Q4: usize = 8;
/// Rows per AVX-512 Q8_0 tile in candle's order, which keeps 8 float accumulators per row.
const ROW_TILE_Q8: usize = 2;
/// Rows per AVX-512 Q5_0 tile: one integer and one float accumulator per row.
const ROW_TILE_Q5: usize = 8;
/// Rows per tile of the Q8_0 logits kernel: one integer and one float accumulator per row.
const ROW_TILE_Q8_LOGITS: usize = 8;
/// Rows per AVX2 tile (16 vector registers: 4 rows x 2 halves of integer sums, beside the
/// unpacked weights).
const ROW_TILE_AVX2: usize = 4;
/// Blocks per run of the AVX2 Q4_1 kernel's two passes (integer sums, then float steps):
/// 16 blocks of 4 rows' sums are 4 KB, beside the group's weights in L1.
const AVX2_RUN_BLOCKS: usize = 16;
/// How many blocks ahead the AVX2 Q4_1 and Q8_0 kernels ask for weights.
const PREFETCH_BLOCKS: usize = 4;

/// The instruction set a packed kernel runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F/BW with VNNI: 16 columns per vector, `vpdpbusd`.
    Avx512Vnni,
    /// AVX2 with FMA and F16C: 8 columns per vector, `vpmaddubsw` and `vpmaddwd`.
    Avx2,
}

impl Isa {
    /// Whether this CPU has the instructions.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            match self {
                Self::Avx512Vnni => has!("avx512f") && has!("avx512bw") && has!("avx512vnni"),
                Self::Avx2 => has!("avx2") && has!("fma") && has!("f16c"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }

    /// The kernels' instruction set on this CPU: the widest available, or a narrower one named
    /// by `DSPARK_CPU_KERNELS` (`avx2` or `none`, to compare them on one machine; read once).
    pub fn detect() -> Option<Self> {
        static CHOSEN: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let best = [Self::Avx512Vnni, Self::Avx2].into_iter().find(|i| i.available());
            match std::env::var("DSPARK_CPU_KERNELS").as_deref() {
                Ok("none") => None,
                Ok("avx2") if Self::Avx2.available() => Some(Self::Avx2),
                _ => best,
            }
        })
    }
}

/// A matrix repacked for one of the kernels.
pub enum Packed {
    /// Q4_1 weights.
    Q4_1(PackedQ4_1),
    /// Q8_0 weights.
    Q8_0(PackedQ8_0),
    /// Q5_0 weights.
    Q5_0(PackedQ5_0),
    /// Q4_K or Q6_K weights, in candle's tiles.
    K(PackedK),
}

impl Packed {
    /// Repacks a `[n, k]` matrix of `dtype` from its GGUF bytes; `None` for other formats or
    /// shapes the kernels do not take (`n` not a multiple of 16, `k` not a multiple of 32).
    pub fn new(dtype: candle_core::quantized::GgmlDType, raw: &[u8], n: usize, k: usize) -> Option<Self> {
        use candle_core::quantized::GgmlDType;
        match dtype {
            GgmlDType::Q4_1 => PackedQ4_1::new(raw, n, k).map(Self::Q4_1),
            GgmlDType::Q8_0 => PackedQ8_0::new(raw, n, k).map(Self::Q8_0),
            GgmlDType::Q5_0 => PackedQ5_0::new(raw, n, k).map(Self::Q5_0),
            GgmlDType::Q4K => PackedK::new(false, raw, n, k).map(Self::K),
            GgmlDType::Q6K => PackedK::new(true, raw, n, k).map(Self::K),
            _ => None,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Q4_1(p) => p.bytes(),
            Self::Q8_0(p) => p.bytes(),
            Self::Q5_0(p) => p.bytes(),
            Self::K(p) => p.bytes(),
        }
    }

    /// `x` (`rows x k`) times the matrix transposed; `None` without the CPU support.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Option<Vec<f32>> {
        self.matmul_with(Isa::detect()?, x, rows)
    }

    /// [`Packed::matmul`] with the kernels of `isa`; `None` where this CPU lacks it.
    pub fn matmul_with(&self, isa: Isa, x: &[f32], rows: usize) -> Option<Vec<f32>> {
        match self {
            Self::Q4_1(p) => p.matmul_with(isa, x, rows, None, 0.0),
            Self::Q8_0(p) => p.matmul_with(isa, x, rows, None, 0.0),
            Self::Q5_0(p) => p.matmul_with(isa, x, rows, None, 0.0),
            Self::K(p) => p.matmul_with(isa, x, rows, None, 0.0),
        }
    }

    /// [`Packed::matmul`] computing only the blocks of 16 output columns ([`GROUP_COLUMNS`])
    /// that `wanted(row, group)` asks for; the outputs of the others are `fill`. Each
    /// computed value is the one [`Packed::matmul`] gives: a column's sum does not depend
    /// on the other columns or rows. The engine's output projection uses it to compute only
    /// the logits of the tokens a constraint allows.
    pub fn matmul_selected(&self, x: &[f32], rows: usize, wanted: Selection, fill: f32) -> Option<Vec<f32>> {
        self.matmul_selected_with(Isa::detect()?, x, rows, wanted, fill)
    }

    /// [`Packed::matmul_selected`] with the kernels of `isa`.
    pub fn matmul_selected_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        wanted: Selection,
        fill: f32,
    ) -> Option<Vec<f32>> {
        match self {
            Self::Q4_1(p) => p.matmul_with(isa, x, rows, Some(wanted), fill),
            Self::Q8_0(p) => p.matmul_with(isa, x, rows, Some(wanted), fill),
            Self::Q5_0(p) => p.matmul_with(isa, x, rows, Some(wanted), fill),
            Self::K(p) => p.matmul_with(isa, x, rows, Some(wanted), fill),
        }
    }
}

impl Packed {
    /// The output projection: `x` (`rows x k`) times the matrix transposed, like
    /// [`Packed::matmul`] (or, with `wanted`, [`Packed::matmul_selected`]), but each sum may be
    /// taken in the kernel's fastest order instead of candle's. Logits are the end of the
    /// pass: no later product re-quantises them, so a different rounding of the last bits
    /// cannot grow the way it would inside the network. Where that order differs from
    /// candle's (Q8_0: [`PackedQ8_0`]'s logits kernels, the same values with AVX-512 VNNI and
    /// AVX2) each value is still a fixed function of its row and column, the same in any
    /// batch, any selection and either instruction set.
    /// `None` without the CPU support.
    pub fn logits(&self, x: &[f32], rows: usize, wanted: Option<Selection>, fill: f32) -> Option<Vec<f32>> {
        self.logits_with(Isa::detect()?, x, rows, wanted, fill)
    }

    /// [`Packed::logits`] with the kernels of `isa`.
    pub fn logits_with(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        wanted: Option<Selection>,
        fill: f32,
    ) -> Option<Vec<f32>> {
        match (self, wanted) {
            (Self::Q8_0(p), _) => p.logits_with(isa, x, rows, wanted, fill),
            (_, Some(wanted)) => self.matmul_selected_with(isa, x, rows, wanted, fill),
            (_, None) => self.matmul_with(isa, x, rows),
        }
    }
}

/// Output columns per block of [`Packed::matmul_selected`]: column group `g` is columns
/// `16 g..16 g + 16`.
pub const GROUP_COLUMNS: usize = LANES;

/// Which (row, column group) blocks of a product to compute; see [`Packed::matmul_selected`].
pub type Selection<'a> = &'a (dyn Fn(usize, usize) -> bool + Sync);

impl Packed {
    /// `x` times each matrix, as [`Packed::matmul`] gives them, in one parallel pass: the
    /// activations are quantised once and the column groups of all the matrices share the
    /// threads. `None` unless every matrix is Q4_1 with `x`'s inner dimension (or the CPU
    /// lacks the instructions).
    pub fn matmul_many(mats: &[&Packed], x: &[f32], rows: usize) -> Option<Vec<Vec<f32>>> {
        Self::matmul_many_with(Isa::detect()?, mats, x, rows)
    }

    /// [`Packed::matmul_many`] with the kernels of `isa`.
    pub fn matmul_many_with(isa: Isa, mats: &[&Packed], x: &[f32], rows: usize) -> Option<Vec<Vec<f32>>> {
        let q4: Vec<&PackedQ4_1> = mats
            .iter()
            .map(|m| match m {
                Packed::Q4_1(p) => Some(p),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let k = q4.first()?.k;
        if !isa.available() || q4.iter().any(|p| p.k != k) || x.len() != rows * k {
            return None;
        }
        let y = Q8_1Rows::quantize(isa, x, rows, k);
        // Every element is written by exactly one tile before the lengths are set, so the
        // outputs need no zeroing (it cost about 4% of a batch-16 step).
        let mut outs: Vec<Vec<f32>> = q4.iter().map(|p| Vec::with_capacity(rows * p.n)).collect();
        // Group `g` of the whole pass is group `g - first[i]` of matrix `i`.
        let mut first = Vec::with_capacity(q4.len());
        let mut groups = 0;
        for p in &q4 {
            first.push(groups);
            groups += p.n / LANES;
        }
        let addrs: Vec<usize> = outs.iter_mut().map(|o| o.as_mut_ptr() as usize).collect();
        let work = rows * k * q4.iter().map(|p| p.n).sum::<usize>();
        for_each_tile(rows, groups, PackedQ4_1::row_tile(isa), work, None, |r0, r1, g| {
            let i = first.partition_point(|&f| f <= g) - 1;
            // SAFETY: `isa` is available; each (row, group) output block of matrix `i` is
            // written by exactly one call, and the outputs outlive them all.
            unsafe { q4[i].tile(isa, &y, r0, r1, g - first[i], addrs[i] as *mut f32) }
        });
        for (out, p) in outs.iter_mut().zip(&q4) {
            // SAFETY: the tiles wrote all `rows * n` values of every output (above).
            unsafe { out.set_len(rows * p.n) };
        }
        Some(outs)
    }
}

/// Rows whose activations a pass of [`for_each_tile`] keeps beside one group's weights: 32
/// rows of a 1,536-wide product are 48 KB of 8-bit activations.
const PASS_ROWS: usize = 32;

/// Runs `tile(r0, r1, g)` over every (row tile, column group), spread over the backend's
/// threads ([`super::pool`]) by column groups; each call writes only its own outputs. With
/// `wanted`, only the (row, group) blocks it asks for: a tile is then a run of consecutive
/// wanted rows of one group.
pub(super) fn for_each_tile(
    rows: usize,
    groups: usize,
    row_tile: usize,
    work: usize,
    wanted: Option<Selection>,
    tile: impl Fn(usize, usize, usize) + Sync,
) {
    let threads = super::pool::threads().max(1);
    let per_item = groups.div_ceil(threads * 2).max(1);
    let items: Vec<(usize, usize)> = (0..groups).step_by(per_item).map(|g| (g, (g + per_item).min(groups))).collect();
    let run = |&(g0, g1): &(usize, usize)| match wanted {
        // Passes of up to `PASS_ROWS` rows; in each, group by group, every row tile of the
        // group in turn: the group's weights (a few KB) come from memory once per pass and
        // stay in L1 for the pass's other tiles, beside the pass's activations. With row
        // tiles outermost, a range of groups was re-read per row tile, from L3 where the range
        // outgrew L2 (the 30 MB output product: 8 passes for 16 rows).
        None => {
            let pass_rows = PASS_ROWS.max(row_tile);
            for pass in (0..rows).step_by(pass_rows) {
                let pass_end = pass.saturating_add(pass_rows).min(rows);
                for g in g0..g1 {
                    for r0 in (pass..pass_end).step_by(row_tile) {
                        tile(r0, (r0 + row_tile).min(pass_end), g);
                    }
                }
            }
        }
        Some(wanted) => {
            for g in g0..g1 {
                let mut r = 0;
                while r < rows {
                    if !wanted(r, g) {
                        r += 1;
                        continue;
                    }
                    let r0 = r;
                    while r < rows && r - r0 < row_tile && wanted(r, g) {
                        r += 1;
                    }
                    tile(r0, r, g);
                }
            }
        }
    };
    // Small products are not worth waking the pool for.
    if items.len() == 1 || work < 1 << 16 {
        items.iter().for_each(run);
    } else {
        super::pool::for_each(items.len(), |i| run(&items[i]));
    }
}

/// Rows `r0..r1` as AVX2 tiles of at most [`ROW_TILE_AVX2`] rows: (first row, rows).
fn avx2_row_tiles(r0: usize, r1: usize) -> impl Iterator<Item = (usize, usize)> {
    (r0..r1).step_by(ROW_TILE_AVX2).map(move |r| (r, (r1 - r).min(ROW_TILE_AVX2)))
}

/// A product's output buffer: left unwritten for a full product, whose tiles write every
/// value (zeroing it cost about 4% of a batch-16 step), or filled for a selected one.
pub(super) struct Outputs {
    values: Vec<f32>,
    len: usize,
}

impl Outputs {
    /// Room for `len` values, all `fill` when given.
    pub(super) fn new(len: usize, fill: Option<f32>) -> Self {
        match fill {
            Some(fill) => Self { values: vec![fill; len], len },
            None => Self { values: Vec::with_capacity(len), len },
        }
    }

    /// The address the tiles write to (an integer, so the closures that use it are `Sync`).
    pub(super) fn addr(&mut self) -> usize {
        self.values.as_mut_ptr() as usize
    }

    /// The values.
    ///
    /// # Safety
    /// Unless the buffer was filled, every one of the `len` values must have been written.
    pub(super) unsafe fn finish(mut self) -> Vec<f32> {
        // SAFETY: the caller's promise; a filled buffer has its length already.
        unsafe { self.values.set_len(self.len) };
        self.values
    }
}

/// One cache line. The packed weights are vectors of cache lines, so every 64-byte load is
/// aligned: a large `Vec<u8>` starts 16 bytes into a page, and then every vector load would
/// straddle two lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A zeroed vector of `n` cache lines.
fn lines(n: usize) -> Vec<Line> {
    vec![Line([0; 64]); n]
}

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
    blocks: usize,
    lines: Vec<Line>,
}

/// Cache lines per (group, block) of [`PackedQ4_1`].
const Q4_1_LINES: usize = 5;

/// Activations quantised to Q8_1, exactly as candle's `BlockQ8_1::from_float`.
struct Q8_1Rows {
    blocks: usize,
    /// The quantised values as little-endian 4-byte words (8 per block), the broadcast unit.
    words: Vec<i32>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// Whether this CPU runs the kernels (with one [`Isa`] or the other).
pub fn supported() -> bool {
    Isa::detect().is_some()
}

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
    fn matmul_with(&self, isa: Isa, x: &[f32], rows: usize, wanted: Option<Selection>, fill: f32) -> Option<Vec<f32>> {
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
    fn row_tile(isa: Isa) -> usize {
        match isa {
            Isa::Avx512Vnni => ROW_TILE_Q4,
            Isa::Avx2 => usize::MAX,
        }
    }

    /// Outputs of group `g` for rows `r0..r1` (at most [`Self::row_tile`]).
    #[cfg(target_arch = "x86_64")]
    unsafe fn tile(&self, isa: Isa, y: &Q8_1Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile_avx512(&self, y: &Q8_1Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe { by_row_count!(r1 - r0, self.tile_rows(y, r0, g, out)) }
    }

    /// [`Self::tile`] for `R` rows from `r0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile_rows<const R: usize>(&self, y: &Q8_1Rows, r0: usize, g: usize, out: *mut f32) {
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
    /// 1536x576 gate product, single-threaded; the `packed_kernels` bench, which also
    /// quantises the activations and streams the weights, 5-15%: `docs/benchmarks.md`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile_rows_avx2<const R: usize>(&self, y: &Q8_1Rows, r0: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile(&self, _: Isa, _: &Q8_1Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("matmul checks the instruction set first")
    }
}

/// Weights unpacked to one byte each (made unsigned by an offset), for the kernels whose
/// activations are Q8_0: for each group of 16 output columns and each block, eight 64-byte
/// vectors, one cache line each (lane `c` of vector `l` holds values `4l..4l+4` of column `c`'s
/// block); beside them the 16 scales per (group, block) as the file's f16.
struct ByteColumns {
    n: usize,
    k: usize,
    blocks: usize,
    qs: Vec<Line>,
    d: Vec<f16>,
}

impl ByteColumns {
    /// Repacks `[n, k]` blocks of `block_bytes` each; `unpack` turns one block into its scale
    /// and its 32 offset values.
    fn new(
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

    fn bytes(&self) -> usize {
        self.qs.len() * 64 + 2 * self.d.len()
    }

    /// Quantises `x` to Q8_0 and runs `tile` over every (row tile, column group), or only
    /// over the `wanted` blocks with the rest `fill`.
    #[allow(clippy::too_many_arguments)] // the product, its selection and its kernel
    fn matmul(
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
    fn prefetch_next_group(&self, g: usize) {
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
    unsafe fn vector(&self, gb: usize, l: usize) -> std::arch::x86_64::__m512i {
        // SAFETY: 8 aligned lines per (group, block); the caller keeps l < 8.
        unsafe { std::arch::x86_64::_mm512_load_si512(self.qs.as_ptr().add(gb * 8 + l).cast()) }
    }

    /// The 16 scales of (group, block) `gb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn scales(&self, gb: usize) -> std::arch::x86_64::__m512 {
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
    unsafe fn block_sums<const R: usize>(
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
    unsafe fn half_vector(&self, gb: usize, l: usize, half: usize) -> std::arch::x86_64::__m256i {
        use std::arch::x86_64::*;
        // SAFETY: 8 aligned lines per (group, block); the caller keeps l < 8, half < 2.
        unsafe { _mm256_load_si256(self.qs.as_ptr().add(gb * 8 + l).cast::<u8>().add(half * 32).cast()) }
    }

    /// The 8 scales of half `half` of (group, block) `gb`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn half_scales(&self, gb: usize, half: usize) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: 16 scales per (group, block); f16 to f32 is exact.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.d.as_ptr().add(gb * LANES + half * 8).cast())) }
    }

    /// Rows per call of a tile function: the AVX2 kernels take all the rows and tile them
    /// themselves, so one group's weights stay in L1 for every row tile.
    fn row_tile(isa: Isa, avx512: usize) -> usize {
        match isa {
            Isa::Avx512Vnni => avx512,
            Isa::Avx2 => usize::MAX,
        }
    }
}

/// Keeps the rows of a tile interleaved: passes every row's integer sum through one empty
/// `asm!` statement, so no row's next `vpdpbusd` can be scheduled before every row's last
/// one. Left alone, LLVM's scheduler emits each row's eight `vpdpbusd` (a chain of
/// dependent 5-cycle instructions) one row after the other to save registers, and the
/// out-of-order window then finds too few independent instructions: the same kernel in C
/// ran 145 against 175 GMAC/s per core, rows in a row against rows interleaved (Xeon,
/// Sapphire Rapids; `docs/benchmarks.md`). Emits no instruction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) fn interleave_rows<const R: usize>(sums: &mut [std::arch::x86_64::__m512i; R]) {
    use std::arch::asm;
    /// One empty statement over `*$s.add(i)` for each listed `i` (which must be 0, 1, ...:
    /// they name the operands in the template).
    macro_rules! through_one_statement {
        ($s:ident; $($i:literal)*) => {
            asm!(
                concat!("/*", $(" {", stringify!($i), "}",)* " */"),
                $(inout(zmm_reg) *$s.add($i),)*
                options(pure, nomem, nostack, preserves_flags)
            )
        };
    }
    let s = sums.as_mut_ptr();
    // SAFETY: each arm reads and writes only `sums[..R]` (its own R), and the statement is
    // empty: the values come back unchanged.
    unsafe {
        match R {
            1 => through_one_statement!(s; 0),
            2 => through_one_statement!(s; 0 1),
            3 => through_one_statement!(s; 0 1 2),
            4 => through_one_statement!(s; 0 1 2 3),
            5 => through_one_statement!(s; 0 1 2 3 4),
            6 => through_one_statement!(s; 0 1 2 3 4 5),
            7 => through_one_statement!(s; 0 1 2 3 4 5 6),
            _ => through_one_statement!(s; 0 1 2 3 4 5 6 7),
        }
    }
}

/// Q8_0 weights repacked for the kernel (stored plus 128).
pub struct PackedQ8_0(ByteColumns);

/// Activations quantised to Q8_0 (candle's `BlockQ8_0::from_float`), with `128 x` the sum of
/// every 4 consecutive values (the offset correction).
struct Q8_0Rows {
    blocks: usize,
    /// The quantised values as little-endian 4-byte words (8 per block).
    words: Vec<i32>,
    d: Vec<f32>,
    offset: Vec<i32>,
    /// The sum of each block's values (Q5_0's offset correction).
    sums: Vec<i32>,
}

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
    fn matmul_with(&self, isa: Isa, x: &[f32], rows: usize, wanted: Option<Selection>, fill: f32) -> Option<Vec<f32>> {
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
    fn logits_with(&self, isa: Isa, x: &[f32], rows: usize, wanted: Option<Selection>, fill: f32) -> Option<Vec<f32>> {
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
    unsafe fn tile_logits_avx2(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile_logits_avx2(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("logits_with checks the instruction set first")
    }

    /// [`Self::tile_logits_avx2`] for `R` rows from `r0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn tile_logits_rows_avx2<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile_logits(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe { by_row_count!(r1 - r0, self.tile_logits_rows(y, r0, g, out)) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn tile_logits(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("logits_with checks the instruction set first")
    }

    /// [`Self::tile_logits`] for `R` rows from `r0`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile_logits_rows<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile_avx2(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile_rows_avx2<const R: usize, const L: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("matmul checks the instruction set first")
    }
}

/// Q5_0 weights repacked for the kernel: the 5-bit values unpacked to bytes plus 16 (0..31).
/// candle multiplies Q5_0 with a scalar loop: `sum = sum + (sumi as f32 * d_x) * d_y` per
/// block, reproduced here one output per lane.
pub struct PackedQ5_0(ByteColumns);

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
    fn matmul_with(&self, isa: Isa, x: &[f32], rows: usize, wanted: Option<Selection>, fill: f32) -> Option<Vec<f32>> {
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
    unsafe fn tile_rows_avx2<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile(&self, y: &Q8_0Rows, r0: usize, r1: usize, g: usize, out: *mut f32) {
        // SAFETY: the caller's promise, passed on.
        unsafe { by_row_count!(r1 - r0, self.tile_rows(y, r0, g, out)) }
    }

    /// [`Self::tile`] for `R` rows from `r0`: one integer sum per row and block, the rows'
    /// chains interleaved ([`interleave_rows`]), then candle's float step.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[inline]
    unsafe fn tile_rows<const R: usize>(&self, y: &Q8_0Rows, r0: usize, g: usize, out: *mut f32) {
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
    unsafe fn tile(&self, _: &Q8_0Rows, _: usize, _: usize, _: usize, _: *mut f32) {
        unreachable!("matmul checks the instruction set first")
    }
}

impl Q8_0Rows {
    /// Quantises `rows x k` values as candle's `quantize_row_q8_0`: `d = amax / 127` (kept as
    /// f16), `q = round(x / d)`. With [`quantize_row`] (Q8_1's quantiser: the same `q`; a
    /// scalar loop here was 9% of a Qwen2.5 `engine-bench` run) and [`word_sums`], rows in
    /// parallel from 4 rows on.
    fn quantize(isa: Isa, x: &[f32], rows: usize, k: usize) -> Self {
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
            super::pool::for_each_mut(&mut parts, |_, part| part.take().into_iter().for_each(quantize_row));
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
type Q8_0RowParts<'a> = (((&'a [f32], &'a mut [i32]), &'a mut [f32]), (&'a mut [i32], &'a mut [i32]));

/// One row's input values and its quantised words, scales and sums, as [`Q8_1Rows::quantize`]
/// hands them out.
type RowParts<'a> = ((&'a [f32], &'a mut [i32]), (&'a mut [f32], &'a mut [f32]));

impl Q8_1Rows {
    /// Quantises `rows x k` values block by block, as candle's `quantize_row_q8_1` does:
    /// `d = amax / 127`, `q = round(x / d)`, `s = f16(sum q) * f16(d)` rounded to f16.
    fn quantize(isa: Isa, x: &[f32], rows: usize, k: usize) -> Self {
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
            super::pool::for_each_mut(&mut parts, |_, part| part.take().into_iter().for_each(quantize_row));
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
const SUM_RUN: usize = 64;

/// [`quantize_block`] for every block of a row `x`: the quantised values to `words` (8 per
/// block), each block's amax to `amax` and the sum of its quantised values to `sums`.
fn quantize_row(isa: Isa, x: &[f32], words: &mut [i32], amax: &mut [f32], sums: &mut [i32]) {
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
/// stores ([`super::int8_attention`]); `sums` is scratch of one per block.
pub(super) fn quantize_q8(x: &[f32], words: &mut [i32], scales: &mut [f32], sums: &mut [i32]) {
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
fn word_sums(isa: Isa, words: &[i32], sums: &mut [i32]) {
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
unsafe fn word_sums_avx512(words: &[i32], sums: &mut [i32]) {
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
unsafe fn quantize_row_avx512(x: &[f32], words: &mut [i32], amax: &mut [f32], sums: &mut [i32]) {
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
fn lane_totals(
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
fn quantize_block(isa: Isa, block: &[f32], words: &mut [i32]) -> (f32, i32) {
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

fn quantize_block_scalar(block: &[f32], words: &mut [i32]) -> (f32, i32) {
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
unsafe fn quantize_block_avx512(block: &[f32], words: &mut [i32]) -> (f32, i32) {
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
unsafe fn quantize_block_avx2(block: &[f32], words: &mut [i32]) -> (f32, i32) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
    use candle_core::{Device, Module, Tensor};

    /// Deterministic values in [-1, 1).
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

    /// The instruction sets this CPU runs; on x86-64 (the build's x86-64-v3 baseline) at least
    /// AVX2, so the comparisons below never pass by running nothing.
    fn isas() -> Vec<Isa> {
        let found: Vec<Isa> = [Isa::Avx512Vnni, Isa::Avx2].into_iter().filter(|i| i.available()).collect();
        #[cfg(target_arch = "x86_64")]
        assert!(!found.is_empty(), "an x86-64-v3 build runs on a CPU with AVX2");
        found
    }

    #[test]
    fn the_kernels_match_candle_bit_for_bit() {
        for isa in isas() {
            the_kernels_of(isa);
        }
    }

    fn the_kernels_of(isa: Isa) {
        for (dtype, (n, k)) in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q5_0]
            .into_iter()
            .flat_map(|d| [(16usize, 64usize), (64, 576), (192, 576), (48, 1472), (32, 896)].map(|s| (d, s)))
        {
            let w = Tensor::from_vec(values(n * k, n as u64 + k as u64), (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            let packed = Packed::new(dtype, &q.data().unwrap(), n, k).unwrap();
            let reference = QMatMul::from_qtensor(q).unwrap();
            // Up to several passes of `PASS_ROWS` rows, the last ones partial.
            for rows in [1usize, 2, 5, 8, 11, 14, 17, 37, 70] {
                let x = values(rows * k, rows as u64 * 31 + n as u64);
                let input = Tensor::from_slice(&x, (rows, k), &Device::Cpu).unwrap();
                let expected: Vec<f32> = reference.forward(&input).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let got = packed.matmul_with(isa, &x, rows).unwrap();
                let same = expected.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{isa:?} {dtype:?}, {rows} rows of [{n}, {k}]: {:?} vs {:?}", &expected[..4], &got[..4]);
            }
        }
    }

    #[test]
    fn vector_quantisation_equals_the_scalar_one() {
        // Ties (x.5 after scaling), zeros, negative ties, and random blocks.
        let mut blocks: Vec<Vec<f32>> = vec![vec![0.0; 32]];
        let mut ties: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) + 0.5).collect();
        ties[0] = 127.0;
        blocks.push(ties.clone());
        blocks.push(ties.iter().map(|v| -v).collect());
        for seed in 0..64 {
            blocks.push(values(32, seed));
        }
        for isa in isas() {
            for block in &blocks {
                let (mut a, mut b) = ([0i32; 8], [0i32; 8]);
                let got = quantize_block(isa, block, &mut a);
                let want = quantize_block_scalar(block, &mut b);
                assert_eq!((got.0.to_bits(), got.1, a), (want.0.to_bits(), want.1, b), "{isa:?} {block:?}");
            }
        }
    }

    #[test]
    fn rows_quantised_together_equal_their_blocks_one_by_one() {
        // Block counts around the 16 blocks of a vector pass and the runs of `SUM_RUN`, with
        // zero blocks, ties and the blocks of the test above spread over the row.
        for blocks in [1usize, 2, 15, 16, 17, 18, 31, 33, 46, 64, 65, 152] {
            let mut x = values(blocks * BLOCK, blocks as u64);
            for (i, block) in x.chunks_exact_mut(BLOCK).enumerate() {
                match i % 7 {
                    3 => block.fill(0.0),
                    5 => block.iter_mut().enumerate().for_each(|(j, v)| *v = (j as f32 - 16.0) + 0.5),
                    6 => block.iter_mut().enumerate().for_each(|(j, v)| *v = -((j as f32 - 16.0) + 0.5) * 1e-3),
                    _ => {}
                }
                if i % 7 == 5 {
                    block[0] = 127.0;
                }
            }
            let mut want_words = vec![0i32; 8 * blocks];
            let want: Vec<(u32, i32)> = x
                .chunks_exact(BLOCK)
                .zip(want_words.chunks_exact_mut(8))
                .map(|(block, words)| {
                    let (amax, sum) = quantize_block_scalar(block, words);
                    (amax.to_bits(), sum)
                })
                .collect();
            let want_word_sums: Vec<i32> =
                want_words.iter().map(|w| w.to_le_bytes().iter().map(|&b| b as i8 as i32).sum()).collect();
            for isa in isas() {
                let (mut words, mut amax, mut sums) = (vec![0i32; 8 * blocks], vec![0f32; blocks], vec![0i32; blocks]);
                quantize_row(isa, &x, &mut words, &mut amax, &mut sums);
                let got: Vec<(u32, i32)> = amax.iter().map(|a| a.to_bits()).zip(sums).collect();
                assert_eq!(got, want, "{isa:?}, {blocks} blocks: amax and sums");
                assert_eq!(words, want_words, "{isa:?}, {blocks} blocks: words");
                let mut word_total = vec![0i32; 8 * blocks];
                word_sums(isa, &words, &mut word_total);
                assert_eq!(word_total, want_word_sums, "{isa:?}, {blocks} blocks: word sums");
            }
        }
    }

    #[test]
    fn products_run_together_equal_products_run_alone() {
        for isa in isas() {
            products_together_and_alone(isa);
        }
    }

    fn products_together_and_alone(isa: Isa) {
        let k = 576;
        let mats: Vec<Packed> = [576usize, 192, 64]
            .iter()
            .map(|&n| {
                let w = Tensor::from_vec(values(n * k, n as u64), (n, k), &Device::Cpu).unwrap();
                let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
                Packed::new(GgmlDType::Q4_1, &q.data().unwrap(), n, k).unwrap()
            })
            .collect();
        for rows in [1usize, 3, 16] {
            let x = values(rows * k, rows as u64 + 7);
            let refs: Vec<&Packed> = mats.iter().collect();
            let together = Packed::matmul_many_with(isa, &refs, &x, rows).unwrap();
            for (m, got) in mats.iter().zip(&together) {
                let alone = m.matmul_with(isa, &x, rows).unwrap();
                assert!(alone.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows} rows");
            }
        }
        let q8 = {
            let w = Tensor::from_vec(values(16 * k, 3), (16, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
            Packed::new(GgmlDType::Q8_0, &q.data().unwrap(), 16, k).unwrap()
        };
        assert!(Packed::matmul_many_with(isa, &[&mats[0], &q8], &values(k, 1), 1).is_none(), "Q4_1 only");
    }

    #[test]
    fn selected_blocks_equal_the_full_product_and_the_rest_is_filled() {
        for isa in isas() {
            for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q5_0] {
                let (n, k) = (160, 576);
                let w = Tensor::from_vec(values(n * k, 11), (n, k), &Device::Cpu).unwrap();
                let q = QTensor::quantize(&w, dtype).unwrap();
                let packed = Packed::new(dtype, &q.data().unwrap(), n, k).unwrap();
                for rows in [1usize, 3, 9] {
                    let x = values(rows * k, rows as u64 + 5);
                    let full = packed.matmul_with(isa, &x, rows).unwrap();
                    // Every row wants a different pattern: none, all, and scattered groups
                    // (runs of wanted rows longer and shorter than a row tile).
                    let wanted = |r: usize, g: usize| match r % 3 {
                        0 => (r + g) % 4 == 1,
                        1 => true,
                        _ => r == 2 && g == 9,
                    };
                    let got = packed.matmul_selected_with(isa, &x, rows, &wanted, f32::NEG_INFINITY).unwrap();
                    assert_eq!(got.len(), full.len());
                    for (i, (a, b)) in full.iter().zip(&got).enumerate() {
                        let (r, g) = (i / n, (i % n) / GROUP_COLUMNS);
                        if wanted(r, g) {
                            assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} {dtype:?} row {r} column {}", i % n);
                        } else {
                            assert_eq!(*b, f32::NEG_INFINITY, "{isa:?} {dtype:?} row {r} column {}", i % n);
                        }
                    }
                }
            }
        }
    }

    /// The logits kernel's order ([`PackedQ8_0::logits_with`]), one value at a time.
    fn logits_specification(raw: &[u8], n: usize, k: usize, y: &Q8_0Rows, row: usize, col: usize) -> f32 {
        let blocks = k / BLOCK;
        let mut acc = 0f32;
        for b in 0..blocks {
            let block = &raw[(col * blocks + b) * 34..][..34];
            let dx = f16::from_le_bytes([block[0], block[1]]).to_f32();
            let at = row * blocks + b;
            let q = y.words[at * 8..][..8].iter().flat_map(|w| w.to_le_bytes());
            let sumi: i32 = block[2..].iter().zip(q).map(|(&w, q)| w as i8 as i32 * q as i8 as i32).sum();
            acc = (dx * y.d[at]).mul_add(sumi as f32, acc);
        }
        assert!(col < n);
        acc
    }

    #[test]
    fn the_logits_kernel_follows_its_order_and_stays_within_rounding_of_candle() {
        for isa in isas() {
            for (n, k) in [(16usize, 64usize), (64, 576), (192, 576), (48, 1472)] {
                let w = Tensor::from_vec(values(n * k, n as u64 * 3 + k as u64), (n, k), &Device::Cpu).unwrap();
                let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
                let raw = q.data().unwrap().to_vec();
                let packed = Packed::new(GgmlDType::Q8_0, &raw, n, k).unwrap();
                let reference = QMatMul::from_qtensor(q).unwrap();
                for rows in [1usize, 3, 8, 11, 17] {
                    let x = values(rows * k, rows as u64 * 17 + n as u64);
                    let input = Tensor::from_slice(&x, (rows, k), &Device::Cpu).unwrap();
                    let candle: Vec<f32> = reference.forward(&input).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                    let got = packed.logits_with(isa, &x, rows, None, 0.0).unwrap();
                    let y = Q8_0Rows::quantize(isa, &x, rows, k);
                    for (i, (&got, &candle)) in got.iter().zip(&candle).enumerate() {
                        let (row, col) = (i / n, i % n);
                        // Every instruction set computes the specification's values.
                        let want = logits_specification(&raw, n, k, &y, row, col);
                        assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} [{n}, {k}] row {row} column {col}");
                        // Only the summation order differs: a few float roundings of the
                        // blocks' partial sums, far below the logits' scale.
                        let scale = k as f32 * 1e-6 * (1.0 + candle.abs());
                        assert!((got - candle).abs() <= scale, "[{n}, {k}] row {row} column {col}: {got} vs {candle}");
                    }
                    // A selection computes the same values and fills the rest.
                    let wanted = |r: usize, g: usize| (r + g) % 3 != 1;
                    let selected = packed.logits_with(isa, &x, rows, Some(&wanted), f32::NEG_INFINITY).unwrap();
                    for (i, (&all, &some)) in got.iter().zip(&selected).enumerate() {
                        let (row, group) = (i / n, (i % n) / GROUP_COLUMNS);
                        let want = if wanted(row, group) { all } else { f32::NEG_INFINITY };
                        assert_eq!(some.to_bits(), want.to_bits(), "{isa:?} [{n}, {k}] row {row} column {}", i % n);
                    }
                    // Each row's values are the same whatever rows share its tiles.
                    if rows > 1 {
                        let alone = packed.logits_with(isa, &x[k..2 * k], 1, None, 0.0).unwrap();
                        assert_eq!(
                            alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            got[n..2 * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{isa:?} [{n}, {k}]: row 1 alone"
                        );
                    }
                }
            }
            // Other formats keep candle's order in the logits too.
            let (n, k) = (64, 576);
            let w = Tensor::from_vec(values(n * k, 5), (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
            let packed = Packed::new(GgmlDType::Q4_1, &q.data().unwrap(), n, k).unwrap();
            let x = values(3 * k, 9);
            let exact = packed.matmul_with(isa, &x, 3).unwrap();
            let logits = packed.logits_with(isa, &x, 3, None, 0.0).unwrap();
            assert!(exact.iter().zip(&logits).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} Q4_1");
        }
    }

    #[test]
    fn shapes_the_kernels_cannot_take_are_refused() {
        assert!(PackedQ4_1::new(&[0; 20 * 15], 15, 32).is_none());
        assert!(PackedQ4_1::new(&[0; 20 * 16], 16, 33).is_none());
        assert!(PackedQ4_1::new(&[0; 7], 16, 32).is_none());
        assert!(PackedQ8_0::new(&[0; 34 * 15], 15, 32).is_none());
        assert!(PackedQ8_0::new(&[0; 34 * 16 * 8], 16, 256).is_none(), "candle's own kernel takes k = 256n");
        assert!(Packed::new(GgmlDType::Q5K, &[0; 176 * 16], 16, 256).is_none());
    }
}
