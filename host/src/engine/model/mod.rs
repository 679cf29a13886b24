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

use std::sync::Arc;

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

impl DecoderConfig {
    /// Reads the hyper-parameters every Llama-family GGUF stores under `<arch>.*`; the
    /// architecture supplies what the file does not say (RoPE layout, Q/K/V biases, the
    /// context length to assume when the key is missing).
    pub fn from_gguf(
        file: &GgufFile,
        arch: &str,
        rope_layout: RopeLayout,
        qkv_bias: bool,
        default_context: u32,
    ) -> anyhow::Result<Self> {
        let key = |k: &str| format!("{arch}.{k}");
        let hidden = file.u32(&key("embedding_length"))? as usize;
        let heads = file.u32(&key("attention.head_count"))? as usize;
        let vocab_size = match file.opt_u32(&key("vocab_size"))? {
            Some(v) => v as usize,
            None => file.strings("tokenizer.ggml.tokens")?.len(),
        };
        let config = Self {
            architecture: arch.to_string(),
            vocab_size,
            hidden,
            intermediate: file.u32(&key("feed_forward_length"))? as usize,
            layers: file.u32(&key("block_count"))? as usize,
            heads,
            kv_heads: file.opt_u32(&key("attention.head_count_kv"))?.map_or(heads, |v| v as usize),
            head_dim: match file.opt_u32(&key("rope.dimension_count"))? {
                Some(d) => d as usize,
                None => hidden / heads.max(1),
            },
            rms_eps: file.f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: file.opt_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_layout,
            qkv_bias,
            context_length: file.opt_u32(&key("context_length"))?.unwrap_or(default_context) as usize,
        };
        config.check().map_err(|why| anyhow::anyhow!("{}: {why}", file.path().display()))?;
        Ok(config)
    }

    /// Refuses hyper-parameters no real model has, before they size an allocation: each
    /// within a bound well above today's largest models, the attention geometry consistent,
    /// and the RoPE table (head_dim x context floats) under 1 GiB.
    pub fn check(&self) -> Result<(), String> {
        let bounded = [
            ("embedding_length", self.hidden, 1 << 16),
            ("feed_forward_length", self.intermediate, 1 << 20),
            ("block_count", self.layers, 1 << 10),
            ("attention.head_count", self.heads, 1 << 10),
            ("attention.head_count_kv", self.kv_heads, 1 << 10),
            ("rope.dimension_count", self.head_dim, 1 << 10),
            ("vocab_size", self.vocab_size, 1 << 22),
            ("context_length", self.context_length, 1 << 24),
        ];
        for (key, value, max) in bounded {
            if value == 0 || value > max {
                return Err(format!("`{key}` is {value}; it must be from 1 to {max}"));
            }
        }
        if !self.heads.is_multiple_of(self.kv_heads) || !self.head_dim.is_multiple_of(2) {
            return Err(format!(
                "unsupported attention geometry ({} heads, {} kv heads, head_dim {})",
                self.heads, self.kv_heads, self.head_dim
            ));
        }
        if !(self.rms_eps.is_finite() && self.rms_eps > 0.0 && self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("rms epsilon {} and rope base {} must be positive", self.rms_eps, self.rope_theta));
        }
        if self.head_dim.saturating_mul(self.context_length) > 1 << 28 {
            return Err(format!(
                "a RoPE table for {} positions of {} dimensions is over 1 GiB; the context length is not plausible",
                self.context_length, self.head_dim
            ));
        }
        Ok(())
    }
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

    /// [`Self::forward`] whose output projection first waits for `masks`: called once the
    /// pass reaches the output projection, it returns a value handed back beside the logits
    /// and, for each logits row, the token mask sampling will apply to it (or `None`; the list
    /// may be empty). A masked row's logits are computed only where the backend can tell its
    /// mask rules them out cheaply; the ruled-out ones are `-inf` or their true value, and
    /// every allowed one is exactly what [`Self::forward`] gives.
    pub fn forward_masked<T: Send>(
        &self,
        batch: &ForwardBatch,
        cache: &mut B::KvCache,
        masks: impl FnOnce() -> (T, Vec<Option<Arc<[u32]>>>) + Send,
    ) -> (anyhow::Result<Vec<f32>>, T) {
        let hidden = self.decoder.forward_hidden(batch, cache);
        let (value, masks) = masks();
        let masks: Vec<Option<&[u32]>> = masks.iter().map(Option::as_deref).collect();
        (hidden.and_then(|h| self.decoder.logits(&h, &masks)), value)
    }
}
