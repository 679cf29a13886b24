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
//! The last row is dspark's extension: any plugin of the registry, by name. Everything else
//! goes to the plugin that serves the kind. `response_format: {"type": "text"}` is no
//! constraint.
//!
//! Compilation errors of the plugin (a bad schema, an unsupported keyword) are 400s with the
//! plugin's message and JSON pointer. Instances are pooled per plugin and model: a request
//! takes one for its lifetime (a Wasm store runs one call at a time) and gives it back, with
//! its compiled constraints cached by source, when it ends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dspark_host::engine::{ConstraintStep, ModelTokenizer, SequenceConstraint};
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
                "json_object"
                | "disable_fallback"
                | "disable_any_whitespace"
                | "disable_additional_properties"
                | "whitespace_pattern"
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
            Ok(Some(ConstraintSpec::json_schema(schema, "response_format.json_schema.schema")?))
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
    compiled: HashMap<(String, String, String), CompiledHandle>,
}

/// Most compiled constraints kept per instance.
const COMPILED_PER_INSTANCE: usize = 64;

/// Instances of one plugin for one model's tokenizer.
pub struct PluginPool {
    plugin: Arc<LoadedPlugin>,
    idle: Mutex<Vec<Pooled>>,
}

/// Pools by plugin name for one model.
#[derive(Default)]
pub struct Pools {
    pools: Mutex<HashMap<String, Arc<PluginPool>>>,
}

impl Pools {
    fn pool(&self, plugin: &Arc<LoadedPlugin>) -> Arc<PluginPool> {
        let fresh = || Arc::new(PluginPool { plugin: plugin.clone(), idle: Mutex::new(Vec::new()) });
        let mut pools = lock(&self.pools);
        let pool = pools.entry(plugin.name().to_string()).or_insert_with(fresh);
        if !Arc::ptr_eq(&pool.plugin, plugin) {
            // The plugin was reloaded: its old instances run the old code.
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

/// Compiles `spec` for a model and returns a matcher at its start. Blocking (compilation
/// runs in the plugin): call from a blocking task.
pub fn build(
    spec: &ConstraintSpec,
    registry: &Registry,
    pools: &Pools,
    tokenizer: &Arc<ModelTokenizer>,
    metrics: Arc<ModelMetrics>,
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
                pooled.compiled.insert(key.clone(), c);
            }
            Err(e) => {
                lock(&pool.idle).push(pooled);
                return Err(plugin_error(spec, e));
            }
        }
    }
    let matcher = match pooled.compiled.get(&key).map(|c| pooled.instance.new_matcher(c)) {
        Some(Ok(m)) => m,
        Some(Err(e)) => {
            pooled.compiled.remove(&key);
            lock(&pool.idle).push(pooled);
            return Err(plugin_error(spec, e));
        }
        None => return Err(ApiError::internal("compiled constraint vanished")),
    };
    Ok(PluginConstraint {
        pool,
        pooled: Some(pooled),
        matcher: Some(matcher),
        vocab: 0,
        metrics,
        fast_forward: true,
        pending: VecDeque::new(),
        pending_stop: false,
    })
}

/// A plugin matcher driving one sequence: one plugin mask per sampled token.
///
/// With fast-forward (an entry's `dspark: true`), a forced span the plugin returns goes to the
/// engine as a chunk appended without sampling. Without it (`dspark: false`, the classic path
/// of other servers), the span's tokens are sampled one step each under a mask that allows
/// only the next one; the plugin has already moved past them (the contract's semantics), so
/// those masks are made here.
pub struct PluginConstraint {
    pool: Arc<PluginPool>,
    pooled: Option<Pooled>,
    matcher: Option<MatcherHandle>,
    vocab: usize,
    metrics: Arc<ModelMetrics>,
    fast_forward: bool,
    pending: VecDeque<u32>,
    pending_stop: bool,
}

impl PluginConstraint {
    /// Sets the logits width masks are expanded to.
    pub fn with_vocab(mut self, vocab: usize) -> Self {
        self.vocab = vocab;
        self
    }

    /// Turns fast-forward off (the classic path) or on.
    pub fn with_fast_forward(mut self, on: bool) -> Self {
        self.fast_forward = on;
        self
    }

    /// Applies a plugin's answer: forced tokens go to the engine (fast-forward) or wait to be
    /// sampled one per step (classic).
    fn step(&mut self, forced: Vec<u32>, stop: bool) -> ConstraintStep {
        if self.fast_forward {
            return ConstraintStep { forced, stop };
        }
        self.pending.extend(forced);
        self.pending_stop = stop;
        ConstraintStep { forced: Vec::new(), stop: self.pending.is_empty() && stop }
    }

    fn parts(&mut self) -> anyhow::Result<(&mut PluginInstance, &MatcherHandle)> {
        match (self.pooled.as_mut(), self.matcher.as_ref()) {
            (Some(p), Some(m)) => Ok((&mut p.instance, m)),
            _ => anyhow::bail!("the constraint was released"),
        }
    }
}

impl SequenceConstraint for PluginConstraint {
    fn start(&mut self) -> anyhow::Result<ConstraintStep> {
        let (instance, matcher) = self.parts()?;
        let outcome = instance.commit(matcher, &[])?;
        Ok(self.step(outcome.forced, outcome.stop))
    }

    fn mask(&mut self) -> anyhow::Result<Option<Vec<u32>>> {
        let vocab = self.vocab;
        if let Some(&next) = self.pending.front() {
            let mut only = vec![0u32; vocab.div_ceil(32).max(next as usize / 32 + 1)];
            only[next as usize / 32] |= 1 << (next % 32);
            return Ok(Some(only));
        }
        let metrics = self.metrics.clone();
        let started = Instant::now();
        let (instance, matcher) = self.parts()?;
        let mask = instance.compute_mask(matcher)?;
        lock(&metrics.mask_seconds).observe(started.elapsed().as_secs_f64());
        Ok(match mask {
            TokenMask::All => None,
            other => Some(other.to_bitset(vocab.max(instance.vocab_size()))),
        })
    }

    fn commit(&mut self, token: u32) -> anyhow::Result<ConstraintStep> {
        if let Some(next) = self.pending.pop_front() {
            anyhow::ensure!(next == token, "token {token} was sampled where the constraint forces {next}");
            return Ok(ConstraintStep { forced: Vec::new(), stop: self.pending.is_empty() && self.pending_stop });
        }
        let (instance, matcher) = self.parts()?;
        let outcome = instance.commit(matcher, &[token])?;
        Ok(self.step(outcome.forced, outcome.stop))
    }
}

impl Drop for PluginConstraint {
    fn drop(&mut self) {
        if let (Some(mut pooled), Some(matcher)) = (self.pooled.take(), self.matcher.take()) {
            // A stale or failed instance is not worth keeping.
            if pooled.instance.drop_matcher(matcher).is_ok() {
                lock(&self.pool.idle).push(pooled);
            }
        }
    }
}
