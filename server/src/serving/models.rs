//! The served model entries, their loading and hot reload.
//!
//! Each entry is `Loading`, `Ready` (a worker thread with its engine) or `Failed` (the load
//! error, reported as 503). Applying a new list of entries (at start, and whenever the config
//! file changes) keeps unchanged entries running, loads new and changed ones in the
//! background, and drops removed ones. A changed entry keeps answering on its previous engine
//! until the new one is ready, then switches (requests already running on the old engine
//! finish there, since they hold the old worker until they end); an edit that fails to load
//! leaves the previous configuration serving and says why in `/v1/models`. Only an entry
//! with nothing to serve yet (new, or failed before) answers 503 "model X is loading".
//!
//! Weights are shared by file: two entries naming the same GGUF (say one with `dspark: true`
//! and one with `false`) hold one copy of the model in memory, each with its own KV cache.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use dspark_host::constraint::{ConstraintMode, ConstraintRuntime};
use dspark_host::engine::chat::ChatTemplate;
use dspark_host::engine::{BackendChoice, LoadedModel, ModelTokenizer, load};
use serde_json::{Value, json};

use super::config::{ModelEntry, load_file};
use super::error::ApiError;
use super::metrics::{Metrics, lock};
use super::worker::Worker;

/// A model and tokenizer loaded from one file.
pub struct Weights {
    /// The model.
    pub model: Arc<dyn LoadedModel>,
    /// Its tokenizer.
    pub tokenizer: Arc<ModelTokenizer>,
}

/// A ready entry.
pub struct Served {
    /// The entry as configured.
    pub entry: ModelEntry,
    /// Its engine.
    pub worker: Worker,
    /// The constraint runtime: plugin instances for this model's tokenizer, their compiled
    /// constraints and path trees.
    pub constraints: ConstraintRuntime,
    /// The chat template, compiled once (or why it does not compile); `None` when the model
    /// has none.
    pub chat_template: Option<Result<ChatTemplate, String>>,
    /// The tool-call syntax the chat template teaches (generic when it has none).
    pub tool_format: dspark_plugin_tool_call::Format,
    /// Whether the chat template renders `tools` itself.
    pub template_renders_tools: bool,
    /// Unix time it became ready.
    pub created: u64,
    _weights: Arc<Weights>,
}

enum State {
    /// Loading `entry`; `serving` is the engine of the entry's previous configuration, which
    /// answers until the new one is ready (an edit never makes a served model unavailable).
    Loading {
        generation: u64,
        entry: ModelEntry,
        serving: Option<Arc<Served>>,
    },
    /// Serving; `reload_error` says why the latest edit did not load (the previous
    /// configuration keeps serving).
    Ready {
        served: Arc<Served>,
        reload_error: Option<String>,
    },
    Failed {
        entry: ModelEntry,
        message: String,
    },
}

/// All entries.
pub struct Models {
    entries: RwLock<BTreeMap<String, State>>,
    weights: Mutex<HashMap<(PathBuf, SystemTime, bool), Weak<Weights>>>,
    metrics: Arc<Metrics>,
    generation: Mutex<u64>,
}

impl Models {
    /// No entries yet.
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            entries: RwLock::new(BTreeMap::new()),
            weights: Mutex::new(HashMap::new()),
            metrics,
            generation: Mutex::new(0),
        })
    }

    /// The ready entry called `name`: 404 if there is none, 503 while it loads or after it
    /// failed to load.
    pub fn get(&self, name: &str) -> Result<Arc<Served>, ApiError> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        match entries.get(name) {
            None => Err(ApiError::model_not_found(name)),
            Some(State::Ready { served, .. }) | Some(State::Loading { serving: Some(served), .. }) => {
                Ok(served.clone())
            }
            Some(State::Loading { .. }) => Err(ApiError::loading(name)),
            Some(State::Failed { message, .. }) => {
                Err(ApiError::unavailable(format!("model {name} failed to load: {message}")))
            }
        }
    }

    /// Whether every entry is ready.
    pub fn all_ready(&self) -> bool {
        self.entries.read().unwrap_or_else(|e| e.into_inner()).values().all(|s| matches!(s, State::Ready { .. }))
    }

    /// Whether at least one entry is ready.
    pub fn any_ready(&self) -> bool {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries.values().any(|s| matches!(s, State::Ready { .. } | State::Loading { serving: Some(_), .. }))
    }

    /// The ready entries whose engine thread has stopped (it could not restart after a panic).
    pub fn stopped_engines(&self) -> Vec<String> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries
            .iter()
            .filter(|(_, s)| matches!(s, State::Ready { served, .. } if !served.worker.alive()))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Entries for `/v1/models`.
    pub fn list(&self) -> Vec<Value> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner());
        entries
            .iter()
            .map(|(name, state)| {
                let (status, entry, created, max_len, error) = match state {
                    State::Ready { served: s, reload_error } => {
                        ("ready", &s.entry, s.created, Some(s.worker.max_model_len), reload_error.clone())
                    }
                    State::Loading { serving: Some(s), .. } => {
                        ("reloading", &s.entry, s.created, Some(s.worker.max_model_len), None)
                    }
                    State::Loading { entry, .. } => ("loading", entry, 0, None, None),
                    State::Failed { entry, message } => ("failed", entry, 0, None, Some(message.clone())),
                };
                json!({
                    "id": name, "object": "model", "created": created, "owned_by": "dspark", "root": entry.path.file_name().map(|f| f.to_string_lossy().into_owned()),
                    "max_model_len": max_len,
                    "dspark": {"status": status, "dspark": entry.config.dspark, "batch_invariant": entry.config.batch_invariant, "error": error},
                })
            })
            .collect()
    }

    /// Makes `entries` the served set (see the module docs). Loads run on background threads;
    /// `wait` blocks until they are done (used at start).
    pub fn apply(self: &Arc<Self>, entries: Vec<ModelEntry>, wait: bool) {
        let mut loads = Vec::new();
        {
            let mut current = self.entries.write().unwrap_or_else(|e| e.into_inner());
            let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
            current.retain(|name, _| names.contains(name));
            for entry in entries {
                let unchanged = match current.get(&entry.name) {
                    Some(State::Ready { served, .. }) => served.entry == entry,
                    Some(State::Loading { entry: e, .. }) => *e == entry,
                    _ => false,
                };
                if unchanged {
                    continue;
                }
                let generation = {
                    let mut g = lock(&self.generation);
                    *g += 1;
                    *g
                };
                tracing::info!(model = %entry.name, path = %entry.path.display(), dspark = entry.config.dspark, "loading model");
                // The old engine is dropped with its entry; requests running on it hold their own
                // handle and finish there.
                let serving = match current.get(&entry.name) {
                    Some(State::Ready { served, .. }) | Some(State::Loading { serving: Some(served), .. }) => {
                        Some(served.clone())
                    }
                    _ => None,
                };
                current.insert(entry.name.clone(), State::Loading { generation, entry: entry.clone(), serving });
                let this = self.clone();
                loads.push(std::thread::spawn(move || this.load(entry, generation)));
            }
        }
        if wait {
            for l in loads {
                let _ = l.join();
            }
        }
    }

    fn load(&self, entry: ModelEntry, generation: u64) {
        // A panic while loading (a hostile file, a bug) fails the entry instead of leaving it
        // loading forever.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.build(&entry)))
            .unwrap_or_else(|panic| Err(anyhow::anyhow!("loading panicked: {}", panic_message(&panic))));
        let mut current = self.entries.write().unwrap_or_else(|e| e.into_inner());
        let previous = match current.get(&entry.name) {
            Some(State::Loading { generation: g, serving, .. }) if *g == generation => serving.clone(),
            _ => return, // superseded by a newer edit
        };
        let state = match (result, previous) {
            (Ok(served), _) => {
                // `auto` depends on the CPU, and answers on the cache type: say which it is.
                let kv_cache_dtype = format!("{:?}", entry.config.kv_cache_dtype.resolve()).to_lowercase();
                tracing::info!(model = %entry.name, kv_cache_dtype, "model ready");
                State::Ready { served: Arc::new(served), reload_error: None }
            }
            (Err(e), Some(served)) => {
                tracing::error!(model = %entry.name, "the edited entry failed to load; the previous configuration keeps serving: {e:#}");
                State::Ready { served, reload_error: Some(format!("{e:#}")) }
            }
            (Err(e), None) => {
                tracing::error!(model = %entry.name, "model failed to load: {e:#}");
                State::Failed { entry: entry.clone(), message: format!("{e:#}") }
            }
        };
        // The previous engine is dropped here; requests still using it hold their own handle.
        current.insert(entry.name.clone(), state);
    }

    fn build(&self, entry: &ModelEntry) -> anyhow::Result<Served> {
        let weights = self.weights(&entry.path, entry.config.batch_invariant)?;
        let metrics = self.metrics.model(&entry.name);
        let constraints = ConstraintRuntime::new(
            weights.tokenizer.clone(),
            weights.model.config().vocab_size,
            ConstraintMode::from_dspark(entry.config.dspark),
        )
        .with_observer(metrics.clone());
        let worker =
            Worker::spawn(&entry.name, weights.model.clone(), weights.tokenizer.clone(), &entry.config, metrics)
                .with_context(|| format!("cannot start the engine of `{}`", entry.name))?;
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let chat_template = weights.tokenizer.compile_chat_template().map(|t| t.map_err(|e| format!("{e:#}")));
        if let Some(Err(e)) = &chat_template {
            tracing::warn!(model = %entry.name, "the chat template does not compile; chat requests will fail: {e}");
        }
        let source = weights.tokenizer.chat_template.as_deref().unwrap_or_default();
        let tool_format = dspark_plugin_tool_call::Format::from_chat_template(source);
        let template_renders_tools = dspark_plugin_tool_call::Format::template_renders_tools(source);
        Ok(Served {
            entry: entry.clone(),
            worker,
            constraints,
            chat_template,
            tool_format,
            template_renders_tools,
            created,
            _weights: weights,
        })
    }

    /// The weights of `path`, shared with any entry that already loaded the same file with
    /// the same kernels (`batch_invariant`).
    fn weights(&self, path: &Path, batch_invariant: bool) -> anyhow::Result<Arc<Weights>> {
        let canonical = path.canonicalize().with_context(|| format!("model file {} not found", path.display()))?;
        let modified = std::fs::metadata(&canonical).and_then(|m| m.modified()).unwrap_or(UNIX_EPOCH);
        let key = (canonical.clone(), modified, batch_invariant);
        if let Some(w) = lock(&self.weights).get(&key).and_then(Weak::upgrade) {
            return Ok(w);
        }
        let backend = if batch_invariant { BackendChoice::CpuBatchInvariant } else { BackendChoice::Cpu };
        let (model, tokenizer) = load(backend, &canonical)?;
        let weights = Arc::new(Weights { model, tokenizer: Arc::new(tokenizer) });
        let mut cache = lock(&self.weights);
        cache.retain(|_, w| w.strong_count() > 0);
        cache.insert(key, Arc::downgrade(&weights));
        Ok(weights)
    }

    /// Watches `config` and applies its entries whenever it changes. A file that does not
    /// parse is logged and ignored (the served entries stay as they are).
    pub fn watch(self: &Arc<Self>, config: PathBuf, every: Duration) {
        let this = Arc::downgrade(self);
        let mut last = std::fs::read(&config).ok();
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(models) = this.upgrade() else { return };
                let now = std::fs::read(&config).ok();
                if now == last {
                    continue;
                }
                last = now;
                match load_file(&config) {
                    Ok(entries) => {
                        tracing::info!(config = %config.display(), "config changed: reloading changed entries");
                        models.apply(entries, false);
                    }
                    Err(e) => tracing::error!(config = %config.display(), "config change ignored: {e:#}"),
                }
            }
        });
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_naming_the_same_file_share_its_weights() {
        let models = Models::new(Arc::new(Metrics::default()));
        let path = dspark_tests::smollm2();
        let a = models.weights(&path, false).unwrap();
        let b = models.weights(&path, false).unwrap();
        assert!(Arc::ptr_eq(&a.model, &b.model), "a second entry must not load the weights again");
        drop((a, b));
        // Once no entry uses them, the weights are freed and a later load reads the file again.
        assert!(lock(&models.weights).values().all(|w| w.strong_count() == 0));
    }
}
