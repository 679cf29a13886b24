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
    let hidden = file.u32("qwen2.embedding_length")? as usize;
    let heads = file.u32("qwen2.attention.head_count")? as usize;
    let vocab_size = match file.opt_u32("qwen2.vocab_size")? {
        Some(v) => v as usize,
        None => file.strings("tokenizer.ggml.tokens")?.len(),
    };
    Ok(DecoderConfig {
        architecture: "qwen2".to_string(),
        vocab_size,
        hidden,
        intermediate: file.u32("qwen2.feed_forward_length")? as usize,
        layers: file.u32("qwen2.block_count")? as usize,
        heads,
        kv_heads: file.opt_u32("qwen2.attention.head_count_kv")?.map_or(heads, |v| v as usize),
        head_dim: hidden / heads.max(1),
        rms_eps: file.f32("qwen2.attention.layer_norm_rms_epsilon")?,
        rope_theta: file.opt_f32("qwen2.rope.freq_base")?.unwrap_or(10_000.0),
        rope_layout: RopeLayout::Halves,
        qkv_bias: true,
        context_length: file.opt_u32("qwen2.context_length")?.unwrap_or(32_768) as usize,
    })
}
