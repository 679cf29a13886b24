//! The model engine: GGUF models on a backend, a paged KV cache, continuous batching and the
//! sampler.
//!
//! Data flow of one step (see `docs/design.md`): a [`request`] comes in with its
//! [`constraint`] (anything implementing [`SequenceConstraint`]); the [`scheduler`] plans which
//! tokens of which sequences to feed (decode tokens, fast-forward chunks, prefill chunks under
//! a token budget, with [`blocks`] allocating and sharing KV blocks); [`llm_engine`] flattens
//! them into a [`backend::ForwardBatch`] and runs the [`model`] on its [`backend`] while
//! [`overlap`] computes the constraints' masks; the [`sampler`] picks tokens under those
//! masks; [`detokenize`] turns tokens into text and finds stop strings. [`gguf`] and [`chat`]
//! read the model file and its chat template ([`crate::tokenizer::gguf`] its tokenizer).
//! [`config`] holds the engine's limits and counters; [`dynamic`] lets the caller choose the
//! backend at run time.

pub mod backend;
pub mod blocks;
pub mod chat;
pub mod config;
pub mod constraint;
pub mod detokenize;
pub mod draft;
pub mod dynamic;
pub mod gguf;
pub mod llm_engine;
pub mod model;
pub mod overlap;
pub mod request;
pub mod sampler;
pub mod scheduler;

use std::path::Path;

use anyhow::Context;

/// The tokenizer the engine detokenises with (it lives in [`crate::tokenizer`]).
pub use crate::tokenizer::ModelTokenizer;
pub use backend::{Backend, CpuBackend};
pub use config::{EngineConfig, EngineStats};
pub use constraint::{ConstraintStep, Guess, Mask, SequenceConstraint};
pub use draft::PromptLookup;
pub use dynamic::{BackendChoice, Engine, LoadedModel, load};
pub use llm_engine::LlmEngine;
pub use model::Model;
pub use request::{FinishReason, GenerationRequest, RequestError, SequenceUpdate, StopReason, TokenOutput};
pub use sampler::SamplingParams;

/// Loads a GGUF model and its tokenizer onto `backend`.
pub fn load_model<B: Backend>(backend: B, path: &Path) -> anyhow::Result<(Model<B>, ModelTokenizer)> {
    let mut file = gguf::GgufFile::open(path)?;
    let tokenizer = ModelTokenizer::load(path, &file).with_context(|| format!("tokenizer of {}", path.display()))?;
    let model = Model::load(backend, &mut file)?;
    // Every token id the tokenizer can produce must have an embedding row.
    let (tokens, rows) = (tokenizer.tokenizer.table().vocab_size(), model.config().vocab_size);
    if tokens > rows {
        anyhow::bail!("{}: the tokenizer has {tokens} tokens but the embedding table only {rows} rows", path.display());
    }
    Ok((model, tokenizer))
}
