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
//! what strict mode cannot guarantee.
//!
//! The spec becomes a host [`ConstraintRequest`]; compiling it, pooling plugin instances and
//! driving the path tree are the host's constraint runtime ([`dspark_host::constraint`]).
//! [`api_error`] maps the runtime's typed errors to OpenAI error bodies naming the field.

use dspark_host::constraint::{BuildError, ConstraintRequest};
use serde_json::Value;

use crate::serving::error::ApiError;

/// What to compile, and where in the request it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstraintSpec {
    /// Plugin (or the one serving the kind), kind, source and options.
    pub request: ConstraintRequest,
    /// The request field it came from, for error messages.
    pub field: String,
    /// For JSON kinds, the schema finished answers must validate against (`Value::Bool(true)`
    /// for any JSON).
    pub validate: Option<Value>,
}

impl ConstraintSpec {
    fn new(kind: &str, source: String, field: &str) -> Self {
        Self { request: ConstraintRequest::new(kind, source), field: field.into(), validate: None }
    }

    /// The constraint kind.
    pub fn kind(&self) -> &str {
        &self.request.kind
    }

    /// The `tool-call` plugin's constraint for a request's tools (see [`super::tools`]).
    pub fn tool_call(source: String) -> Self {
        Self::new("tool-call", source, "tools")
    }

    /// Sets one of the plugin's options, keeping the others.
    pub fn set_option(&mut self, key: &str, value: Value) {
        let mut options = match serde_json::from_str::<Value>(&self.request.options) {
            Ok(Value::Object(map)) => map,
            _ => serde_json::Map::new(),
        };
        options.insert(key.to_string(), value);
        self.request.options = Value::Object(options).to_string();
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
pub fn from_request(sampling: &super::request::Sampling) -> Result<Option<ConstraintSpec>, ApiError> {
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
        match found.iter_mut().find(|s| s.kind() == "json-schema" || s.kind() == "json-object") {
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
                request: ConstraintRequest {
                    plugin: Some(text("plugin")?),
                    kind: text("kind")?,
                    source: text("source")?,
                    options,
                },
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

/// The OpenAI error for a constraint the runtime could not build from `spec`: a 400 naming
/// the field for the request's faults, a 503 for a plugin that cannot serve (quarantined, or
/// failed to load), a 500 otherwise.
pub fn api_error(spec: &ConstraintSpec, e: BuildError) -> ApiError {
    match &e {
        BuildError::NoSuchPlugin { .. } => {
            ApiError::invalid("response_format.plugin", format!("{e} (GET /v1/plugins lists them)"))
        }
        BuildError::KindNotServed { .. } => ApiError::invalid("response_format.kind", e.to_string()),
        // Plugins that declare the kind exist but cannot serve: the server's fault, not the
        // request's.
        BuildError::NoPluginForKind { unavailable, .. } if !unavailable.is_empty() => {
            ApiError::plugin_unavailable(e.to_string())
        }
        BuildError::NoPluginForKind { .. } | BuildError::Invalid { .. } | BuildError::TooCostly { .. } => {
            ApiError::invalid(spec.field.clone(), e.to_string())
        }
        BuildError::Unavailable(_) | BuildError::PluginFailed { .. } => ApiError::plugin_unavailable(e.to_string()),
        BuildError::Plugin(_) => ApiError::internal(e.to_string()),
    }
}
