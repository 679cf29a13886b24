//! From a request's structure fields to a running plugin matcher.
//!
//! Accepted, exactly one per request:
//!
//! | field | plugin kind | source |
//! |---|---|---|
//! | `response_format: {"type": "json_object"}` | `json-object` | (empty) |
//! | `response_format: {"type": "json_schema", "json_schema": {"schema": S}}` | `json-schema` | S |
//! | `structured_outputs.json` / `guided_json` | `json-schema` | the schema |
//! | `structured_outputs.regex` / `guided_regex` | `regex` | the pattern |
//! | `structured_outputs.choice` / `guided_choice` | `choice` | the strings, as JSON |
//! | `structured_outputs.grammar` / `guided_grammar` | `grammar` | the grammar |
//! | `response_format: {"type": "plugin", "plugin": P, "kind": K, "source": S, "options": O}` | K of plugin P | S |
//!
//! `structured_outputs.whitespace_pattern` (vLLM) becomes the json-schema plugin's option of
//! that name; JSON is otherwise compact. Other layouts (`"whitespace": "flexible"`,
//! `"separators"`, `"indent"`) are reached through the plugin extension's `options`.
//!
//! The last row is dspark's extension: any plugin of the registry, by name. Everything else
//! goes to the plugin that serves the kind. `response_format: {"type": "text"}` is no
//! constraint.
//!
//! Compilation errors of the plugin (a bad schema, an unsupported keyword) are 400s with the
//! plugin's message and JSON pointer. A constraint the plugin can only approximate (its compile
//! warnings, e.g. `uniqueItems` over arrays of arrays) is served as closely as it can be and
//! the first warning is logged, unless the request asked for OpenAI's strict mode
//! (`response_format.json_schema.strict: true`, or `strict: true` on a tool's function, which
//! the tool-call plugin reads from its source): the json-schema plugin's `strict` option then
//! makes an approximation that could let an invalid answer through a 400, as OpenAI refuses
//! what strict mode cannot guarantee. Instances are pooled per plugin and model: a request
//! takes one for its lifetime (a Wasm store runs one call at a time) and gives it back, with
//! its compiled constraints cached by source, when it ends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dspark_host::engine::{ConstraintStep, Guess, ModelTokenizer, SequenceConstraint};
use dspark_host::pathtree::{Mask, StateSource, TreeCache, TreeWalker};
use dspark_host::plugin::{CompiledHandle, LoadedPlugin, MatcherHandle, PluginError, PluginInstance, TokenMask};
use dspark_host::registry::Registry;
use serde_json::Value;

use super::error::ApiError;
use super::metrics::{ModelMetrics, lock};

/// What to compile: plugin (or the one serving `kind`), kind, source and options.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstraintSpec {
    /// A plugin by name (the extension), else the plugin serving `kind`.
    pub plugin: Option<String>,
    /// The constraint kind.
    pub kind: String,
    /// The source text.
    pub source: String,
    /// Options as a JSON object text (empty for none).
    pub options: String,
    /// The request field it came from, for error messages.
    pub field: String,
    /// For JSON kinds, the schema finished answers must validate against (`Value::Bool(true)`
    /// for any JSON).
    pub validate: Option<Value>,
}

impl ConstraintSpec {
    fn new(kind: &str, source: String, field: &str) -> Self {
        Self { plugin: None, kind: kind.into(), source, options: String::new(), field: field.into(), validate: None }
    }

    /// The `tool-call` plugin's constraint for a request's tools (see [`super::tools`]).
    pub fn tool_call(source: String) -> Self {
        Self::new("tool-call", source, "tools")
    }

    /// Sets one of the plugin's options, keeping the others.
    fn set_option(&mut self, key: &str, value: Value) {
        let mut options = match serde_json::from_str::<Value>(&self.options) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        options.insert(key.to_string(), value);
        self.options = Value::Object(options).to_string();
    }

    fn json_schema(schema: &Value, field: &str) -> Result<Self, ApiError> {
        let schema = match schema {
            Value::String(text) => serde_json::from_str(text)
                .map_err(|e| ApiError::invalid(field, format!("`{field}` is a string that is not JSON: {e}")))?,
            other => other.clone(),
        };
        if !(schema.is_object() || schema.is_boolean()) {
            return Err(ApiError::invalid(field, format!("`{field}` must be a JSON Schema (an object or a boolean)")));
        }
        let mut spec = Self::new("json-schema", schema.to_string(), field);
        spec.validate = Some(schema);
        Ok(spec)
    }
}

/// Reads the structure fields of a request (see the module docs).
pub fn from_request(sampling: &super::api::Sampling) -> Result<Option<ConstraintSpec>, ApiError> {
    let mut found: Vec<ConstraintSpec> = Vec::new();
    let mut whitespace_pattern = None;
    if let Some(format) = &sampling.response_format {
        found.extend(from_response_format(format)?);
    }
    if let Some(so) = &sampling.structured_outputs {
        let Value::Object(map) = so else {
            return Err(ApiError::invalid("structured_outputs", "`structured_outputs` must be an object"));
        };
        for (key, value) in map {
            let field = format!("structured_outputs.{key}");
            match key.as_str() {
                "json" => found.push(ConstraintSpec::json_schema(value, &field)?),
                "regex" => found.push(ConstraintSpec::new("regex", string_field(value, &field)?, &field)),
                "choice" => found.push(choice(value, &field)?),
                "grammar" => found.push(ConstraintSpec::new("grammar", string_field(value, &field)?, &field)),
                "json_object" if value == &Value::Bool(true) => found.push(json_object(&field)),
                "whitespace_pattern" => {
                    whitespace_pattern = Some(string_field(value, &field)?);
                }
                "json_object"
                | "disable_fallback"
                | "disable_any_whitespace"
                | "disable_additional_properties"
                | "backend" => {}
                other => {
                    return Err(ApiError::invalid(
                        field.clone(),
                        format!("`structured_outputs.{other}` is not supported (use json, regex, choice or grammar)"),
                    ));
                }
            }
        }
    }
    if let Some(schema) = &sampling.guided_json {
        found.push(ConstraintSpec::json_schema(schema, "guided_json")?);
    }
    if let Some(regex) = &sampling.guided_regex {
        found.push(ConstraintSpec::new("regex", regex.clone(), "guided_regex"));
    }
    if let Some(choices) = &sampling.guided_choice {
        found.push(choice(&Value::from(choices.clone()), "guided_choice")?);
    }
    if let Some(grammar) = &sampling.guided_grammar {
        found.push(ConstraintSpec::new("grammar", grammar.clone(), "guided_grammar"));
    }
    if let Some(pattern) = whitespace_pattern {
        // vLLM's whitespace pattern: the json-schema plugin's option of the same name.
        match found.iter_mut().find(|s| s.kind == "json-schema" || s.kind == "json-object") {
            Some(spec) => spec.set_option("whitespace_pattern", Value::String(pattern)),
            None => {
                return Err(ApiError::invalid(
                    "structured_outputs.whitespace_pattern",
                    "`structured_outputs.whitespace_pattern` applies to JSON output (`json`, `json_object`)",
                ));
            }
        }
    }
    if found.len() > 1 {
        let fields: Vec<&str> = found.iter().map(|s| s.field.as_str()).collect();
        return Err(ApiError::invalid(
            found[1].field.clone(),
            format!("only one output constraint per request; got {}", fields.join(" and ")),
        ));
    }
    Ok(found.pop())
}

fn json_object(field: &str) -> ConstraintSpec {
    let mut spec = ConstraintSpec::new("json-object", String::new(), field);
    spec.validate = Some(serde_json::json!({"type": "object"}));
    spec
}

fn string_field(value: &Value, field: &str) -> Result<String, ApiError> {
    value.as_str().map(str::to_string).ok_or_else(|| ApiError::invalid(field, format!("`{field}` must be a string")))
}

fn choice(value: &Value, field: &str) -> Result<ConstraintSpec, ApiError> {
    match value {
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_string) => {
            Ok(ConstraintSpec::new("choice", value.to_string(), field))
        }
        _ => Err(ApiError::invalid(field, format!("`{field}` must be a non-empty array of strings"))),
    }
}

fn from_response_format(format: &Value) -> Result<Option<ConstraintSpec>, ApiError> {
    let kind = format.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid("response_format.type", "`response_format.type` must be text, json_object or json_schema")
    })?;
    match kind {
        "text" => Ok(None),
        "json_object" => Ok(Some(json_object("response_format"))),
        "json_schema" => {
            let schema = format.get("json_schema").and_then(|j| j.get("schema")).ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema.schema",
                    "`response_format.json_schema.schema` is required",
                )
            })?;
            let mut spec = ConstraintSpec::json_schema(schema, "response_format.json_schema.schema")?;
            match format.get("json_schema").and_then(|j| j.get("strict")) {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(Value::Bool(true)) => spec.set_option("strict", Value::Bool(true)),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.strict",
                        "`response_format.json_schema.strict` must be a boolean",
                    ));
                }
            }
            Ok(Some(spec))
        }
        "plugin" => {
            let text = |key: &str| -> Result<String, ApiError> {
                let field = format!("response_format.{key}");
                match format.get(key) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    None if key == "source" => Ok(String::new()),
                    _ => Err(ApiError::invalid(field.clone(), format!("`{field}` must be a string"))),
                }
            };
            let options = match format.get("options") {
                None | Some(Value::Null) => String::new(),
                Some(o @ Value::Object(_)) => o.to_string(),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "response_format.options",
                        "`response_format.options` must be an object",
                    ));
                }
            };
            Ok(Some(ConstraintSpec {
                plugin: Some(text("plugin")?),
                kind: text("kind")?,
                source: text("source")?,
                options,
                field: "response_format".into(),
                validate: None,
            }))
        }
        other => Err(ApiError::invalid(
            "response_format.type",
            format!("`response_format.type` `{other}` is not supported (text, json_object, json_schema, plugin)"),
        )),
    }
}

/// One pooled instance with the constraints it has compiled.
struct Pooled {
    instance: PluginInstance,
    compiled: HashMap<CompiledKey, CompiledHandle>,
}

/// What identifies a compiled constraint within one plugin and tokenizer: kind, canonical
/// source and options.
type CompiledKey = (String, String, String);

/// Most compiled constraints kept per instance.
const COMPILED_PER_INSTANCE: usize = 64;

/// Most path trees kept per plugin and model, and their bytes in all.
const PATH_TREES: usize = 256;
const PATH_TREE_BYTES: usize = 256 << 20;

/// Instances of one plugin for one model's tokenizer, and the path trees of the constraints
/// compiled by it (DSpark's cache, shared by all requests of the model).
pub struct PluginPool {
    plugin: Arc<LoadedPlugin>,
    idle: Mutex<Vec<Pooled>>,
    trees: Mutex<TreeCache<CompiledKey>>,
}

/// Pools by plugin name for one model.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<String, Arc<PluginPool>>>,
}

impl Pools {
    fn pool(&self, plugin: &Arc<LoadedPlugin>) -> Arc<PluginPool> {
        let fresh = || {
            Arc::new(PluginPool {
                plugin: plugin.clone(),
                idle: Mutex::new(Vec::new()),
                trees: Mutex::new(TreeCache::new(PATH_TREES, PATH_TREE_BYTES)),
            })
        };
        let mut pools = lock(&self.pools);
        let pool = pools.entry(plugin.name().to_string()).or_insert_with(fresh);
        if !Arc::ptr_eq(&pool.plugin, plugin) {
            // The plugin was reloaded: its old instances run the old code, and its old trees
            // describe the old code's answers.
            *pool = fresh();
        }
        pool.clone()
    }
}

fn plugin_error(spec: &ConstraintSpec, e: PluginError) -> ApiError {
    match &e {
        PluginError::Constraint { error, .. } if error.code.is_user_error() => {
            let at = error.location.as_deref().map(|l| format!(" at {l}")).unwrap_or_default();
            ApiError::invalid(spec.field.clone(), format!("invalid {} constraint{at}: {}", spec.kind, error.message))
        }
        PluginError::Quarantined { .. } => ApiError::unavailable(e.to_string()),
        _ => ApiError::internal(e.to_string()),
    }
}

/// Compiles `spec` for a model (unless the instance taken from the pool has it already) and
/// returns the sequence's constraint. With `dspark` the constraint walks the shared path tree
/// and fast-forwards; without, it is the classic path. Blocking (compilation runs in the
/// plugin): call from a blocking task.
pub fn build(
    spec: &ConstraintSpec,
    registry: &Registry,
    pools: &Pools,
    tokenizer: &Arc<ModelTokenizer>,
    metrics: Arc<ModelMetrics>,
    vocab: usize,
    dspark: bool,
) -> Result<PluginConstraint, ApiError> {
    let plugin = match &spec.plugin {
        Some(name) => {
            let plugin = registry.get(name).ok_or_else(|| {
                ApiError::invalid(
                    "response_format.plugin",
                    format!("no plugin named `{name}` is installed (GET /v1/plugins lists them)"),
                )
            })?;
            if !plugin.serves(&spec.kind) {
                return Err(ApiError::invalid(
                    "response_format.kind",
                    format!("plugin `{name}` does not serve kind `{}`", spec.kind),
                ));
            }
            plugin
        }
        None => registry.find_kind(&spec.kind).ok_or_else(|| {
            ApiError::invalid(spec.field.clone(), format!("no installed plugin serves `{}` constraints", spec.kind))
        })?,
    };
    let pool = pools.pool(&plugin);
    let taken = lock(&pool.idle).pop();
    let mut pooled = match taken {
        Some(p) => p,
        None => {
            let table = tokenizer.tokenizer.table().clone();
            let instance = plugin.instantiate(table, tokenizer.tokenizer.clone()).map_err(|e| plugin_error(spec, e))?;
            Pooled { instance, compiled: HashMap::new() }
        }
    };
    let key = (spec.kind.clone(), spec.source.clone(), spec.options.clone());
    if !pooled.compiled.contains_key(&key) {
        if pooled.compiled.len() >= COMPILED_PER_INSTANCE {
            for (_, handle) in pooled.compiled.drain() {
                let _ = pooled.instance.drop_compiled(handle);
            }
        }
        let started = Instant::now();
        let compiled = pooled.instance.compile(&spec.kind, &spec.source, &spec.options);
        lock(&metrics.compile_seconds).observe(started.elapsed().as_secs_f64());
        match compiled {
            Ok(c) => {
                if let Some((location, message)) = c.warnings.first() {
                    tracing::warn!(
                        field = %spec.field,
                        warnings = c.warnings.len(),
                        "the constraint is approximated: at `{location}`: {message}"
                    );
                }
                pooled.compiled.insert(key.clone(), c);
            }
            Err(e) => {
                lock(&pool.idle).push(pooled);
                return Err(plugin_error(spec, e));
            }
        }
    }
    let mode = if dspark {
        Mode::Tree(TreeWalker::new(lock(&pool.trees).get(&key)))
    } else {
        Mode::Classic { pending: VecDeque::new(), pending_stop: false }
    };
    let mut source = WasmSource { pooled, key, matcher: None, vocab, metrics, failed: false };
    if !dspark {
        // The classic path asks the plugin at every step: start its matcher now.
        if let Err(e) = source.call(|_, _| Ok(())) {
            let WasmSource { pooled, .. } = source;
            lock(&pool.idle).push(pooled);
            return Err(plugin_error(spec, e));
        }
    }
    Ok(PluginConstraint { pool, source: Some(source), mode })
}

/// One sequence's own matcher in a pooled instance, created at its first use.
struct WasmSource {
    pooled: Pooled,
    key: CompiledKey,
    matcher: Option<MatcherHandle>,
    vocab: usize,
    metrics: Arc<ModelMetrics>,
    /// A call failed: the instance may be restarted and is not returned to the pool.
    failed: bool,
}

impl WasmSource {
    /// Runs one call on the sequence's matcher, made on first use. A failure marks the
    /// instance as not worth returning to the pool.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut PluginInstance, &MatcherHandle) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let matcher = match self.matcher.take() {
            Some(m) => Ok(m),
            None => match self.pooled.compiled.get(&self.key) {
                Some(compiled) => self.pooled.instance.new_matcher(compiled),
                None => Err(PluginError::InvalidOutput {
                    plugin: self.pooled.instance.plugin().name().to_string(),
                    call: "new-matcher",
                    message: "the compiled constraint was dropped".into(),
                }),
            },
        };
        let result = matcher.and_then(|m| {
            let result = f(&mut self.pooled.instance, &m);
            self.matcher = Some(m);
            result
        });
        self.failed |= result.is_err();
        result
    }
}

impl StateSource for WasmSource {
    fn commit(&mut self, tokens: &[u32]) -> anyhow::Result<(Vec<u32>, bool)> {
        let outcome = self.call(|i, m| i.commit(m, tokens))?;
        Ok((outcome.forced, outcome.stop))
    }

    fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
        let started = Instant::now();
        let mask = self.call(|i, m| i.compute_mask(m))?;
        lock(&self.metrics.mask_seconds).observe(started.elapsed().as_secs_f64());
        let width = self.vocab.max(self.pooled.instance.vocab_size());
        Ok(match mask {
            TokenMask::All => None,
            other => Some(other.to_bitset(width).into()),
        })
    }

    fn state_key(&mut self) -> anyhow::Result<u64> {
        Ok(self.call(|i, m| i.state_key(m))?)
    }
}

/// How a sequence's constraint is driven.
enum Mode {
    /// DSpark: masks and edges from the shared path tree, the plugin only on a miss; forced
    /// spans go to the engine as fast-forward chunks.
    Tree(TreeWalker),
    /// The classic path of other servers: one plugin mask per step, and a forced span's
    /// tokens sampled one step each under a mask that allows only the next one (the plugin
    /// has already moved past them: the contract's semantics).
    Classic { pending: VecDeque<u32>, pending_stop: bool },
}

/// A plugin constraint driving one sequence (see [`Mode`]).
pub struct PluginConstraint {
    pool: Arc<PluginPool>,
    source: Option<WasmSource>,
    mode: Mode,
}

/// Classic mode: a forced span waits in `pending` to be sampled one token per step.
fn defer(pending: &mut VecDeque<u32>, pending_stop: &mut bool, forced: Vec<u32>, stop: bool) -> ConstraintStep {
    pending.extend(forced);
    *pending_stop = stop;
    ConstraintStep { forced: Vec::new(), stop: pending.is_empty() && stop }
}

fn released() -> anyhow::Error {
    anyhow::anyhow!("the constraint was released")
}

fn only(token: u32, vocab: usize) -> Mask {
    let mut bits = vec![0u32; vocab.div_ceil(32).max(token as usize / 32 + 1)];
    bits[token as usize / 32] |= 1 << (token % 32);
    bits.into()
}

impl SequenceConstraint for PluginConstraint {
    fn start(&mut self) -> anyhow::Result<ConstraintStep> {
        let source = self.source.as_mut().ok_or_else(released)?;
        match &mut self.mode {
            Mode::Tree(walker) => {
                walker.start(source).map(|e| ConstraintStep { forced: e.forced.to_vec(), stop: e.stop })
            }
            Mode::Classic { pending, pending_stop } => {
                source.commit(&[]).map(|(forced, stop)| defer(pending, pending_stop, forced, stop))
            }
        }
    }

    fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
        let source = self.source.as_mut().ok_or_else(released)?;
        match &mut self.mode {
            Mode::Tree(walker) => walker.mask(source),
            Mode::Classic { pending, .. } => match pending.front() {
                Some(&next) => Ok(Some(only(next, source.vocab))),
                None => source.mask(),
            },
        }
    }

    fn commit(&mut self, token: u32) -> anyhow::Result<ConstraintStep> {
        let source = self.source.as_mut().ok_or_else(released)?;
        match &mut self.mode {
            Mode::Tree(walker) => {
                walker.commit(source, token).map(|e| ConstraintStep { forced: e.forced.to_vec(), stop: e.stop })
            }
            Mode::Classic { pending, pending_stop } => match pending.pop_front() {
                Some(next) if next == token => {
                    Ok(ConstraintStep { forced: Vec::new(), stop: pending.is_empty() && *pending_stop })
                }
                Some(next) => Err(anyhow::anyhow!("token {token} was sampled where the constraint forces {next}")),
                None => source.commit(&[token]).map(|(forced, stop)| defer(pending, pending_stop, forced, stop)),
            },
        }
    }

    fn guess(&mut self) -> Option<Guess> {
        match &self.mode {
            Mode::Tree(walker) => walker.guess().map(|(token, forced)| Guess { token, forced: forced.to_vec() }),
            Mode::Classic { .. } => None,
        }
    }

    fn masks_after(&mut self, draft: &[Guess]) -> Vec<Option<Mask>> {
        match &self.mode {
            Mode::Tree(walker) => walker.masks_after(draft.iter().map(|g| (g.token, g.forced.as_slice()))),
            Mode::Classic { .. } => Vec::new(),
        }
    }
}

impl Drop for PluginConstraint {
    fn drop(&mut self) {
        if let Some(source) = self.source.take() {
            self.pool_return(source);
        }
    }
}

impl PluginConstraint {
    fn pool_return(&self, source: WasmSource) {
        let WasmSource { mut pooled, matcher, failed, metrics, .. } = source;
        if let Mode::Tree(walker) = &self.mode {
            let stats = walker.stats();
            metrics.path_tree_hits.add(stats.hits);
            metrics.path_tree_misses.add(stats.misses);
        }
        if failed {
            // A stale or failed instance is not worth keeping.
            return;
        }
        if let Some(m) = matcher
            && pooled.instance.drop_matcher(m).is_err()
        {
            return;
        }
        lock(&self.pool.idle).push(pooled);
    }
}
