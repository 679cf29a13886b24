//! Qwen2 / Qwen2.5: the Llama decoder of [`super::llama`] with two differences,
//!
//! - the Q, K and V projections carry biases (`blk.N.attn_{q,k,v}.bias`);
//! - RoPE pairs dimension `i` with `i + head_dim/2` (NeoX layout), where GGML's `llama` pairs
//!   adjacent dimensions.
//!
//! The output projection may be tied to the embedding table (no `output.weight`), as in the
//! 0.5B model; [`super::llama::Llama::load`] handles both.

use super::DecoderConfig;
use crate::engine::backend::RopeLayout;
use crate::engine::gguf::GgufFile;

/// Reads a `qwen2` GGUF's hyper-parameters.
pub fn config(file: &GgufFile) -> anyhow::Result<DecoderConfig> {
    DecoderConfig::from_gguf(file, "qwen2", RopeLayout::Halves, true, 32_768)
}
