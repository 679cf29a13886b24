//! What every packed kernel shares: the block and tile sizes, the instruction set ([`Isa`]),
//! the aligned cache lines the weights are repacked into, the output buffer, and the loop that
//! spreads (row tile, column group) blocks over the backend's threads ([`for_each_tile`]).

/// Values per Q4_1 / Q8_1 block.
pub(super) const BLOCK: usize = 32;
/// Output columns side by side in the packed layout (one 512-bit lane each).
pub(super) const LANES: usize = 16;
/// Rows per Q4_1 tile: 8 integer and 8 float accumulators fit the 32 vector registers beside
/// the unpacked weights, and each unpacked block serves twice as many rows as with 4.
pub(super) const ROW_TILE_Q4: usize = 8;
/// Rows per AVX-512 Q8_0 tile in candle's order, which keeps 8 float accumulators per row.
pub(super) const ROW_TILE_Q8: usize = 2;
/// Rows per AVX-512 Q5_0 tile: one integer and one float accumulator per row.
pub(super) const ROW_TILE_Q5: usize = 8;
/// Rows per tile of the Q8_0 logits kernel: one integer and one float accumulator per row.
pub(super) const ROW_TILE_Q8_LOGITS: usize = 8;
/// Rows per AVX2 tile (16 vector registers: 4 rows x 2 halves of integer sums, beside the
/// unpacked weights).
pub(super) const ROW_TILE_AVX2: usize = 4;
/// Blocks per run of the AVX2 Q4_1 kernel's two passes (integer sums, then float steps):
/// 16 blocks of 4 rows' sums are 4 KB, beside the group's weights in L1.
pub(super) const AVX2_RUN_BLOCKS: usize = 16;
/// How many blocks ahead the AVX2 Q4_1 and Q8_0 kernels ask for weights.
pub(super) const PREFETCH_BLOCKS: usize = 4;

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

/// Output columns per block of [`super::Packed::matmul_selected`]: column group `g` is columns
/// `16 g..16 g + 16`.
pub const GROUP_COLUMNS: usize = LANES;

/// Which (row, column group) blocks of a product to compute; see [`super::Packed::matmul_selected`].
pub type Selection<'a> = &'a (dyn Fn(usize, usize) -> bool + Sync);

/// Rows whose activations a pass of [`for_each_tile`] keeps beside one group's weights: 32
/// rows of a 1,536-wide product are 48 KB of 8-bit activations.
pub(super) const PASS_ROWS: usize = 32;

/// Runs `tile(r0, r1, g)` over every (row tile, column group), spread over the backend's
/// threads ([`super::super::threads`]) by column groups; each call writes only its own outputs. With
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
    let threads = super::super::threads::threads().max(1);
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
        super::super::threads::for_each(items.len(), |i| run(&items[i]));
    }
}

/// Rows `r0..r1` as AVX2 tiles of at most [`ROW_TILE_AVX2`] rows: (first row, rows).
pub(super) fn avx2_row_tiles(r0: usize, r1: usize) -> impl Iterator<Item = (usize, usize)> {
    (r0..r1).step_by(ROW_TILE_AVX2).map(move |r| (r, (r1 - r).min(ROW_TILE_AVX2)))
}

/// A product's output buffer: left unwritten for a full product, whose tiles write every
/// value (zeroing it cost about 4% of a batch-16 step), or filled for a selected one.
pub(super) struct Outputs {
    pub(super) values: Vec<f32>,
    pub(super) len: usize,
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
pub(super) struct Line(pub(super) [u8; 64]);

/// A zeroed vector of `n` cache lines.
pub(super) fn lines(n: usize) -> Vec<Line> {
    vec![Line([0; 64]); n]
}

/// Keeps the rows of a tile interleaved: passes every row's integer sum through one empty
/// `asm!` statement, so no row's next `vpdpbusd` can be scheduled before every row's last
/// one. Left alone, LLVM's scheduler emits each row's eight `vpdpbusd` (a chain of
/// dependent 5-cycle instructions) one row after the other to save registers, and the
/// out-of-order window then finds too few independent instructions: the same kernel in C
/// ran 145 against 175 GMAC/s per core, rows in a row against rows interleaved (Xeon,
/// Sapphire Rapids). Emits no instruction.
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
