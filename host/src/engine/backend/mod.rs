//! The backend trait: the handful of operations a decoder-only transformer needs.
//!
//! Model definitions ([`crate::engine::model`]) are written once against [`Backend`]; a backend
//! (the CPU one here, CUDA later) implements the ops on its own tensor type. Activations are
//! row-major `[rows, cols]` matrices of f32, one row per token of the flattened batch.
//!
//! The KV cache belongs to the backend (device memory) but its layout is fixed by
//! [`KvShape`]: `num_blocks * block_size` slots per layer, each holding `kv_heads * head_dim`
//! keys and as many values. Which slot a token's K/V goes to, and which slots a query attends
//! to, come from the block tables in [`ForwardBatch`].

pub mod cpu;
pub mod cuda;

use candle_core::quantized::QTensor;

pub use cpu::CpuBackend;

/// How rotary embeddings pair the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(2i, 2i+1)`: GGML's layout for `llama` (the converter permutes Q/K).
    Interleaved,
    /// Halves `(i, i + d/2)`: the GPT-NeoX layout, used by `qwen2`.
    Halves,
}

/// Rotary position embedding tables: `cos`/`sin` of `position * theta^(-2i/d)` for each
/// position below `max_positions` and each of the `head_dim / 2` frequencies.
pub struct RopeTable {
    /// Dimensions per head.
    pub head_dim: usize,
    /// The pairing of dimensions.
    pub layout: RopeLayout,
    /// Row-major `[max_positions, head_dim / 2]`.
    pub cos: Vec<f32>,
    /// Row-major `[max_positions, head_dim / 2]`.
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// Tables for positions `0..max_positions` with frequency base `theta`.
    pub fn new(head_dim: usize, theta: f32, layout: RopeLayout, max_positions: usize) -> Self {
        let half = head_dim / 2;
        let inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf(2.0 * i as f32 / head_dim as f32)).collect();
        let mut cos = Vec::with_capacity(max_positions * half);
        let mut sin = Vec::with_capacity(max_positions * half);
        for position in 0..max_positions {
            for &f in &inv_freq {
                let angle = position as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        Self { head_dim, layout, cos, sin }
    }

    /// The number of positions covered.
    pub fn max_positions(&self) -> usize {
        self.cos.len() / (self.head_dim / 2).max(1)
    }
}

/// The element type of the KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    /// Half precision: half the memory of f32 (as vLLM's `auto` for f16 models).
    #[default]
    F16,
    /// bfloat16: the memory of f16, f32's range, 8 bits of mantissa; what bf16 models (most
    /// current ones, SmolLM2 and Qwen2.5 among them) and GPU servers keep their caches in. On
    /// the CPU its attention takes AVX-512 BF16 dot products ([`cpu::attention::bf16`]): about half
    /// the f16 path's time where the CPU has them, several times it where it does not.
    Bf16,
    /// Single precision.
    F32,
    /// Signed bytes with an f32 scale per 32 elements of a (slot, kv head): llama.cpp's `q8_0`
    /// cache type. A little over half the memory of the 2-byte types, at the price of 8-bit
    /// rounding against each 32 elements' largest ([`cpu::attention::int8`]). Head sizes that are
    /// multiples of 32.
    Int8,
}

impl KvDtype {
    /// Bytes per element, scales left out.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::Int8 => 1,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// The 2-byte type whose CPU attention is fastest here: bf16 where the CPU has AVX-512
    /// BF16, f16 elsewhere. What `kv_cache_dtype: auto` means.
    pub fn fastest() -> Self {
        if cpu::attention::bf16::accelerated() { KvDtype::Bf16 } else { KvDtype::F16 }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    /// `auto` (the fastest 2-byte type on this CPU, [`KvDtype::fastest`]), `f16`, `bf16`,
    /// `f32` or `int8`: the values of `--kv-cache-dtype`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(KvDtype::fastest()),
            "f16" => Ok(KvDtype::F16),
            "bf16" => Ok(KvDtype::Bf16),
            "f32" => Ok(KvDtype::F32),
            "int8" => Ok(KvDtype::Int8),
            other => Err(format!("unknown KV cache type `{other}` (auto, f16, bf16, f32, int8)")),
        }
    }
}

/// The geometry of a paged KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    /// Transformer layers.
    pub layers: usize,
    /// Blocks per layer.
    pub num_blocks: usize,
    /// Token slots per block.
    pub block_size: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// Element type.
    pub dtype: KvDtype,
}

impl KvShape {
    /// Bytes of cache per token slot across all layers.
    pub fn bytes_per_slot(&self) -> usize {
        let per_head = match self.dtype {
            KvDtype::Int8 => self.head_dim + self.head_dim / cpu::attention::int8::PART * 4,
            dtype => self.head_dim * dtype.bytes(),
        };
        2 * self.layers * self.kv_heads * per_head
    }
}

/// One sequence's part of a [`ForwardBatch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSeq {
    /// First row of this sequence in the flattened batch.
    pub start: usize,
    /// Number of rows (tokens fed this step).
    pub len: usize,
    /// The sequence's block table: cache blocks in position order.
    pub block_table: Vec<u32>,
}

/// The input of one forward pass: tokens of several sequences, flattened.
///
/// Every row attends to the cached positions `0..=positions[row]` of its own sequence; the
/// rows of this step are written to the cache before attention, so a multi-token chunk and
/// a prefill chunk are the same case as a single decode token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// Token ids, one per row.
    pub tokens: Vec<u32>,
    /// Position of each row within its sequence.
    pub positions: Vec<u32>,
    /// KV-cache slot each row's keys and values are written to.
    pub slots: Vec<u32>,
    /// The sequences, in row order.
    pub seqs: Vec<BatchSeq>,
    /// Rows whose logits are wanted, in output order.
    pub logits_rows: Vec<usize>,
}

impl ForwardBatch {
    /// Appends `tokens` of one sequence starting at `first_position`, with slots taken from
    /// `block_table` (`block_size` slots per block). When `want_logits`, the last row's logits
    /// are requested.
    pub fn push_sequence(
        &mut self,
        tokens: &[u32],
        first_position: usize,
        block_table: &[u32],
        block_size: usize,
        want_logits: bool,
    ) {
        let start = self.tokens.len();
        for (i, &token) in tokens.iter().enumerate() {
            let position = first_position + i;
            let block = block_table[position / block_size] as usize;
            self.tokens.push(token);
            self.positions.push(position as u32);
            self.slots.push((block * block_size + position % block_size) as u32);
        }
        self.seqs.push(BatchSeq { start, len: tokens.len(), block_table: block_table.to_vec() });
        if want_logits && !tokens.is_empty() {
            self.logits_rows.push(start + tokens.len() - 1);
        }
    }

    /// The rows `rows` of this batch as a batch of their own, in that order, each keeping
    /// its sequence's position and block table (consecutive rows of one sequence stay one
    /// sequence), all with logits wanted. The last layer of a decoder needs only the rows
    /// whose logits are wanted once every row's keys and values are written. `None` when a
    /// row is outside the batch.
    pub fn select(&self, rows: &[usize]) -> Option<ForwardBatch> {
        let mut out = ForwardBatch::default();
        let mut last: Option<(usize, usize)> = None; // (sequence index, row) of the previous row
        for (i, &row) in rows.iter().enumerate() {
            let s = self.seqs.iter().position(|s| (s.start..s.start + s.len).contains(&row))?;
            out.tokens.push(*self.tokens.get(row)?);
            out.positions.push(*self.positions.get(row)?);
            out.slots.push(*self.slots.get(row)?);
            match (last, out.seqs.last_mut()) {
                (Some((prev_seq, prev_row)), Some(seq)) if prev_seq == s && prev_row + 1 == row => seq.len += 1,
                _ => out.seqs.push(BatchSeq { start: i, len: 1, block_table: self.seqs[s].block_table.clone() }),
            }
            out.logits_rows.push(i);
            last = Some((s, row));
        }
        Some(out)
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Attention geometry of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionHeads {
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `heads`).
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
}

/// The ops a decoder needs, on a backend's own tensors.
pub trait Backend: Send + Sync + 'static {
    /// An activation matrix `[rows, cols]` of f32.
    type Tensor: Send;
    /// A weight matrix `[out, in]`, possibly quantised.
    type Matrix: Send + Sync;
    /// A weight vector (norm scale or bias).
    type Vector: Send + Sync;
    /// The paged K/V blocks of all layers.
    type KvCache: Send;

    /// A short name for logs (`cpu`, `cuda:0`).
    fn name(&self) -> String;
    /// Takes a weight matrix from the file's representation.
    fn matrix(&self, weight: QTensor) -> anyhow::Result<Self::Matrix>;
    /// Takes a weight vector from the file's representation.
    fn vector(&self, weight: QTensor) -> anyhow::Result<Self::Vector>;
    /// Allocates a zeroed KV cache.
    fn kv_cache(&self, shape: KvShape) -> anyhow::Result<Self::KvCache>;
    /// Bytes of weights held by a matrix (for the memory report).
    fn matrix_bytes(&self, matrix: &Self::Matrix) -> usize;

    /// Rows of the embedding table `table` (`[vocab, hidden]`) for `tokens`.
    fn embed(&self, table: &Self::Matrix, tokens: &[u32]) -> anyhow::Result<Self::Tensor>;
    /// `x / sqrt(mean(x^2) + eps) * weight`, row by row.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Vector, eps: f32) -> anyhow::Result<Self::Tensor>;
    /// `x @ weight^T (+ bias)`.
    fn linear(
        &self,
        x: &Self::Tensor,
        weight: &Self::Matrix,
        bias: Option<&Self::Vector>,
    ) -> anyhow::Result<Self::Tensor>;
    /// `x @ w^T (+ bias)` for several weights that share the input `x` (a layer's query, key
    /// and value projections; its gate and up projections): a backend can run them as one
    /// product, reading and preparing `x` once. The default runs [`Self::linear`] for each.
    fn linear_many(
        &self,
        x: &Self::Tensor,
        weights: &[(&Self::Matrix, Option<&Self::Vector>)],
    ) -> anyhow::Result<Vec<Self::Tensor>> {
        weights.iter().map(|(w, bias)| self.linear(x, w, *bias)).collect()
    }
    /// `x @ weight^T` for the output projection, where row `r` needs only the columns that
    /// `masks[r]` allows: a token mask in the plugins' bitset layout (bit `i % 32` of word
    /// `i / 32` allows column `i`; columns past its end are ruled out), `None` for every
    /// column; `masks` may be empty (every column of every row). A column a mask rules out
    /// holds `-inf` or its true value, so callers still apply the mask. A column it allows
    /// holds what [`Self::linear`] gives up to the order of the float sums: logits end the
    /// pass (nothing re-quantises them), so a backend may sum them in its fastest order, as
    /// long as each value depends only on its row and column (not on the batch or the masks).
    /// The default computes every column with [`Self::linear`].
    fn linear_masked(
        &self,
        x: &Self::Tensor,
        weight: &Self::Matrix,
        masks: &[Option<&[u32]>],
    ) -> anyhow::Result<Self::Tensor> {
        let _ = masks;
        self.linear(x, weight, None)
    }
    /// `x += y`.
    fn add_assign(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> anyhow::Result<()>;
    /// `silu(gate) * up`.
    fn silu_mul(&self, gate: &Self::Tensor, up: &Self::Tensor) -> anyhow::Result<Self::Tensor>;
    /// Rotates each head of `x` (`[rows, heads * head_dim]`) by its row's position.
    fn rope(&self, x: &mut Self::Tensor, positions: &[u32], table: &RopeTable) -> anyhow::Result<()>;
    /// Writes the rows of `k` and `v` (`[rows, kv_heads * head_dim]`) to their slots of `layer`.
    fn write_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Tensor,
        v: &Self::Tensor,
        slots: &[u32],
    ) -> anyhow::Result<()>;
    /// Causal attention of the queries `q` (`[rows, heads * head_dim]`) over the cached keys and
    /// values of `layer`, following the batch's block tables.
    fn attention(
        &self,
        q: &Self::Tensor,
        cache: &Self::KvCache,
        layer: usize,
        batch: &ForwardBatch,
        heads: AttentionHeads,
    ) -> anyhow::Result<Self::Tensor>;
    /// The listed rows of `x`, in that order.
    fn select_rows(&self, x: &Self::Tensor, rows: &[usize]) -> anyhow::Result<Self::Tensor>;
    /// Copies a tensor to host memory, row-major.
    fn to_host(&self, x: &Self::Tensor) -> anyhow::Result<Vec<f32>>;
    /// [`Self::to_host`] of a tensor no longer needed: a backend whose tensors live in host
    /// memory hands its values over instead of copying them (the logits of a pass: 196 KB a
    /// row for a 49k vocabulary). The default copies.
    fn move_to_host(&self, x: Self::Tensor) -> anyhow::Result<Vec<f32>> {
        self.to_host(&x)
    }
}

/// Deterministic test values in [-1, 1) (xorshift), shared by the backends' kernel tests.
#[cfg(test)]
fn test_values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selected_rows_keep_their_positions_slots_and_sequences() {
        let mut batch = ForwardBatch::default();
        batch.push_sequence(&[10, 11, 12], 5, &[3, 4], 4, true); // positions 5..8, blocks 3, 4
        batch.push_sequence(&[20], 0, &[7], 4, true);
        batch.push_sequence(&[30, 31], 2, &[9], 4, false);
        // Rows 1 and 2 of the first sequence, then the second sequence's row.
        let picked = batch.select(&[1, 2, 3]).unwrap();
        assert_eq!(picked.tokens, vec![11, 12, 20]);
        assert_eq!(picked.positions, vec![6, 7, 0]);
        assert_eq!(picked.slots, vec![4 * 4 + 2, 4 * 4 + 3, 7 * 4]);
        assert_eq!(
            picked.seqs,
            vec![
                BatchSeq { start: 0, len: 2, block_table: vec![3, 4] },
                BatchSeq { start: 2, len: 1, block_table: vec![7] },
            ]
        );
        assert_eq!(picked.logits_rows, vec![0, 1, 2]);
        // Rows of one sequence that are not consecutive are sequences of their own.
        let apart = batch.select(&[0, 2]).unwrap();
        assert_eq!(apart.seqs.len(), 2);
        assert!(batch.select(&[6]).is_none(), "row 6 is outside the batch");
        assert!(batch.select(&[]).unwrap().is_empty());
    }
}
