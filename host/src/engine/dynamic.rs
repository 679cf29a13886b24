//! The backend chosen at run time: [`LoadedModel`] and [`Engine`] erase the backend type of
//! [`Model`] and [`LlmEngine`], so the server, `dspark generate` and the benchmarks hold a
//! model and its engines without naming the backend they run on.
//!
//! The model definitions and the engine loop stay generic over [`Backend`] (the compiler
//! monomorphises the hot paths per backend); only this thin layer is dynamic: one virtual
//! call per engine step or request, against milliseconds of work each. A new backend (CUDA)
//! plugs in by implementing [`Backend`] and choosing it in [`load`].
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use dspark_host::engine::{BackendChoice, EngineConfig, GenerationRequest, load};
//!
//! let (model, tokenizer) = load(BackendChoice::Cpu, "model.gguf".as_ref())?;
//! let prompt = tokenizer.encode("The capital of France is")?;
//! let mut engine = model.engine(Arc::new(tokenizer), &EngineConfig::default())?;
//! let mut request = GenerationRequest::new(prompt);
//! request.max_tokens = Some(8);
//! engine.add_request(request)?;
//! while engine.has_work() {
//!     for update in engine.step()? {
//!         print!("{}", update.text);
//!     }
//! }
//! # Ok(())
//! # }
//! ```

use std::path::Path;
use std::sync::Arc;

use super::backend::{Backend, CpuBackend};
use super::config::{EngineConfig, EngineStats};
use super::llm_engine::LlmEngine;
use super::model::{DecoderConfig, Model};
use super::request::{GenerationRequest, RequestError, SequenceUpdate};
use super::scheduler::{Scheduler, SeqId};
use crate::tokenizer::ModelTokenizer;

/// The engine of one model on whichever backend it was loaded on ([`LlmEngine`]'s methods).
pub trait Engine: Send {
    /// Queues a request; see [`LlmEngine::add_request`].
    fn add_request(&mut self, request: GenerationRequest) -> Result<SeqId, RequestError>;
    /// Removes a sequence and frees its blocks; `false` when it was not running.
    fn cancel(&mut self, id: SeqId) -> bool;
    /// Runs one step; see [`LlmEngine::step`].
    fn step(&mut self) -> anyhow::Result<Vec<SequenceUpdate>>;
    /// Whether any sequence is waiting or running.
    fn has_work(&self) -> bool;
    /// Counters since the engine started.
    fn stats(&self) -> EngineStats;
    /// The scheduler (queue lengths, KV-cache usage).
    fn scheduler(&self) -> &Scheduler;
    /// The tokenizer.
    fn tokenizer(&self) -> &Arc<ModelTokenizer>;
    /// The longest sequence accepted.
    fn max_model_len(&self) -> usize;
}

impl<B: Backend> Engine for LlmEngine<B> {
    fn add_request(&mut self, request: GenerationRequest) -> Result<SeqId, RequestError> {
        LlmEngine::add_request(self, request)
    }
    fn cancel(&mut self, id: SeqId) -> bool {
        LlmEngine::cancel(self, id)
    }
    fn step(&mut self) -> anyhow::Result<Vec<SequenceUpdate>> {
        LlmEngine::step(self)
    }
    fn has_work(&self) -> bool {
        LlmEngine::has_work(self)
    }
    fn stats(&self) -> EngineStats {
        LlmEngine::stats(self)
    }
    fn scheduler(&self) -> &Scheduler {
        LlmEngine::scheduler(self)
    }
    fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        LlmEngine::tokenizer(self)
    }
    fn max_model_len(&self) -> usize {
        LlmEngine::max_model_len(self)
    }
}

/// A model's weights on some backend, shared by the engines of every entry that serves it.
pub trait LoadedModel: Send + Sync {
    /// The architecture's hyperparameters.
    fn config(&self) -> &DecoderConfig;
    /// The backend's name for logs (`cpu`, `cuda:0`).
    fn backend_name(&self) -> String;
    /// Bytes of weights held.
    fn weight_bytes(&self) -> usize;
    /// A new engine over these weights, with its own KV cache and scheduler.
    fn engine(
        self: Arc<Self>,
        tokenizer: Arc<ModelTokenizer>,
        config: &EngineConfig,
    ) -> anyhow::Result<Box<dyn Engine>>;
}

impl<B: Backend> LoadedModel for Model<B> {
    fn config(&self) -> &DecoderConfig {
        Model::config(self)
    }
    fn backend_name(&self) -> String {
        self.backend().name()
    }
    fn weight_bytes(&self) -> usize {
        Model::weight_bytes(self)
    }
    fn engine(
        self: Arc<Self>,
        tokenizer: Arc<ModelTokenizer>,
        config: &EngineConfig,
    ) -> anyhow::Result<Box<dyn Engine>> {
        Ok(Box::new(LlmEngine::new(self, tokenizer, config)?))
    }
}

/// Which backend a model is loaded on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// The CPU backend with its fastest kernels ([`CpuBackend::new`]).
    #[default]
    Cpu,
    /// The CPU backend with kernels whose results do not depend on the batch
    /// ([`CpuBackend::batch_invariant`]).
    CpuBatchInvariant,
}

/// Loads a GGUF model and its tokenizer onto the chosen backend.
pub fn load(choice: BackendChoice, path: &Path) -> anyhow::Result<(Arc<dyn LoadedModel>, ModelTokenizer)> {
    let (model, tokenizer) = match choice {
        BackendChoice::Cpu => super::load_model(CpuBackend::new(), path)?,
        BackendChoice::CpuBatchInvariant => super::load_model(CpuBackend::batch_invariant(), path)?,
    };
    Ok((Arc::new(model), tokenizer))
}
