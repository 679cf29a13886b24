//! The model engine: GGUF models on a backend, a paged KV cache, continuous batching and the
//! sampler.
//!
//! Data flow of one step (see ARCHITECTURE.md): the [`scheduler`] plans which tokens of which
//! sequences to feed (decode tokens, fast-forward chunks, prefill chunks under a token budget,
//! with [`blocks`] allocating and sharing KV blocks); [`llm`] flattens them into a
//! [`backend::ForwardBatch`] and runs the [`model`] on its [`backend`]; the [`sampler`] picks
//! tokens under the constraints' masks; [`detokenize`] turns tokens into text and finds stop
//! strings. [`gguf`], [`gguf_tokenizer`] and [`chat`] read the model file, its tokenizer and
//! its chat template.

pub mod backend;
pub mod blocks;
pub mod chat;
pub mod detokenize;
pub mod draft;
pub mod gguf;
pub mod gguf_tokenizer;
pub mod llm;
pub mod model;
pub mod sampler;
pub mod scheduler;

use std::path::Path;

use anyhow::Context;

pub use backend::{Backend, CpuBackend};
pub use draft::PromptLookup;
pub use gguf_tokenizer::ModelTokenizer;
pub use llm::{
    ConstraintStep, EngineConfig, EngineStats, FinishReason, GenerationRequest, Guess, LlmEngine, RequestError,
    SequenceConstraint, SequenceUpdate, StopReason, TokenOutput,
};
pub use model::Model;
pub use sampler::SamplingParams;

/// Loads a GGUF model and its tokenizer onto `backend`.
pub fn load_model<B: Backend>(backend: B, path: &Path) -> anyhow::Result<(Model<B>, ModelTokenizer)> {
    let mut file = gguf::GgufFile::open(path)?;
    let tokenizer = ModelTokenizer::load(path, &file).with_context(|| format!("tokenizer of {}", path.display()))?;
    let model = Model::load(backend, &mut file)?;
    Ok((model, tokenizer))
}
