//! The constraint runtime: from a [`ConstraintRequest`] (plugin, kind, source, options) to the
//! masks and forced spans one sequence is decoded under.
//!
//! Data flow of a constrained request (`docs/design.md` walks one through):
//!
//! 1. [`ConstraintRuntime::build`] picks the plugin (by name, or the one serving the kind in
//!    the [`Registry`]) and takes an instance of it from the model's [`pool`]. An instance
//!    keeps the constraints it compiled, keyed by (kind, source, options), so a constraint
//!    seen before is not compiled again.
//! 2. The result is a [`PluginConstraint`], which the engine drives through
//!    [`SequenceConstraint`]: `start`, then `mask` and `commit` per sampled token.
//! 3. In [`ConstraintMode::DSpark`] every answer goes through the compiled constraint's
//!    [`path_tree`], shared by every request of the model: a known state answers from the
//!    tree without entering Wasm, forced spans go to the engine as fast-forward chunks, and
//!    the tree's guess of the next token may ride along. In [`ConstraintMode::Classic`] (what
//!    other servers do) the plugin computes a mask at every step and a forced span's tokens
//!    are sampled one step each, under a mask that allows only the next one.
//!
//! A mask call thus goes engine -> [`PluginConstraint`] -> path tree -> plugin instance, all
//! inside this crate. Errors are typed ([`BuildError`]); the server maps them to OpenAI error
//! bodies. Timing and path-tree counts go to a [`ConstraintObserver`] (the server's metrics).
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use dspark_host::constraint::{ConstraintMode, ConstraintRequest, ConstraintRuntime};
//! use dspark_host::engine::{CpuBackend, SequenceConstraint, load_model};
//! use dspark_host::plugin::{PluginRuntime, RuntimeConfig};
//! use dspark_host::plugin::registry::Registry;
//!
//! let plugins = PluginRuntime::new(RuntimeConfig::new(RuntimeConfig::default_state_dir()?))?;
//! let registry = Registry::new("plugins", plugins)?;
//! registry.scan();
//! let (model, tokenizer) = load_model(CpuBackend::new(), "model.gguf".as_ref())?;
//! let runtime = ConstraintRuntime::new(Arc::new(tokenizer), model.config().vocab_size, ConstraintMode::DSpark);
//! let request = ConstraintRequest::new("regex", "(yes|no)");
//! let mut constraint = runtime.build(&registry, &request)?.constraint;
//! let first = constraint.start()?; // the forced span at the start: nothing here
//! let mask = constraint.mask()?.expect("a regex allows only some tokens");
//! # let _ = (first, mask);
//! # Ok(())
//! # }
//! ```

pub mod path_tree;
pub mod pool;
mod sequence;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use path_tree::TreeStats;
pub use sequence::PluginConstraint;

use crate::engine::ModelTokenizer;
#[cfg(doc)]
use crate::engine::SequenceConstraint;
use crate::plugin::registry::{EntryState, Registry};
use crate::plugin::{LoadedPlugin, PluginError};
use pool::{PluginPool, Pools};

/// What a request asks to be constrained by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConstraintRequest {
    /// A plugin by name; `None` takes the installed plugin that serves [`Self::kind`].
    pub plugin: Option<String>,
    /// The constraint kind (`json-schema`, `regex`, `grammar`, ...).
    pub kind: String,
    /// The source text in the kind's language (a schema, a pattern, a grammar).
    pub source: String,
    /// The plugin's options as a JSON object text; empty for none.
    pub options: String,
}

impl ConstraintRequest {
    /// A constraint of `kind` from `source`, served by whichever plugin serves the kind,
    /// without options.
    pub fn new(kind: impl Into<String>, source: impl Into<String>) -> Self {
        Self { plugin: None, kind: kind.into(), source: source.into(), options: String::new() }
    }
}

/// How a sequence's constraint is driven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConstraintMode {
    /// The shared path tree, fast-forward spans and guesses (`dspark: true`).
    DSpark,
    /// One plugin mask per step and forced tokens sampled one by one (`dspark: false`).
    Classic,
}

impl ConstraintMode {
    /// `DSpark` when `dspark` is set, else `Classic`.
    pub fn from_dspark(dspark: bool) -> Self {
        if dspark { Self::DSpark } else { Self::Classic }
    }
}

/// Why a constraint could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The request named a plugin that is not installed.
    #[error("no plugin named `{name}` is installed")]
    NoSuchPlugin {
        /// The name asked for.
        name: String,
    },
    /// The named plugin does not serve the kind.
    #[error("plugin `{plugin}` does not serve kind `{kind}`")]
    KindNotServed {
        /// The plugin.
        plugin: String,
        /// The kind asked for.
        kind: String,
    },
    /// The request named a plugin that is installed but did not load.
    #[error("plugin `{name}` is installed but failed to load: {reason}; fix or replace it in the plugin directory")]
    PluginFailed {
        /// The name asked for.
        name: String,
        /// Which check failed (sha256, kinds, the component, the manifest).
        reason: String,
    },
    /// No ready plugin serves the kind.
    #[error("{}", no_plugin_for_kind(kind, unavailable))]
    NoPluginForKind {
        /// The kind asked for.
        kind: String,
        /// Why each installed plugin that declares the kind cannot serve it (quarantined,
        /// failed to load); empty when none declares it.
        unavailable: Vec<String>,
    },
    /// The plugin refused the source or options: the request's fault.
    #[error("invalid {kind} constraint{}: {message}", location.as_deref().map(|l| format!(" at {l}")).unwrap_or_default())]
    Invalid {
        /// The kind.
        kind: String,
        /// Where in the source, when the plugin says.
        location: Option<String>,
        /// The plugin's message.
        message: String,
    },
    /// The constraint exhausted the plugin's time, memory or stack (now, or a short while ago
    /// and is refused for a while): the request's cost, not the plugin's fault.
    #[error("the {kind} constraint is too costly to serve: {message}; simplify it")]
    TooCostly {
        /// The kind.
        kind: String,
        /// What it exhausted, and for how long it is refused.
        message: String,
    },
    /// The plugin is quarantined: retry once the operator has replaced it.
    #[error(transparent)]
    Unavailable(PluginError),
    /// The plugin or the host failed (a trap, an invalid answer, a setup failure).
    #[error(transparent)]
    Plugin(PluginError),
}

fn no_plugin_for_kind(kind: &str, unavailable: &[String]) -> String {
    if unavailable.is_empty() {
        format!("no installed plugin serves `{kind}` constraints")
    } else {
        format!("no ready plugin serves `{kind}` constraints: {}", unavailable.join("; "))
    }
}

impl BuildError {
    fn from_plugin(kind: &str, e: PluginError) -> Self {
        match e {
            PluginError::Constraint { error, .. } if error.code.is_user_error() => {
                BuildError::Invalid { kind: kind.to_string(), location: error.location, message: error.message }
            }
            PluginError::Trap { message, cause, .. } if cause.is_resource() => {
                BuildError::TooCostly { kind: kind.to_string(), message: format!("the plugin {message}") }
            }
            e @ PluginError::Refused { .. } => BuildError::TooCostly { kind: kind.to_string(), message: e.to_string() },
            e @ PluginError::Quarantined { .. } => BuildError::Unavailable(e),
            e => BuildError::Plugin(e),
        }
    }
}

/// Receives the runtime's timings and counts (the server's metrics implement it). Every
/// method does nothing by default.
pub trait ConstraintObserver: Send + Sync {
    /// A constraint was compiled (or failed to) in `took`.
    fn compiled(&self, took: Duration) {
        let _ = took;
    }
    /// A plugin computed a mask in `took` (path-tree hits make no call).
    fn mask_computed(&self, took: Duration) {
        let _ = took;
    }
    /// A sequence's walk of its path tree ended with these counts.
    fn walked(&self, stats: TreeStats) {
        let _ = stats;
    }
}

/// The observer that records nothing.
impl ConstraintObserver for () {}

/// A built constraint and what its compilation warned of.
pub struct Built {
    /// The sequence's constraint, ready for [`crate::engine::GenerationRequest::constraint`].
    pub constraint: PluginConstraint,
    /// `(location, message)` for each part of the source the plugin can only approximate
    /// (empty when the constraint was compiled before).
    pub warnings: Vec<(String, String)>,
}

/// The constraint runtime of one model: its tokenizer, the pools of plugin instances made
/// for it, their compiled constraints and path trees, and the mode its requests run in.
pub struct ConstraintRuntime {
    pools: Pools,
    tokenizer: Arc<ModelTokenizer>,
    vocab: usize,
    mode: ConstraintMode,
    observer: Arc<dyn ConstraintObserver>,
}

impl ConstraintRuntime {
    /// A runtime for a model whose logits rows are `vocab` wide (at least the tokenizer's
    /// vocabulary), with no observer.
    pub fn new(tokenizer: Arc<ModelTokenizer>, vocab: usize, mode: ConstraintMode) -> Self {
        Self { pools: Pools::default(), tokenizer, vocab, mode, observer: Arc::new(()) }
    }

    /// The same runtime reporting to `observer`.
    pub fn with_observer(mut self, observer: Arc<dyn ConstraintObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The mode its constraints run in.
    pub fn mode(&self) -> ConstraintMode {
        self.mode
    }

    /// Compiles `request` (unless the instance taken from the pool has it already) and
    /// returns the sequence's constraint. Blocking: compilation runs in the plugin, up to its
    /// compile deadline; an async caller runs this on a blocking thread.
    pub fn build(&self, registry: &Registry, request: &ConstraintRequest) -> Result<Built, BuildError> {
        let plugin = self.plugin(registry, request)?;
        let pool = self.pools.pool(&plugin);
        self.build_in(&pool, request)
    }

    fn plugin(&self, registry: &Registry, request: &ConstraintRequest) -> Result<Arc<LoadedPlugin>, BuildError> {
        match &request.plugin {
            Some(name) => {
                let plugin = match registry.state(name) {
                    Some(EntryState::Loaded(plugin)) => plugin,
                    Some(EntryState::Failed(reason)) => {
                        return Err(BuildError::PluginFailed { name: name.clone(), reason });
                    }
                    None => return Err(BuildError::NoSuchPlugin { name: name.clone() }),
                };
                if !plugin.serves(&request.kind) {
                    return Err(BuildError::KindNotServed { plugin: name.clone(), kind: request.kind.clone() });
                }
                Ok(plugin)
            }
            None => registry.find_kind(&request.kind).ok_or_else(|| BuildError::NoPluginForKind {
                kind: request.kind.clone(),
                unavailable: registry.unavailable_for_kind(&request.kind),
            }),
        }
    }

    fn build_in(&self, pool: &Arc<PluginPool>, request: &ConstraintRequest) -> Result<Built, BuildError> {
        let error = |e| BuildError::from_plugin(&request.kind, e);
        let mut pooled = pool.take(&self.tokenizer).map_err(error)?;
        let key = (request.kind.clone(), request.source.clone(), request.options.clone());
        let mut warnings = Vec::new();
        if !pooled.has(&key) {
            let started = Instant::now();
            let compiled = pooled.compile(&key);
            self.observer.compiled(started.elapsed());
            match compiled {
                Ok(w) => warnings = w,
                Err(e) => {
                    pool.give_back(pooled);
                    return Err(error(e));
                }
            }
        }
        let constraint = PluginConstraint::new(pool.clone(), pooled, key, self.vocab, self.mode, self.observer.clone())
            .map_err(error)?;
        Ok(Built { constraint, warnings })
    }
}

/// Locks a mutex whose data stays consistent through a panic in another holder (every update
/// under these locks is a single insertion or removal), so poisoning is ignored.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
