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
//! A schema that admits no value at all is an `invalid-source` error at compile time, so the
//! server answers 400 instead of starting a generation that can only end at a dead end:
//! `false`, a circular `$ref` with no base case, contradictory types or `const`, a required
//! member that cannot appear, numeric bounds no number (or integer, or integral multiple)
//! fits, a `pattern` that matches no text, lengths or item and member counts that contradict.
//! Parts that admit nothing inside a schema that admits something are pruned.
//!
//! Serialisation is compact (no whitespace) unless the options say otherwise. Options (a JSON
//! object):
//! - `"property_order"`: `"schema"` (default: declared properties in schema order, which lets
//!   key names be forced) or `"any"`;
//! - `"draft"`: `"4"`, `"6"`, `"7"`, `"2019-09"` or `"2020-12"` when the schema has no
//!   `$schema` (default 2020-12);
//! - `"strict": true` (OpenAI's strict mode): an approximation that could let through a value
//!   the schema rejects (`uniqueItems` not enforced, `oneOf` as `anyOf`, an unknown format, a
//!   format whose pattern admits more than it, a bound beyond 2^53, `multipleOf` on
//!   non-integers, checked in floating point with a tolerance) is an `unsupported` error at
//!   its pointer instead of a warning. Warnings that only leave valid values out (`oneOf`
//!   enforced strictly, `hostname` and `email` by patterns) or that report a keyword JSON
//!   Schema says to ignore stay warnings;
//! - `"whitespace": "flexible"`: any JSON whitespace wherever JSON allows it, at most
//!   `"max_whitespace"` bytes per gap (default 20, so a model cannot loop on blank lines);
//! - `"whitespace_pattern"`: a regex the whitespace of every gap must match (vLLM's and
//!   Outlines' option, e.g. `"[ ]?"`); it must match the empty string;
//! - `"separators": [item, key]`: Python `json.dumps` separators, e.g. `[", ", ": "]`, the
//!   style most models write; each is `,` or `:` followed by whitespace only;
//! - `"indent": N`: pretty-printed like `json.dumps(indent=N)`: a newline and N spaces per
//!   level inside non-empty objects and arrays (at most 32 levels deep).
//!
//! Fixed layouts (`separators`, `indent`) are forced: the host fast-forwards them; free
//! whitespace is the model's choice at every gap.

pub mod compile;
pub mod formats;
pub mod graph;
pub mod recognizer;
pub mod stack;
pub mod strings;
pub mod values;

use std::sync::Arc;

use dspark_guest::{CompiledConstraint, ConstraintError, ErrorCode, Plugin, RecognizerConstraint, TokenTable};
use serde_json::Value;

use graph::PropertyOrder;
use recognizer::{Layout, SchemaRecognizer};

/// The kinds this plugin serves.
pub const KINDS: [&str; 3] = ["json-schema", "json-object", "json-value"];

/// Sources longer than this are refused: four times the largest schema of JSONSchemaBench
/// (0.9 MB), and small enough that parsing and compiling stay within the plugin's memory.
pub const MAX_SOURCE_BYTES: usize = 4 << 20;

/// The plugin's options, parsed.
#[derive(Debug, Default)]
pub struct Options {
    /// Property order.
    pub order: PropertyOrder,
    /// The draft for schemas without `$schema`.
    pub draft: Option<String>,
    /// Whitespace between tokens.
    pub layout: Layout,
    /// Strict mode: an approximation that could let an invalid value through is an error.
    pub strict: bool,
}

/// The most bytes `max_whitespace` may allow per gap.
pub const MAX_WHITESPACE: u32 = 255;

/// Parses the plugin's options (see the crate docs).
pub fn parse_options(options: &str) -> Result<Options, ConstraintError> {
    let mut out = Options::default();
    if options.trim().is_empty() {
        return Ok(out);
    }
    let bad = |m: String| ConstraintError::new(ErrorCode::InvalidOptions, m);
    let v: Value = serde_json::from_str(options).map_err(|e| bad(format!("options are not valid JSON: {e}")))?;
    let map = v.as_object().ok_or_else(|| bad("options must be a JSON object".into()))?;
    let mut flexible = false;
    let mut max_ws: Option<u32> = None;
    let mut pattern: Option<String> = None;
    let mut separators: Option<(Vec<u8>, Vec<u8>)> = None;
    let mut indent: Option<u8> = None;
    for (k, v) in map {
        match (k.as_str(), v) {
            ("draft", Value::String(d)) if matches!(d.as_str(), "4" | "6" | "7" | "2019-09" | "2020-12") => {
                out.draft = Some(d.clone())
            }
            ("draft", _) => {
                return Err(bad("`draft` must be one of \"4\", \"6\", \"7\", \"2019-09\", \"2020-12\"".into()));
            }
            ("property_order", Value::String(o)) if o == "schema" => out.order = PropertyOrder::Schema,
            ("property_order", Value::String(o)) if o == "any" => out.order = PropertyOrder::Any,
            ("property_order", _) => return Err(bad("`property_order` must be \"schema\" or \"any\"".into())),
            ("strict", Value::Bool(b)) => out.strict = *b,
            ("strict", _) => return Err(bad("`strict` must be true or false".into())),
            ("whitespace", Value::String(w)) if w == "compact" => flexible = false,
            ("whitespace", Value::String(w)) if w == "flexible" => flexible = true,
            ("whitespace", _) => return Err(bad("`whitespace` must be \"compact\" or \"flexible\"".into())),
            ("max_whitespace", n) => {
                max_ws = Some(
                    n.as_u64()
                        .filter(|n| (1..=MAX_WHITESPACE as u64).contains(n))
                        .ok_or_else(|| bad(format!("`max_whitespace` must be an integer from 1 to {MAX_WHITESPACE}")))?
                        as u32,
                )
            }
            ("whitespace_pattern", Value::String(p)) => pattern = Some(p.clone()),
            ("whitespace_pattern", _) => return Err(bad("`whitespace_pattern` must be a regex string".into())),
            ("separators", Value::Array(pair)) if pair.len() == 2 => {
                let part = |i: usize, sep: char| -> Result<Vec<u8>, ConstraintError> {
                    let text = pair[i].as_str().unwrap_or_default();
                    match text.strip_prefix(sep) {
                        Some(rest) if rest.bytes().all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) => {
                            Ok(rest.as_bytes().to_vec())
                        }
                        _ => Err(bad(format!(
                            "`separators` is [item, key] as in Python's json.dumps, each `{sep}` followed only by whitespace; got {}",
                            pair[i]
                        ))),
                    }
                };
                separators = Some((part(0, ',')?, part(1, ':')?));
            }
            ("separators", _) => return Err(bad("`separators` must be [item, key], e.g. [\", \", \": \"]".into())),
            ("indent", n) => {
                indent = Some(
                    n.as_u64()
                        .filter(|n| *n <= 16)
                        .ok_or_else(|| bad("`indent` must be an integer from 0 to 16".into()))?
                        as u8,
                )
            }
            (other, _) => {
                return Err(bad(format!(
                    "unknown option `{other}`; known: property_order, draft, strict, whitespace, max_whitespace, whitespace_pattern, separators, indent"
                )));
            }
        }
    }
    let free = flexible || pattern.is_some();
    if free && (separators.is_some() || indent.is_some()) {
        return Err(bad("free whitespace (`whitespace: flexible`, `whitespace_pattern`) and a fixed layout (`separators`, `indent`) exclude each other".into()));
    }
    if max_ws.is_some() && !flexible {
        return Err(bad("`max_whitespace` applies to `whitespace: \"flexible\"`".into()));
    }
    if flexible && pattern.is_some() {
        return Err(bad("give `whitespace: \"flexible\"` or `whitespace_pattern`, not both".into()));
    }
    let ws_regex = match (flexible, pattern) {
        (true, _) => Some(format!("[ \\t\\n\\r]{{0,{}}}", max_ws.unwrap_or(DEFAULT_MAX_WHITESPACE))),
        (false, Some(p)) => Some(p),
        (false, None) => None,
    };
    let ws = match ws_regex {
        None => None,
        Some(p) => Some(whitespace_dfa(&p).map_err(|e| bad(format!("`whitespace_pattern`: {e}")))?),
    };
    // As json.dumps: with an indent and no separators, `": "` after keys and `","` between
    // items (the newline follows).
    let (item_after, key_after) = match (separators, indent) {
        (Some(s), _) => s,
        (None, Some(_)) => (Vec::new(), b" ".to_vec()),
        (None, None) => Default::default(),
    };
    out.layout = Layout::new(ws, key_after, item_after, indent);
    Ok(out)
}

/// Bytes of free whitespace per gap with `whitespace: "flexible"` and no `max_whitespace`:
/// room for a newline and an indentation, not for a model to loop on spaces.
pub const DEFAULT_MAX_WHITESPACE: u32 = 20;

/// The automaton of a whitespace pattern, which must also match the empty string (so that
/// every gap may stay empty).
fn whitespace_dfa(pattern: &str) -> Result<regex_automata::dfa::dense::DFA<Vec<u32>>, String> {
    use regex_automata::dfa::Automaton;
    let dfa = regex_automata::dfa::dense::Builder::new()
        .configure(
            regex_automata::dfa::dense::Config::new()
                .start_kind(regex_automata::dfa::StartKind::Anchored)
                .match_kind(regex_automata::MatchKind::All)
                .dfa_size_limit(Some(1 << 20))
                .determinize_size_limit(Some(1 << 20)),
        )
        .build(&format!("(?:{pattern})\\z"))
        .map_err(|e| format!("cannot compile it: {e}"))?;
    let start = dfa
        .start_state(&regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes))
        .map_err(|e| e.to_string())?;
    if !dfa.is_match_state(dfa.next_eoi_state(start)) {
        return Err(format!("{pattern:?} must match the empty string (a gap between tokens may be empty)"));
    }
    Ok(dfa)
}

/// Compiles a source of `kind` into a recogniser and its warnings.
pub fn compile_recognizer(
    kind: &str,
    source: &str,
    options: &str,
) -> Result<(SchemaRecognizer, Vec<dspark_guest::Warning>), ConstraintError> {
    dspark_guest::check_kind(kind, &KINDS)?;
    let Options { order, draft, layout, strict } = parse_options(options)?;
    match kind {
        "json-object" => Ok((SchemaRecognizer::with_layout(compile::Compiler::any(true, order), layout), Vec::new())),
        "json-value" => Ok((SchemaRecognizer::with_layout(compile::Compiler::any(false, order), layout), Vec::new())),
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
            let (graph, warnings) = compile::Compiler::with_draft(&schema, draft.as_deref()).compile(order, strict)?;
            Ok((SchemaRecognizer::with_layout(graph, layout), warnings))
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
