//! Model definitions: one file per architecture, written against the [`Backend`] trait.
//!
//! - [`llama`]: the Llama decoder (RMSNorm, grouped-query attention with RoPE, SwiGLU MLP).
//!   SmolLM2 is a `llama` GGUF.
//! - [`qwen2`]: Qwen2/Qwen2.5, the Llama decoder with biases on the Q/K/V projections and the
//!   NeoX rotary layout.
//!
//! [`Model::load`] reads the architecture from the GGUF metadata and builds the right one.

pub mod llama;
pub mod qwen2;

use anyhow::bail;

use super::backend::{Backend, ForwardBatch, RopeLayout};
use super::gguf::GgufFile;

/// Hyper-parameters of a Llama-family decoder, from the GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    /// `general.architecture`.
    pub architecture: String,
    /// Vocabulary size (rows of the embedding table).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden: usize,
    /// Width of the MLP.
    pub intermediate: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Dimensions per head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE frequency base.
    pub rope_theta: f32,
    /// RoPE dimension pairing.
    pub rope_layout: RopeLayout,
    /// Whether Q, K and V have biases.
    pub qkv_bias: bool,
    /// The context length the model was trained for.
    pub context_length: usize,
}

/// A loaded model of any supported architecture.
pub struct Model<B: Backend> {
    decoder: llama::Llama<B>,
}

impl<B: Backend> Model<B> {
    /// Loads the weights of `file` onto `backend`. RoPE tables cover the model's context
    /// length.
    pub fn load(backend: B, file: &mut GgufFile) -> anyhow::Result<Self> {
        let config = match file.architecture()? {
            "llama" => llama::config(file)?,
            "qwen2" => qwen2::config(file)?,
            other => {
                bail!("{}: architecture `{other}` is not supported (supported: llama, qwen2)", file.path().display())
            }
        };
        let max_positions = config.context_length;
        Ok(Self { decoder: llama::Llama::load(backend, file, config, max_positions)? })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &DecoderConfig {
        self.decoder.config()
    }

    /// The backend the weights live on.
    pub fn backend(&self) -> &B {
        self.decoder.backend()
    }

    /// Bytes of weights (what a decode step reads at least once).
    pub fn weight_bytes(&self) -> usize {
        self.decoder.weight_bytes()
    }

    /// Runs one forward pass: writes the batch's K/V to `cache` and returns the logits of the
    /// requested rows, row-major `[batch.logits_rows.len(), vocab_size]`.
    pub fn forward(&self, batch: &ForwardBatch, cache: &mut B::KvCache) -> anyhow::Result<Vec<f32>> {
        self.decoder.forward(batch, cache)
    }
}
