//! The built-in `json-schema` plugin: the output is a JSON document valid under a schema.
//!
//! Kinds:
//! - `json-schema`: the source is a JSON Schema (drafts 4, 6, 7, 2019-09, 2020-12);
//! - `json-object`: any JSON object (OpenAI's `json_object` mode); the source is ignored;
//! - `json-value`: any JSON value; the source is ignored.
//!
//! Data flow: [`compile`] normalises the schema (inlines `$ref`, merges `allOf`, pushes sibling
//! keywords into `anyOf`/`oneOf` branches) into a [`graph::Graph`] of value shapes;
//! [`recognizer::SchemaRecognizer`] walks that graph byte by byte as a pushdown automaton,
//! and the SDK turns it into token masks and canonical forced spans (key names, punctuation,
//! the rest of an enum value once unique, `true`/`false`/`null` tails, closing brackets).
//!
//! Serialisation is compact (no whitespace). Options (a JSON object):
//! - `"property_order"`: `"schema"` (default: declared properties in schema order, which lets
//!   key names be forced) or `"any"`;
//! - `"draft"`: `"4"`, `"6"`, `"7"`, `"2019-09"` or `"2020-12"` when the schema has no
//!   `$schema` (default 2020-12).

pub mod compile;
pub mod formats;
pub mod graph;
pub mod recognizer;
pub mod stack;
pub mod strings;

use std::sync::Arc;

use dspark_guest::{CompiledConstraint, ConstraintError, ErrorCode, Plugin, RecognizerConstraint, TokenTable};
use serde_json::Value;

use graph::PropertyOrder;
use recognizer::SchemaRecognizer;

/// The kinds this plugin serves.
pub const KINDS: [&str; 3] = ["json-schema", "json-object", "json-value"];

/// Sources longer than this are refused: four times the largest schema of JSONSchemaBench
/// (0.9 MB), and small enough that parsing and compiling stay within the plugin's memory.
pub const MAX_SOURCE_BYTES: usize = 4 << 20;

/// Parses the plugin's options.
pub fn parse_options(options: &str) -> Result<(PropertyOrder, Option<String>), ConstraintError> {
    if options.trim().is_empty() {
        return Ok((PropertyOrder::Schema, None));
    }
    let bad = |m: String| ConstraintError::new(ErrorCode::InvalidOptions, m);
    let v: Value = serde_json::from_str(options).map_err(|e| bad(format!("options are not valid JSON: {e}")))?;
    let map = v.as_object().ok_or_else(|| bad("options must be a JSON object".into()))?;
    let mut order = PropertyOrder::Schema;
    let mut draft = None;
    for (k, v) in map {
        match (k.as_str(), v.as_str()) {
            ("draft", Some(d @ ("4" | "6" | "7" | "2019-09" | "2020-12"))) => draft = Some(d.to_string()),
            ("draft", _) => {
                return Err(bad("`draft` must be one of \"4\", \"6\", \"7\", \"2019-09\", \"2020-12\"".into()));
            }
            ("property_order", Some("schema")) => order = PropertyOrder::Schema,
            ("property_order", Some("any")) => order = PropertyOrder::Any,
            ("property_order", _) => return Err(bad("`property_order` must be \"schema\" or \"any\"".into())),
            (other, _) => return Err(bad(format!("unknown option `{other}`; known: property_order, draft"))),
        }
    }
    Ok((order, draft))
}

/// Compiles a source of `kind` into a recogniser and its warnings.
pub fn compile_recognizer(
    kind: &str,
    source: &str,
    options: &str,
) -> Result<(SchemaRecognizer, Vec<dspark_guest::Warning>), ConstraintError> {
    dspark_guest::check_kind(kind, &KINDS)?;
    let (order, draft) = parse_options(options)?;
    match kind {
        "json-object" => Ok((SchemaRecognizer::new(compile::Compiler::any(true, order)), Vec::new())),
        "json-value" => Ok((SchemaRecognizer::new(compile::Compiler::any(false, order)), Vec::new())),
        _ => {
            if source.len() > MAX_SOURCE_BYTES {
                return Err(ConstraintError::new(
                    ErrorCode::TooLarge,
                    format!("the schema is {} bytes; the limit is {MAX_SOURCE_BYTES}", source.len()),
                ));
            }
            let schema: Value = serde_json::from_str(source).map_err(|e| {
                if e.to_string().contains("recursion limit") {
                    ConstraintError::new(ErrorCode::TooLarge, format!("the schema nests deeper than 128 levels: {e}"))
                } else {
                    ConstraintError::new(ErrorCode::InvalidSource, format!("the schema is not valid JSON: {e}"))
                }
            })?;
            let (graph, warnings) = compile::Compiler::with_draft(&schema, draft.as_deref()).compile(order)?;
            Ok((SchemaRecognizer::new(graph), warnings))
        }
    }
}

/// The plugin.
#[derive(Default)]
pub struct JsonSchemaPlugin;

impl Plugin for JsonSchemaPlugin {
    fn kinds(&self) -> Vec<String> {
        KINDS.iter().map(|k| k.to_string()).collect()
    }

    fn compile(
        &self,
        kind: &str,
        source: &str,
        options: &str,
        table: &Arc<TokenTable>,
    ) -> Result<Arc<dyn CompiledConstraint>, ConstraintError> {
        let (rec, warnings) = compile_recognizer(kind, source, options)?;
        // Classify the vocabulary for in-string masks now, under the compile deadline, rather
        // than at the first mask (once per tokenizer table, then cached).
        strings::warm_up(table);
        Ok(RecognizerConstraint::new(rec, table, warnings))
    }
}

#[cfg(feature = "export")]
dspark_guest::export_plugin!(JsonSchemaPlugin);
