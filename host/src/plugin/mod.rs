//! The sandboxed plugin runtime and the [`registry`] of installed plugins.
//!
//! Data flow: a [`Manifest`] and its `plugin.wasm` are loaded by a [`PluginRuntime`] into a
//! [`LoadedPlugin`] (the component compiled once, or taken from the on-disk cache, and
//! pre-linked into an `InstancePre`). A [`PluginInstance`] is one wasmtime `Store` made from it,
//! given a tokenizer's table once; through it the host compiles constraints and drives
//! matchers, and every answer is validated before the rest of dspark sees it.
//!
//! Failure model (after wasmtime's advice for untrusted guests): a trap — a call used its
//! limit of CPU time (epoch interruption, see [`deadline`]), memory exhausted (`StoreLimits`), a panic, a stack overflow — poisons
//! the whole `Store`. The call returns [`PluginError::Trap`], the instance restarts from the
//! cached `InstancePre` on its next use, and handles made before the restart report
//! [`PluginError::Stale`]. Whether the trap counts against the plugin is the policy of
//! [`health`]: an exhausted resource (time, memory, stack) is the input's cost, and refuses
//! that constraint for a while; a fault (a panic, an invalid answer) is a strike, and faults
//! under [`RuntimeConfig::strike_limit`] distinct constraints within a window quarantine the
//! plugin: no new instance or compile is allowed until its file changes or an operator lifts
//! it (`dspark plugins unquarantine`). The quarantine is recorded in the runtime's state
//! directory, keyed by the component's sha256, so `dspark plugins list` shows it too.

pub mod deadline;
mod error;
pub mod health;
mod instance;
mod manifest;
pub mod registry;
mod runtime;

pub use error::{ConstraintError, ErrorCode, PluginError};
pub use health::TrapCause;
pub use instance::{CommitOutcome, CompiledHandle, MatcherHandle, PluginInstance, TokenMask};
pub use manifest::{Capabilities, Limits, Manifest, SUPPORTED_WIT};
pub use runtime::{LoadedPlugin, PluginRuntime, PluginStatus, RuntimeConfig};

/// The generated bindings of the contract, version 0.1.0.
#[allow(missing_docs, clippy::all)]
pub(crate) mod bindings {
    wasmtime::component::bindgen!({
        world: "plugin",
        path: "../wit/0.1.0",
    });
}

/// Contract types other modules of the crate need.
pub(crate) mod bindings_types {
    pub(crate) use super::bindings::dspark::constraint::types::TokenTable as WitTokenTable;
}
