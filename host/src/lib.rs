//! dspark's host library.
//!
//! This crate holds everything the server runs besides HTTP, in the order a constrained
//! request flows through it (`docs/design.md`):
//!
//! - [`plugin`]: the sandboxed plugin runtime. Constraint plugins are WebAssembly components
//!   (contract: `wit/0.1.0/constraint.wit`) run by wasmtime with a deadline per call, a memory
//!   cap, no WASI capability they did not ask for, output validation, a strike count and
//!   quarantine; [`plugin::registry`] is the plugin directory, scanned at start and on change.
//! - [`tokenizer`]: the tokenizer's vocabulary as the byte table plugins get, and the canonical
//!   tokenisation they ask the host for.
//! - [`constraint`]: the constraint runtime: from a constraint request to a sequence's masks
//!   and forced spans, through pooled plugin instances, their compiled constraints and
//!   DSpark's path tree (or the classic path).
//! - [`engine`]: the model engine: GGUF models over a backend, the paged KV cache with prefix
//!   caching, the continuous-batching scheduler, the mask overlap and the sampler.

pub mod constraint;
pub mod engine;
pub mod plugin;
pub mod tokenizer;
