//! Matrix products for x86 CPUs that give exactly candle's results, for the formats of the two
//! test models: Q4_1 (SmolLM2's layers), Q8_0 (SmolLM2's embedding, tied
//! to the output projection; Qwen2.5's output and value projections) and Q5_0 (most of
//! Qwen2.5's layers). Q4_K and Q6_K (Qwen2.5's down projections) are [`k_quants`]'s,
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

pub mod k_quants;
mod q4_1;
mod q5_0;
mod q8_0;
mod quantize;
#[cfg(test)]
mod tests;
mod tiles;

use k_quants::PackedK;
pub use q4_1::PackedQ4_1;
pub use q5_0::PackedQ5_0;
pub use q8_0::PackedQ8_0;
use quantize::Q8_1Rows;
pub use quantize::quantize_q8;
pub use tiles::{GROUP_COLUMNS, Isa, Selection};
use tiles::{LANES, for_each_tile};

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

/// Whether this CPU runs the kernels (with one [`Isa`] or the other).
pub fn supported() -> bool {
    Isa::detect().is_some()
}
