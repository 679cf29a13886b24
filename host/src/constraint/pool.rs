//! Plugin instances pooled per plugin for one model, each with the constraints it compiled,
//! and the path trees of those constraints.
//!
//! A Wasm store runs one call at a time, so a sequence takes an instance for its lifetime and
//! gives it back when it ends; the instance keeps its compiled constraints (at most
//! [`COMPILED_PER_INSTANCE`]), so a request for a constraint seen before skips compilation.
//! The path trees live beside the instances, one per compiled constraint, shared by every
//! sequence of the model. A reloaded plugin gets a fresh pool: its old instances run the old
//! code and its old trees describe the old code's answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::lock;
use super::path_tree::{SharedTree, TreeCache};
use crate::engine::ModelTokenizer;
use crate::plugin::{CompiledHandle, LoadedPlugin, PluginError, PluginInstance};

/// What identifies a compiled constraint within one plugin and tokenizer: kind, canonical
/// source and options.
pub type CompiledKey = (String, String, String);

/// Most compiled constraints kept per instance; past it an instance drops them all.
pub const COMPILED_PER_INSTANCE: usize = 64;

/// Most idle instances kept per plugin and model. Instances in use are bounded by the requests
/// a model admits (each sequence holds one); past this many, a returned instance is dropped,
/// so a burst does not leave hundreds of megabytes of linear memory behind.
pub const IDLE_INSTANCES: usize = 8;

/// Most path trees kept per plugin and model.
pub const PATH_TREES: usize = 256;

/// Bytes of path trees kept per plugin and model.
pub const PATH_TREE_BYTES: usize = 256 << 20;

/// One instance with the constraints it has compiled.
pub struct Pooled {
    /// The instance.
    pub instance: PluginInstance,
    /// The constraints it compiled.
    pub(super) compiled: HashMap<CompiledKey, CompiledHandle>,
}

impl Pooled {
    /// Whether the instance has compiled `key`.
    pub fn has(&self, key: &CompiledKey) -> bool {
        self.compiled.contains_key(key)
    }

    /// Compiles `key` and keeps it; returns the plugin's warnings (what it approximates).
    pub fn compile(&mut self, key: &CompiledKey) -> Result<Vec<(String, String)>, PluginError> {
        if self.compiled.len() >= COMPILED_PER_INSTANCE {
            for (_, handle) in self.compiled.drain() {
                let _ = self.instance.drop_compiled(handle);
            }
        }
        let (kind, source, options) = key;
        let compiled = self.instance.compile(kind, source, options)?;
        let warnings = compiled.warnings.clone();
        self.compiled.insert(key.clone(), compiled);
        Ok(warnings)
    }
}

/// Instances of one plugin for one model's tokenizer, and the path trees of the constraints
/// compiled by it (DSpark's cache, shared by all requests of the model).
pub struct PluginPool {
    plugin: Arc<LoadedPlugin>,
    idle: Mutex<Vec<Pooled>>,
    trees: Mutex<TreeCache<CompiledKey>>,
}

impl PluginPool {
    fn new(plugin: Arc<LoadedPlugin>) -> Self {
        Self { plugin, idle: Mutex::new(Vec::new()), trees: Mutex::new(TreeCache::new(PATH_TREES, PATH_TREE_BYTES)) }
    }

    /// An idle instance, or a new one given the tokenizer's table.
    pub fn take(&self, tokenizer: &ModelTokenizer) -> Result<Pooled, PluginError> {
        if let Some(pooled) = lock(&self.idle).pop() {
            return Ok(pooled);
        }
        let table = tokenizer.tokenizer.table().clone();
        let instance = self.plugin.instantiate(table, tokenizer.tokenizer.clone())?;
        Ok(Pooled { instance, compiled: HashMap::new() })
    }

    /// Returns an instance that is in a good state (dropped when [`IDLE_INSTANCES`] wait
    /// already).
    pub fn give_back(&self, pooled: Pooled) {
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_INSTANCES {
            idle.push(pooled);
        }
    }

    /// The path tree of a compiled constraint, created empty on first use.
    pub fn tree(&self, key: &CompiledKey) -> SharedTree {
        lock(&self.trees).get(key)
    }

    /// Idle instances.
    pub fn idle(&self) -> usize {
        lock(&self.idle).len()
    }
}

/// The pools of one model, by plugin name.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<String, Arc<PluginPool>>>,
}

impl Pools {
    /// The pool of `plugin`, made fresh when the plugin was reloaded since.
    pub fn pool(&self, plugin: &Arc<LoadedPlugin>) -> Arc<PluginPool> {
        let mut pools = lock(&self.pools);
        let pool = pools.entry(plugin.name().to_string()).or_insert_with(|| Arc::new(PluginPool::new(plugin.clone())));
        if !Arc::ptr_eq(&pool.plugin, plugin) {
            *pool = Arc::new(PluginPool::new(plugin.clone()));
        }
        pool.clone()
    }
}
