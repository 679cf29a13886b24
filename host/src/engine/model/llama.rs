//! The Llama decoder.
//!
//! For each token `x` (a row of the residual stream) and each of the `layers` blocks:
//!
//! ```text
//! h  = rms_norm(x) * attn_norm
//! q  = h Wq (+ bq),  k = h Wk (+ bk),  v = h Wv (+ bv)        per head of head_dim
//! q, k = rope(q, position), rope(k, position)
//! cache[slot(position)] = (k, v)
//! a  = softmax(q k_j^T / sqrt(head_dim)) v_j  over the cached j <= position
//!                                            (query head h reads kv head h / (heads / kv_heads))
//! x  = x + a Wo
//! h  = rms_norm(x) * ffn_norm
//! x  = x + (silu(h Wgate) * (h Wup)) Wdown
//! ```
//!
//! and finally `logits = rms_norm(x) * output_norm @ Woutput^T`, only for the rows whose
//! logits are wanted. The other rows of the last block only feed the cache (its `k`, `v`), so
//! from its attention on the block runs for the wanted rows alone, as llama.cpp does: most
//! of a last block's work for a fast-forward chunk or a prefill, whose last row alone is
//! sampled. Every op is per row, so the wanted rows' values are the same either way. The output
//! projection goes through [`Backend::linear_masked`] whether or not masks are given, so a
//! row's logits are the same numbers in both cases. `Woutput` is the embedding table when the file has no `output.weight`
//! (tied embeddings, as in SmolLM2).
//!
//! Tensor names follow GGUF: `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v,
//! attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}`, `output_norm`, `output`.

use anyhow::{Context, bail};

use super::DecoderConfig;
use crate::engine::backend::{AttentionHeads, Backend, ForwardBatch, RopeLayout, RopeTable};
use crate::engine::gguf::GgufFile;

/// Reads a `llama` GGUF's hyper-parameters.
pub fn config(file: &GgufFile) -> anyhow::Result<DecoderConfig> {
    if file.has_tensor("rope_freqs.weight") {
        bail!("{}: scaled RoPE (rope_freqs.weight, Llama 3.1+) is not supported yet", file.path().display());
    }
    DecoderConfig::from_gguf(file, "llama", RopeLayout::Interleaved, false, 4096)
}

struct Block<B: Backend> {
    attn_norm: B::Vector,
    wq: B::Matrix,
    wk: B::Matrix,
    wv: B::Matrix,
    bias: Option<[B::Vector; 3]>,
    wo: B::Matrix,
    ffn_norm: B::Vector,
    w_gate: B::Matrix,
    w_up: B::Matrix,
    w_down: B::Matrix,
}

/// A Llama-family decoder with its weights on a backend.
pub struct Llama<B: Backend> {
    backend: B,
    config: DecoderConfig,
    embedding: B::Matrix,
    blocks: Vec<Block<B>>,
    output_norm: B::Vector,
    /// `None` when tied to the embedding table.
    output: Option<B::Matrix>,
    rope: RopeTable,
}

/// Every tensor's shape against the hyper-parameters (rows first).
fn check_shapes(file: &GgufFile, c: &DecoderConfig) -> anyhow::Result<()> {
    let (q, kv) = (c.heads * c.head_dim, c.kv_heads * c.head_dim);
    file.check_shape("token_embd.weight", &[c.vocab_size, c.hidden])?;
    file.check_shape("output_norm.weight", &[c.hidden])?;
    if file.has_tensor("output.weight") {
        file.check_shape("output.weight", &[c.vocab_size, c.hidden])?;
    }
    for n in 0..c.layers {
        let blk = |name: &str| format!("blk.{n}.{name}");
        for (name, dims) in [
            ("attn_q.weight", [q, c.hidden]),
            ("attn_k.weight", [kv, c.hidden]),
            ("attn_v.weight", [kv, c.hidden]),
            ("attn_output.weight", [c.hidden, q]),
            ("ffn_gate.weight", [c.intermediate, c.hidden]),
            ("ffn_up.weight", [c.intermediate, c.hidden]),
            ("ffn_down.weight", [c.hidden, c.intermediate]),
        ] {
            file.check_shape(&blk(name), &dims)?;
        }
        file.check_shape(&blk("attn_norm.weight"), &[c.hidden])?;
        file.check_shape(&blk("ffn_norm.weight"), &[c.hidden])?;
        if c.qkv_bias {
            file.check_shape(&blk("attn_q.bias"), &[q])?;
            file.check_shape(&blk("attn_k.bias"), &[kv])?;
            file.check_shape(&blk("attn_v.bias"), &[kv])?;
        }
    }
    Ok(())
}

impl<B: Backend> Llama<B> {
    /// Loads the weights described by `config` from `file`.
    pub fn load(backend: B, file: &mut GgufFile, config: DecoderConfig, max_positions: usize) -> anyhow::Result<Self> {
        config.check().map_err(|why| anyhow::anyhow!("{}: {why}", file.path().display()))?;
        check_shapes(file, &config)?;
        let embedding = backend.matrix(file.tensor("token_embd.weight")?)?;
        let mut blocks = Vec::with_capacity(config.layers);
        for n in 0..config.layers {
            let mut matrix = |name: &str| -> anyhow::Result<B::Matrix> {
                backend.matrix(file.tensor(&format!("blk.{n}.{name}.weight"))?)
            };
            let (wq, wk, wv, wo) = (matrix("attn_q")?, matrix("attn_k")?, matrix("attn_v")?, matrix("attn_output")?);
            let (w_gate, w_up, w_down) = (matrix("ffn_gate")?, matrix("ffn_up")?, matrix("ffn_down")?);
            let mut vector =
                |name: &str| -> anyhow::Result<B::Vector> { backend.vector(file.tensor(&format!("blk.{n}.{name}"))?) };
            let bias = if config.qkv_bias {
                Some([vector("attn_q.bias")?, vector("attn_k.bias")?, vector("attn_v.bias")?])
            } else {
                None
            };
            blocks.push(Block {
                attn_norm: vector("attn_norm.weight")?,
                wq,
                wk,
                wv,
                bias,
                wo,
                ffn_norm: vector("ffn_norm.weight")?,
                w_gate,
                w_up,
                w_down,
            });
        }
        let output_norm = backend.vector(file.tensor("output_norm.weight")?)?;
        let output = if file.has_tensor("output.weight") {
            Some(backend.matrix(file.tensor("output.weight")?).context("output projection")?)
        } else {
            None
        };
        let rope = RopeTable::new(config.head_dim, config.rope_theta, config.rope_layout, max_positions);
        Ok(Self { backend, config, embedding, blocks, output_norm, output, rope })
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        &self.config
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Bytes of weight matrices.
    pub fn weight_bytes(&self) -> usize {
        let b = &self.backend;
        let blocks: usize = self
            .blocks
            .iter()
            .map(|k| {
                [&k.wq, &k.wk, &k.wv, &k.wo, &k.w_gate, &k.w_up, &k.w_down]
                    .iter()
                    .map(|m| b.matrix_bytes(m))
                    .sum::<usize>()
            })
            .sum();
        blocks + b.matrix_bytes(self.output.as_ref().unwrap_or(&self.embedding))
    }

    /// One forward pass over `batch`; see the module docs for the math.
    pub fn forward(&self, batch: &ForwardBatch, cache: &mut B::KvCache) -> anyhow::Result<Vec<f32>> {
        let hidden = self.forward_hidden(batch, cache)?;
        self.logits(&hidden, &[])
    }

    /// The logits of `hidden` (from [`Self::forward_hidden`]), row-major. Where `masks[r]`
    /// is given, row `r` needs only the logits of the tokens it allows and the backend may
    /// skip the others (`-inf`; see [`Backend::linear_masked`]); `masks` may be empty.
    pub fn logits(&self, hidden: &B::Tensor, masks: &[Option<&[u32]>]) -> anyhow::Result<Vec<f32>> {
        let b = &self.backend;
        let output = self.output.as_ref().unwrap_or(&self.embedding);
        let logits = b.linear_masked(hidden, output, masks)?;
        b.move_to_host(logits)
    }

    /// A forward pass up to the output projection: writes the batch's K/V and returns the
    /// final-normed rows `batch.logits_rows`.
    pub fn forward_hidden(&self, batch: &ForwardBatch, cache: &mut B::KvCache) -> anyhow::Result<B::Tensor> {
        let b = &self.backend;
        let c = &self.config;
        let heads = AttentionHeads { heads: c.heads, kv_heads: c.kv_heads, head_dim: c.head_dim };
        let mut x = b.embed(&self.embedding, &batch.tokens)?;
        let wanted = if batch.logits_rows.len() < batch.len() {
            Some(batch.select(&batch.logits_rows).context("a logits row is outside the batch")?)
        } else {
            None
        };
        for (layer, block) in self.blocks.iter().enumerate() {
            let h = b.rms_norm(&x, &block.attn_norm, c.rms_eps)?;
            let [bq, bk, bv] = match &block.bias {
                Some([q, k, v]) => [Some(q), Some(k), Some(v)],
                None => [None, None, None],
            };
            let [mut q, mut k, v]: [B::Tensor; 3] = b
                .linear_many(&h, &[(&block.wq, bq), (&block.wk, bk), (&block.wv, bv)])?
                .try_into()
                .map_err(|_| anyhow::anyhow!("linear_many returned the wrong number of products"))?;
            b.rope(&mut q, &batch.positions, &self.rope)?;
            b.rope(&mut k, &batch.positions, &self.rope)?;
            b.write_kv(cache, layer, &k, &v, &batch.slots)?;
            let (q, rows) = match &wanted {
                Some(wanted) if layer + 1 == self.blocks.len() => {
                    x = b.select_rows(&x, &batch.logits_rows)?;
                    if wanted.is_empty() {
                        break;
                    }
                    (b.select_rows(&q, &batch.logits_rows)?, wanted)
                }
                _ => (q, batch),
            };
            let attended = b.attention(&q, cache, layer, rows, heads)?;
            b.add_assign(&mut x, &b.linear(&attended, &block.wo, None)?)?;

            let h = b.rms_norm(&x, &block.ffn_norm, c.rms_eps)?;
            let [gate, up]: [B::Tensor; 2] = b
                .linear_many(&h, &[(&block.w_gate, None), (&block.w_up, None)])?
                .try_into()
                .map_err(|_| anyhow::anyhow!("linear_many returned the wrong number of products"))?;
            let gated = b.silu_mul(&gate, &up)?;
            b.add_assign(&mut x, &b.linear(&gated, &block.w_down, None)?)?;
        }
        let last = if wanted.is_some() { x } else { b.select_rows(&x, &batch.logits_rows)? };
        b.rms_norm(&last, &self.output_norm, c.rms_eps)
    }
}
