//! dspark's host library.
//!
//! This crate holds everything the server runs besides HTTP:
//!
//! - [`plugin`]: the sandboxed plugin runtime. Constraint plugins are WebAssembly components
//!   (contract: `wit/0.1.0/constraint.wit`) run by wasmtime with a deadline per call, a memory
//!   cap, no WASI capability they did not ask for, output validation, a strike count and
//!   quarantine.
//! - [`registry`]: the plugin registry directory (`plugins/<name>/{plugin.toml,plugin.wasm}`),
//!   scanned at start and on change.
//! - [`tokenizer`]: the tokenizer's vocabulary as the byte table plugins get, and the canonical
//!   tokenisation they ask the host for.
//! - [`engine`]: the model engine: GGUF models (llama, qwen2) over a backend trait, the paged
//!   KV cache with prefix caching, the continuous-batching scheduler and the sampler.
//! - [`pathtree`]: DSpark's path tree, the per-constraint cache of masks, forced spans and
//!   successor states shared by all sequences, so that a known path makes no plugin call.

pub mod engine;
pub mod pathtree;
pub mod plugin;
pub mod registry;
pub mod tokenizer;
