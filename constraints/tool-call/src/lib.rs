//! The built-in `tool-call` plugin: the output is tool calls in the model family's syntax,
//! each naming one of the request's tools with arguments valid under that tool's parameter
//! schema.
//!
//! Kind `tool-call`. The source is a JSON object built by the server from the request:
//!
//! ```json
//! {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {...}}}],
//!  "tool_choice": "auto", "parallel_tool_calls": true, "format": "hermes"}
//! ```
//!
//! - `tools`: OpenAI tool definitions (names of letters, digits, `_`, `-`, `.`, `:`; at most
//!   64 bytes). A tool without `parameters` takes none: its arguments are `{}`.
//! - `tool_choice`: `"auto"` (free text; once the model writes the format's trigger, the
//!   calls are constrained, a lazy trigger), `"required"` (the output is one or more calls),
//!   or `{"type": "function", "function": {"name": N}}` (exactly one call of N). `"none"` is
//!   no constraint at all and is refused here: the server does not compile one.
//! - `parallel_tool_calls` (default `true`): whether more than one call may be written.
//! - `format`: `hermes`, `llama3`, `mistral` or `generic` (default); see [`syntax`].
//!
//! Options are the json-schema plugin's (`property_order`, `draft`) and apply to every tool's
//! parameters; a tool with OpenAI's `function.strict: true` has its parameters compiled in that
//! plugin's strict mode as well. The arguments are compiled by the json-schema compiler used as
//! a library, so a tool's arguments are held to exactly what the json-schema plugin holds a
//! document to, with its warnings (pointers prefixed with the tool's place in the source) and
//! its errors.
//!
//! Data flow: [`ToolCallRecognizer`] is a byte recogniser that runs literal texts, a name
//! chooser over the sorted tool names and, for the arguments, the chosen tool's
//! [`SchemaRecognizer`]; the SDK turns it into masks and canonical forced spans, so the
//! format's punctuation, a name once unique and the arguments' key names are fast-forwarded.

pub mod syntax;

use std::sync::{Arc, Mutex};

use dspark_guest::{
    CompiledConstraint, ConstraintError, ErrorCode, Plugin, Recognizer, RecognizerConstraint, StateTable, TokenSet,
    TokenTable, TokenTrie, Warning, key,
};
use dspark_plugin_json_schema::recognizer::{SchemaRecognizer, State as ArgsState};
use serde_json::Value;

pub use syntax::{Format, Parsed, ParsedCall, Syntax};

/// The kinds this plugin serves.
pub const KINDS: [&str; 1] = ["tool-call"];
/// Most tools per request.
pub const MAX_TOOLS: usize = 512;
/// Longest tool name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// What the model must or may do with the tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Free text, or tool calls once the model opens them.
    Auto,
    /// At least one call.
    Required,
    /// Exactly one call of this function.
    Named(String),
}

/// One tool: its name and its arguments' recogniser.
struct Tool {
    name: Vec<u8>,
    args: SchemaRecognizer,
}

/// Which literal a [`State::Lit`] is inside.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Literal {
    /// From the trigger (or the start) to the first name.
    First,
    /// Between a name and its arguments.
    NameToArgs,
    /// After the arguments.
    Close,
    /// Between a call's close and the next name.
    More,
    /// After the last call.
    End,
}

/// Where the recogniser is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Free text (`auto`), with the length of the trigger prefix the text ends with.
    Text {
        /// Trigger bytes matched so far.
        matched: u16,
    },
    /// Inside a literal text.
    Lit {
        /// Which.
        lit: Literal,
        /// Bytes of it written.
        at: u16,
        /// The chosen tool (for [`Literal::NameToArgs`]).
        tool: u16,
    },
    /// Inside a name: the tools whose names start with what was written are `lo..hi` of the
    /// sorted list.
    Name {
        /// Name bytes written.
        at: u16,
        /// First candidate.
        lo: u16,
        /// One past the last candidate.
        hi: u16,
    },
    /// Inside the arguments of `tool`.
    Args {
        /// The chosen tool.
        tool: u16,
        /// The arguments recogniser's state.
        inner: ArgsState,
    },
    /// A call is complete: another may follow, or the end.
    AfterCall,
    /// The calls are closed; nothing may follow.
    Done,
}

/// The recogniser of one request's tool calls (see the crate docs).
pub struct ToolCallRecognizer {
    tools: Vec<Tool>,
    trigger: Vec<u8>,
    /// KMP failure function of the trigger.
    fail: Vec<u16>,
    first: Vec<u8>,
    name_to_args: Vec<u8>,
    close: Vec<u8>,
    more: Vec<u8>,
    end: Vec<u8>,
    free_text: bool,
    parallel: bool,
    /// The states mask walks met, tabulated (see [`StateTable`]).
    walks: Mutex<StateTable<State>>,
}

impl ToolCallRecognizer {
    fn literal(&self, lit: Literal) -> &[u8] {
        match lit {
            Literal::First => &self.first,
            Literal::NameToArgs => &self.name_to_args,
            Literal::Close => &self.close,
            Literal::More => &self.more,
            Literal::End => &self.end,
        }
    }

    /// The state at byte `at` of `lit`, moving on to what follows once it is complete.
    fn settle(&self, lit: Literal, at: usize, tool: u16) -> State {
        if at < self.literal(lit).len() {
            return State::Lit { lit, at: at as u16, tool };
        }
        match lit {
            Literal::First | Literal::More => State::Name { at: 0, lo: 0, hi: self.tools.len() as u16 },
            Literal::NameToArgs => State::Args { tool, inner: self.tools[tool as usize].args.start() },
            Literal::Close => State::AfterCall,
            Literal::End => State::Done,
        }
    }

    /// The next trigger match length after `byte` (Knuth–Morris–Pratt).
    fn trigger_step(&self, mut matched: usize, byte: u8) -> usize {
        loop {
            if self.trigger[matched] == byte {
                return matched + 1;
            }
            if matched == 0 {
                return 0;
            }
            matched = self.fail[matched - 1] as usize;
        }
    }

    /// Whether `state` accepts all of `bytes`.
    /// Inserts into `set` the tokens of `trie` this recogniser accepts from `state`.
    fn fill_trie(&self, state: &State, trie: &TokenTrie, set: &mut TokenSet) {
        self.walks.lock().unwrap_or_else(|p| p.into_inner()).fill_trie(self, state, trie, set);
    }

    /// Whether the output so far admits free text (for tests and docs).
    pub fn is_free_text(&self, state: &State) -> bool {
        matches!(state, State::Text { .. })
    }
}

impl Recognizer for ToolCallRecognizer {
    type State = State;

    fn start(&self) -> State {
        if self.free_text { State::Text { matched: 0 } } else { self.settle(Literal::First, 0, 0) }
    }

    fn advance(&self, state: &State, byte: u8) -> Option<State> {
        match state {
            State::Text { matched } => {
                let m = self.trigger_step(*matched as usize, byte);
                Some(if m == self.trigger.len() {
                    self.settle(Literal::First, m, 0)
                } else {
                    State::Text { matched: m as u16 }
                })
            }
            State::Lit { lit, at, tool } => {
                (self.literal(*lit)[*at as usize] == byte).then(|| self.settle(*lit, *at as usize + 1, *tool))
            }
            State::Name { at, lo, hi } => {
                let at = *at as usize;
                let candidates = &self.tools[*lo as usize..*hi as usize];
                if byte == b'"' {
                    // The quote that closes the name is the first byte of `name_to_args`. The
                    // shortest candidate sorts first; it is complete when it ends here.
                    return (candidates[0].name.len() == at).then(|| self.settle(Literal::NameToArgs, 1, *lo));
                }
                let first = candidates.iter().position(|t| t.name.get(at) == Some(&byte))?;
                let count = candidates[first..].iter().take_while(|t| t.name.get(at) == Some(&byte)).count();
                let lo = *lo + first as u16;
                Some(State::Name { at: at as u16 + 1, lo, hi: lo + count as u16 })
            }
            State::Args { tool, inner } => {
                let args = &self.tools[*tool as usize].args;
                if let Some(next) = args.advance(inner, byte) {
                    return Some(State::Args { tool: *tool, inner: next });
                }
                if args.is_accepting(inner) {
                    return self.advance(&self.settle(Literal::Close, 0, 0), byte);
                }
                None
            }
            State::AfterCall => {
                if self.parallel && self.more.first() == Some(&byte) {
                    Some(self.settle(Literal::More, 1, 0))
                } else if self.end.first() == Some(&byte) {
                    Some(self.settle(Literal::End, 1, 0))
                } else {
                    None
                }
            }
            State::Done => None,
        }
    }

    fn is_accepting(&self, state: &State) -> bool {
        match state {
            State::Text { .. } | State::Done => true,
            State::AfterCall => self.end.is_empty(),
            _ => false,
        }
    }

    fn state_key(&self, state: &State) -> u64 {
        key::of(state)
    }

    fn forced_byte(&self, state: &State) -> Option<u8> {
        match state {
            State::Text { .. } | State::Done => None,
            State::Lit { lit, at, .. } => Some(self.literal(*lit)[*at as usize]),
            State::Name { at, lo, hi } => {
                let at = *at as usize;
                let candidates = &self.tools[*lo as usize..*hi as usize];
                if candidates[0].name.len() == at {
                    return (candidates.len() == 1).then_some(b'"');
                }
                let byte = candidates[0].name[at];
                candidates.iter().all(|t| t.name[at] == byte).then_some(byte)
            }
            State::Args { tool, inner } => {
                let args = &self.tools[*tool as usize].args;
                if !args.is_accepting(inner) {
                    args.forced_byte(inner)
                } else if args.can_extend(inner) {
                    None
                } else {
                    self.close.first().copied()
                }
            }
            // Another call or the end: forced only when the end is the one way on.
            State::AfterCall => {
                if self.parallel {
                    None
                } else {
                    self.end.first().copied()
                }
            }
        }
    }

    fn can_extend(&self, state: &State) -> bool {
        match state {
            State::Done => false,
            State::AfterCall => self.parallel || !self.end.is_empty(),
            _ => true,
        }
    }

    fn fill_mask(&self, state: &State, table: &TokenTable, set: &mut TokenSet) -> bool {
        let State::Args { tool, inner } = state else { return false };
        let args = &self.tools[*tool as usize].args;
        // The arguments' state accepts what any of its configurations accepts: each one in a
        // string takes the json-schema plugin's fast path (with tokens that leave the string
        // checked against this recogniser), the others walk the trie.
        let parts = inner.split();
        if !parts.iter().any(dspark_plugin_json_schema::strings::is_string_state) {
            return false;
        }
        for part in parts {
            let outer = State::Args { tool: *tool, inner: part };
            let State::Args { inner: part, .. } = &outer else { continue };
            let fast = dspark_plugin_json_schema::strings::fill_embedded_string_mask(
                args,
                part,
                table,
                set,
                &|trie: &TokenTrie, set: &mut TokenSet| self.fill_trie(&outer, trie, set),
            );
            if !fast {
                self.fill_trie(&outer, table.trie(), set);
            }
        }
        true
    }
}

/// The KMP failure function: `fail[i]` is the length of the longest proper border of
/// `pattern[..=i]`.
fn failure(pattern: &[u8]) -> Vec<u16> {
    let mut fail = vec![0u16; pattern.len()];
    let mut k = 0usize;
    for i in 1..pattern.len() {
        while k > 0 && pattern[i] != pattern[k] {
            k = fail[k - 1] as usize;
        }
        if pattern[i] == pattern[k] {
            k += 1;
        }
        fail[i] = k as u16;
    }
    fail
}

/// A parsed source (see the crate docs).
pub struct Source {
    /// The tools, in the source's order.
    pub tools: Vec<SourceTool>,
    /// The choice.
    pub choice: ToolChoice,
    /// Whether several calls may be written.
    pub parallel: bool,
    /// The syntax.
    pub format: Format,
}

/// One tool of a [`Source`].
pub struct SourceTool {
    /// The function's name.
    pub name: String,
    /// Its parameters' JSON Schema.
    pub parameters: Value,
    /// The parameters' place in the source (a JSON pointer).
    pub at: String,
    /// OpenAI's `function.strict`: the parameters are compiled in the json-schema plugin's
    /// strict mode.
    pub strict: bool,
}

fn invalid(message: impl Into<String>, at: &str) -> ConstraintError {
    ConstraintError::new(ErrorCode::InvalidSource, message).at(at)
}

/// Whether `name` is a valid tool name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b':'))
}

impl Source {
    /// Parses and checks a source.
    pub fn parse(source: &str) -> Result<Source, ConstraintError> {
        if source.len() > dspark_plugin_json_schema::MAX_SOURCE_BYTES {
            return Err(ConstraintError::new(
                ErrorCode::TooLarge,
                format!(
                    "the tool-call source is {} bytes; the limit is {}",
                    source.len(),
                    dspark_plugin_json_schema::MAX_SOURCE_BYTES
                ),
            ));
        }
        let value: Value = serde_json::from_str(source).map_err(|e| {
            ConstraintError::new(ErrorCode::InvalidSource, format!("the source is not valid JSON: {e}"))
        })?;
        let map = value.as_object().ok_or_else(|| invalid("the source must be a JSON object", ""))?;
        if let Some(k) =
            map.keys().find(|k| !matches!(k.as_str(), "tools" | "tool_choice" | "parallel_tool_calls" | "format"))
        {
            return Err(invalid(
                format!("unknown field `{k}`; known: tools, tool_choice, parallel_tool_calls, format"),
                &format!("/{k}"),
            ));
        }
        let list =
            map.get("tools").and_then(Value::as_array).ok_or_else(|| invalid("`tools` must be an array", "/tools"))?;
        if list.is_empty() {
            return Err(invalid("`tools` must hold at least one tool", "/tools"));
        }
        if list.len() > MAX_TOOLS {
            return Err(ConstraintError::new(
                ErrorCode::TooLarge,
                format!("{} tools; the limit is {MAX_TOOLS}", list.len()),
            )
            .at("/tools"));
        }
        let mut tools = Vec::with_capacity(list.len());
        for (i, tool) in list.iter().enumerate() {
            let at = format!("/tools/{i}");
            if let Some(t) = tool.get("type").and_then(Value::as_str)
                && t != "function"
            {
                return Err(invalid(
                    format!("tool type `{t}` is not supported; use `function`"),
                    &format!("{at}/type"),
                ));
            }
            let function = tool
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| invalid("a tool must have a `function` object", &format!("{at}/function")))?;
            let name = function
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("a function must have a string `name`", &format!("{at}/function/name")))?;
            if !valid_name(name) {
                return Err(invalid(
                    format!("tool name `{name}` must be 1 to {MAX_NAME_BYTES} letters, digits, `_`, `-`, `.` or `:`"),
                    &format!("{at}/function/name"),
                ));
            }
            if tools.iter().any(|t: &SourceTool| t.name == name) {
                return Err(invalid(format!("two tools are named `{name}`"), &format!("{at}/function/name")));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => {
                    serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false})
                }
                Some(p) => p.clone(),
            };
            let strict = match function.get("strict") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(invalid("`strict` must be true or false", &format!("{at}/function/strict"))),
            };
            tools.push(SourceTool {
                name: name.to_string(),
                parameters,
                at: format!("{at}/function/parameters"),
                strict,
            });
        }
        let choice = match map.get("tool_choice") {
            None => ToolChoice::Auto,
            Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
            Some(Value::String(s)) if s == "required" => ToolChoice::Required,
            Some(Value::String(s)) if s == "none" => {
                return Err(invalid("`tool_choice` `none` is no constraint; do not compile one", "/tool_choice"));
            }
            Some(Value::Object(o)) => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(|| {
                    invalid("a named `tool_choice` needs `function.name`", "/tool_choice/function/name")
                })?;
                if !tools.iter().any(|t| t.name == *name) {
                    return Err(invalid(
                        format!("`tool_choice` names `{name}`, which is not one of the tools"),
                        "/tool_choice/function/name",
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
            Some(other) => {
                return Err(invalid(
                    format!("`tool_choice` must be \"auto\", \"required\", \"none\" or a function; got {other}"),
                    "/tool_choice",
                ));
            }
        };
        let parallel = match map.get("parallel_tool_calls") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("`parallel_tool_calls` must be a boolean", "/parallel_tool_calls")),
        };
        let format = match map.get("format") {
            None => Format::Generic,
            Some(Value::String(f)) => Format::from_name(f).ok_or_else(|| {
                invalid(format!("unknown format `{f}`; known: hermes, llama3, mistral, generic"), "/format")
            })?,
            Some(_) => return Err(invalid("`format` must be a string", "/format")),
        };
        Ok(Source { tools, choice, parallel, format })
    }
}

/// `options` with the json-schema plugin's `strict` set.
fn with_strict(options: &str) -> Result<String, ConstraintError> {
    let mut map = if options.trim().is_empty() {
        serde_json::Map::new()
    } else {
        match serde_json::from_str::<Value>(options) {
            Ok(Value::Object(map)) => map,
            _ => return Err(ConstraintError::new(ErrorCode::InvalidOptions, "options must be a JSON object")),
        }
    };
    map.insert("strict".into(), Value::Bool(true));
    Ok(Value::Object(map).to_string())
}

/// Compiles a source into the recogniser and the warnings of the tools' schemas.
pub fn compile_recognizer(
    kind: &str,
    source: &str,
    options: &str,
) -> Result<(ToolCallRecognizer, Vec<Warning>), ConstraintError> {
    dspark_guest::check_kind(kind, &KINDS)?;
    let source = Source::parse(source)?;
    let mut warnings = Vec::new();
    let mut tools = Vec::new();
    for SourceTool { name, parameters, at, strict } in &source.tools {
        if let ToolChoice::Named(chosen) = &source.choice
            && chosen != name
        {
            continue;
        }
        let strict_options;
        let options = if *strict {
            strict_options = with_strict(options)?;
            strict_options.as_str()
        } else {
            options
        };
        let (args, w) = dspark_plugin_json_schema::compile_recognizer("json-schema", &parameters.to_string(), options)
            .map_err(|mut e| {
                e.message = format!("tool `{name}`: {}", e.message);
                e.location = Some(format!("{at}{}", e.location.as_deref().unwrap_or("")));
                e
            })?;
        warnings.extend(w.into_iter().map(|w| Warning { location: format!("{at}{}", w.location), message: w.message }));
        tools.push(Tool { name: name.as_bytes().to_vec(), args });
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let syntax = source.format.syntax();
    let single = matches!(source.choice, ToolChoice::Named(_)) || !source.parallel;
    let rec = ToolCallRecognizer {
        tools,
        trigger: syntax.trigger.as_bytes().to_vec(),
        fail: failure(syntax.trigger.as_bytes()),
        first: syntax.first_open().into_bytes(),
        name_to_args: syntax.name_to_args.as_bytes().to_vec(),
        close: syntax.call_close.as_bytes().to_vec(),
        more: format!("{}{}", syntax.call_sep, syntax.call_open).into_bytes(),
        end: syntax.section_close.as_bytes().to_vec(),
        free_text: source.choice == ToolChoice::Auto,
        parallel: !single,
        walks: Mutex::default(),
    };
    Ok((rec, warnings))
}

/// The plugin.
#[derive(Default)]
pub struct ToolCallPlugin;

impl Plugin for ToolCallPlugin {
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
        dspark_plugin_json_schema::strings::warm_up(table);
        Ok(RecognizerConstraint::new(rec, table, warnings))
    }
}

dspark_guest::export_plugin!(ToolCallPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_guest::testing::walk_text;
    use serde_json::json;

    const EXTRA: [&str; 9] = ["<tool_call>", "\"}}", "\"}", "{\"", "\":", "Paris", "weather", "}\n</tool_call>", "\","];

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {
                "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"], "additionalProperties": false}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {
                "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}},
            {"type": "function", "function": {"name": "ping"}},
        ])
    }

    fn compile(choice: Value, parallel: bool, format: &str) -> (Arc<TokenTable>, Arc<dyn CompiledConstraint>) {
        let table = Arc::new(TokenTable::byte_level_for_tests(&EXTRA));
        let source =
            json!({"tools": tools(), "tool_choice": choice, "parallel_tool_calls": parallel, "format": format});
        let c = ToolCallPlugin.compile("tool-call", &source.to_string(), "{}", &table).unwrap();
        (table, c)
    }

    fn call(name: &str, args: &str) -> String {
        format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
    }

    #[test]
    fn auto_accepts_text_or_valid_calls_and_nothing_after_them() {
        let (table, c) = compile(json!("auto"), true, "hermes");
        for ok in [
            "Just text, no tools.".to_string(),
            format!("Checking.{}", call("get_weather", r#"{"city":"Paris","unit":"c"}"#)),
            format!("{}\n{}", call("ping", "{}"), call("get_time", r#"{"zone":"UTC"}"#)),
        ] {
            let w = walk_text(&mut *c.new_matcher(), &table, ok.as_bytes());
            assert!(w.accepted() && !w.mask_commit_mismatch, "{ok}: {w:?}");
        }
        for bad in [
            call("get_wether", "{}"),
            call("get_weather", r#"{"city":"Paris"}"#),
            call("get_weather", r#"{"city":"Paris","unit":"k"}"#),
            call("ping", r#"{"x":1}"#),
            format!("{} and more text", call("ping", "{}")),
        ] {
            let w = walk_text(&mut *c.new_matcher(), &table, bad.as_bytes());
            assert!(!w.accepted(), "{bad} must be rejected: {w:?}");
            assert!(!w.mask_commit_mismatch, "{bad}: {w:?}");
        }
    }

    #[test]
    fn required_forces_the_syntax_and_unique_names() {
        let (table, c) = compile(json!("required"), false, "hermes");
        let mut m = c.new_matcher();
        // Nothing is free: the call opens at once, up to the name.
        assert!(!m.compute_mask().unwrap().allows(b'H' as u32));
        let r = m.commit(&[b'<' as u32]).unwrap();
        // The opening quote is forced too: no token of this table extends `"` by a letter a
        // name may start with, so nothing can merge with it.
        assert_eq!(r.forced, table.tokenize(b"tool_call>\n{\"name\": \"").to_vec());
        let mask = m.compute_mask().unwrap();
        assert!(mask.allows(b'p' as u32) && mask.allows(b'g' as u32), "three names start here");
        // `p` names one tool: the rest of its name and the literal up to the arguments are
        // forced, and `ping` takes no arguments, so its `{}` and the close are too.
        let r = m.commit(&[b'p' as u32]).unwrap();
        assert_eq!(r.forced, table.tokenize(b"ing\", \"arguments\": {}}\n</tool_call>").to_vec());
        assert!(r.stop, "one call only: nothing may follow");
        let w = walk_text(&mut *c.new_matcher(), &table, b"no call");
        assert_eq!(w.rejected_at, Some(0));
        let two = format!("{}\n{}", call("ping", "{}"), call("ping", "{}"));
        assert!(!walk_text(&mut *c.new_matcher(), &table, two.as_bytes()).accepted(), "parallel_tool_calls: false");
    }

    #[test]
    fn a_strict_tool_refuses_an_approximated_schema_and_only_its_own() {
        let approximated = json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "array"}, "uniqueItems": true}}});
        let source = |strict: Value| {
            let mut tools = tools();
            tools[1]["function"]["parameters"] = approximated.clone();
            tools[1]["function"]["strict"] = strict;
            tools[0]["function"]["strict"] = json!(true);
            json!({"tools": tools, "tool_choice": "required", "format": "generic"}).to_string()
        };
        let at = "/tools/1/function/parameters#/properties/tags/uniqueItems";
        let Err(e) = compile_recognizer("tool-call", &source(json!(true)), "{}") else { panic!("strict is refused") };
        assert_eq!((e.code, e.location.as_deref()), (ErrorCode::Unsupported, Some(at)));
        assert!(e.message.starts_with("tool `get_time`: strict mode: `uniqueItems` is not enforced"), "{e}");
        // Not strict: served, with the warning; `get_weather` being strict does not matter.
        let (_, warnings) =
            compile_recognizer("tool-call", &source(json!(false)), r#"{"property_order":"any"}"#).unwrap();
        assert_eq!(warnings.len(), 1);
        assert_eq!(warnings[0].location, at);
        let Err(e) = compile_recognizer("tool-call", &source(json!("yes")), "{}") else { panic!("a bad strict") };
        assert_eq!(e.location.as_deref(), Some("/tools/1/function/strict"));
        assert!(e.message.contains("`strict` must be true or false"), "{e}");
    }

    #[test]
    fn a_named_function_is_the_only_one() {
        let (table, c) = compile(json!({"type": "function", "function": {"name": "get_time"}}), true, "mistral");
        let ok = r#"[TOOL_CALLS][{"name": "get_time", "arguments": {"zone":"UTC"}}]"#;
        let w = walk_text(&mut *c.new_matcher(), &table, ok.as_bytes());
        assert!(w.accepted(), "{w:?}");
        let other = r#"[TOOL_CALLS][{"name": "ping", "arguments": {}}]"#;
        assert!(!walk_text(&mut *c.new_matcher(), &table, other.as_bytes()).accepted());
        let mut m = c.new_matcher();
        let r = m.commit(&[b'[' as u32]).unwrap();
        assert_eq!(
            r.forced,
            table.tokenize(b"TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {\"zone\":").to_vec()
        );
    }

    #[test]
    fn every_format_round_trips_through_its_parser() {
        for format in Format::ALL {
            let (table, c) = compile(json!("required"), true, format.name());
            let s = format.syntax();
            let text = format!(
                "{}get_weather{}{}{}{}{}ping{}{{}}{}{}",
                s.first_open(),
                s.name_to_args,
                r#"{"city":"Oslo","unit":"f"}"#,
                s.call_close,
                s.call_sep,
                s.call_open,
                s.name_to_args,
                s.call_close,
                s.section_close
            );
            let w = walk_text(&mut *c.new_matcher(), &table, text.as_bytes());
            assert!(w.accepted() && !w.mask_commit_mismatch, "{format:?} {text}: {w:?}");
            let parsed = s.parse(&text, true);
            assert_eq!(parsed.content, "");
            let calls: Vec<(&str, &str)> =
                parsed.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect();
            assert_eq!(calls, vec![("get_weather", r#"{"city":"Oslo","unit":"f"}"#), ("ping", "{}")], "{format:?}");
        }
    }

    #[test]
    fn string_masks_inside_arguments_equal_the_trie_walk() {
        // The fast in-string path must give exactly what walking the trie gives, including
        // tokens like `"}}` that close the arguments and run into the call's close.
        let table = Arc::new(TokenTable::byte_level_for_tests(&EXTRA));
        // With `property_order: any` the arguments' state inside a value string holds several
        // configurations (any key may follow); each takes the fast path on its own.
        for options in ["{}", r#"{"property_order":"any"}"#] {
            let source = json!({"tools": tools(), "tool_choice": "required", "format": "generic"});
            let (rec, _) = compile_recognizer("tool-call", &source.to_string(), options).unwrap();
            let mut state = rec.start();
            for &b in br#"{"tool_calls": [{"name": "get_time", "arguments": {"zone":"Eu"#.iter() {
                state = rec.advance(&state, b).unwrap();
            }
            let mut fast = TokenSet::new(table.vocab_size());
            assert!(rec.fill_mask(&state, &table, &mut fast), "{options}");
            let mut slow = TokenSet::new(table.vocab_size());
            let mut stack = Vec::new();
            table.trie().walk(&state, &mut stack, |s, b| rec.advance(s, b), |t| slow.insert(t));
            assert_eq!(fast.words(), slow.words(), "{options}");
            let closing = table.tokenize(b"\"}}");
            assert_eq!(closing.len(), 1);
            assert!(fast.contains(closing[0]), "{options}: `\"}}}}` closes the string, the arguments and the call");
            let comma = table.tokenize(b"\",");
            assert!(fast.contains(comma[0]), "{options}");
        }
    }

    #[test]
    fn bad_sources_name_the_place() {
        let table = Arc::new(TokenTable::byte_level_for_tests(&[]));
        let compile =
            |source: Value| ToolCallPlugin.compile("tool-call", &source.to_string(), "{}", &table).err().unwrap();
        let e = compile(json!({"tools": []}));
        assert_eq!((e.code, e.location.as_deref()), (ErrorCode::InvalidSource, Some("/tools")));
        let e = compile(json!({"tools": [{"type": "function", "function": {"name": "bad name"}}]}));
        assert_eq!(e.location.as_deref(), Some("/tools/0/function/name"));
        let e = compile(json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}));
        assert_eq!(e.message, "`tool_choice` names `nope`, which is not one of the tools");
        let e = compile(
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}]}),
        );
        assert!(e.message.starts_with("tool `f`: "), "{e}");
        assert!(e.location.as_deref().is_some_and(|l| l.starts_with("/tools/0/function/parameters")), "{e}");
        let e = compile(json!({"tools": tools(), "tool_choice": "none"}));
        assert_eq!(e.location.as_deref(), Some("/tool_choice"));
    }
}
