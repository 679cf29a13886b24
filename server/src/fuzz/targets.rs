//! The fuzz targets: each parser of untrusted input, from bytes to an outcome class.
//!
//! A target returns a short class of what happened (accepted, or the first words of the
//! error); anything that is not a clean outcome panics, so the fuzzer saves the input: a panic
//! in the parser, a mask that allows a token its commit refuses, or a state that allows no
//! token at all (the dead end a plugin must never reach).

use std::sync::Arc;

use dspark_guest::{CompiledConstraint, Plugin, TokenTable};
use dspark_host::engine::gguf::GgufFile;
use dspark_host::engine::{CpuBackend, Model, ModelTokenizer};
use dspark_plugin_tool_call::Format;

use crate::openai::constraint::from_request;
use crate::openai::request::{ChatRequest, CompletionRequest, parse_body};

/// One fuzz target.
pub struct Target {
    /// Its name on the command line and its corpus folder.
    pub name: &'static str,
    /// What it reads.
    pub about: &'static str,
    /// Runs one input; returns its outcome class.
    pub run: fn(&[u8]) -> String,
    /// Tokens of the input language that mutations insert.
    pub dictionary: &'static [&'static [u8]],
    /// The longest input tried.
    pub max_len: usize,
}

/// Every target.
pub static TARGETS: &[Target] = &[
    Target {
        name: "json-schema",
        about: "JSON Schema compilation and a random walk of the result",
        run: json_schema,
        dictionary: &[
            b"{\"type\":\"object\"",
            b"\"properties\":{",
            b"\"$ref\":\"#/$defs/a\"",
            b"\"$defs\":{\"a\":",
            b"\"anyOf\":[",
            b"\"oneOf\":[",
            b"\"allOf\":[",
            b"\"not\":",
            b"\"pattern\":\"",
            b"\"enum\":[",
            b"\"items\":",
            b"\"minimum\":",
            b"\"multipleOf\":",
            b"\"format\":\"date-time\"",
            b"\"additionalProperties\":false",
            b"\"required\":[",
            b"\"uniqueItems\":true",
            b"\"if\":",
            b"[",
            b"]",
            b"{",
            b"}",
            b",",
            b":",
        ],
        max_len: 16 << 10,
    },
    Target {
        name: "lark",
        about: "Lark grammar parsing and a random walk of the result",
        run: lark,
        dictionary: &[
            b"start: ",
            b"\n",
            b"|",
            b"(",
            b")",
            b"*",
            b"+",
            b"?",
            b"\"a\"",
            b"/[a-z]+/",
            b"%import",
            b"x: ",
            b"~ 3",
        ],
        max_len: 16 << 10,
    },
    Target {
        name: "gbnf",
        about: "GBNF grammar parsing and a random walk of the result",
        run: gbnf,
        dictionary: &[
            b"root ::= ",
            b"\n",
            b"|",
            b"(",
            b")",
            b"*",
            b"+",
            b"?",
            b"\"a\"",
            b"[a-z]",
            b"[^\\n]",
            b"{2,5}",
            b"x ::= ",
        ],
        max_len: 16 << 10,
    },
    Target {
        name: "regex",
        about: "regex compilation and a random walk of the result",
        run: regex,
        dictionary: &[
            b"(", b")", b"*", b"+", b"?", b"{1000}", b"\\d", b"\\w", b"[^a]", b"|", b".", b"^", b"$", b"\\p{L}",
            b"(?i)",
        ],
        max_len: 4 << 10,
    },
    Target {
        name: "gguf",
        about: "the GGUF header, tokenizer and model readers",
        run: gguf,
        dictionary: &[b"GGUF", b"general.architecture", b"llama", b"tokenizer.ggml.tokens", b"general.alignment"],
        max_len: 64 << 10,
    },
    Target {
        name: "openai-request",
        about: "the chat and completions request bodies and their structure fields",
        run: openai_request,
        dictionary: &[
            b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]",
            b"\"response_format\":{\"type\":\"json_schema\"",
            b"\"json_schema\":{\"name\":\"x\",\"schema\":{}}",
            b"\"structured_outputs\":{\"regex\":\"a+\"}",
            b"\"guided_choice\":[\"a\"]",
            b"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}]",
            b"\"tool_choice\":\"required\"",
            b"\"n\":",
            b"\"max_tokens\":",
            b"\"logit_bias\":{\"1\":100}",
            b"\"stop\":[",
            b"\"prompt\":[[1,2]]",
            b",",
            b"}",
        ],
        max_len: 16 << 10,
    },
    Target {
        name: "tool-calls",
        about: "the tool-call output parsers of every format, and tool lists",
        run: tool_calls,
        dictionary: &[
            b"<tool_call>",
            b"</tool_call>",
            b"{\"name\":\"f\",\"arguments\":{}}",
            b"[TOOL_CALLS]",
            b"<|python_tag|>",
            b"{\"tool_calls\":[",
            b"\"parameters\":",
            b"]",
            b"}",
        ],
        max_len: 16 << 10,
    },
];

fn text(input: &[u8]) -> String {
    String::from_utf8_lossy(input).into_owned()
}

/// The first words of an error, digits folded: a class that does not grow with the input.
fn class(prefix: &str, error: impl std::fmt::Display) -> String {
    let words: Vec<String> = error.to_string().split_whitespace().take(4).map(str::to_string).collect();
    let text: String = words.join(" ").chars().map(|c| if c.is_ascii_digit() { '#' } else { c }).collect();
    format!("{prefix}: {text}")
}

/// Drives a matcher of `compiled` as the host does, choosing among the allowed tokens by a
/// hash of the input, for up to 48 tokens.
fn walk(compiled: &Arc<dyn CompiledConstraint>, table: &TokenTable, input: &[u8]) -> String {
    let mut seed = dspark_host::plugin::health::constraint_key("walk", &text(input), "");
    let mut matcher = compiled.new_matcher();
    if let Err(e) = matcher.commit(&[]) {
        return class("start", e);
    }
    let eos = table.eos_tokens().to_vec();
    for step in 0..48 {
        let mask = match matcher.compute_mask() {
            Ok(mask) => mask,
            Err(e) => return class("mask", e),
        };
        let allowed: Vec<u32> = (0..table.vocab_size() as u32).filter(|&t| mask.allows(t)).collect();
        assert!(!allowed.is_empty(), "a dead end after {step} tokens: no token is allowed");
        seed = seed.rotate_left(17) ^ 0x9E37_79B9_7F4A_7C15;
        let token = allowed[(seed % allowed.len() as u64) as usize];
        if eos.contains(&token) {
            return "accepted".into();
        }
        match matcher.commit(&[token]) {
            Ok(result) if result.stop => return "stopped".into(),
            Ok(_) => {}
            Err(e) => panic!("the mask allowed token {token} but the commit refused it: {e}"),
        }
    }
    "walked".into()
}

fn compile_and_walk(plugin: &dyn Plugin, kind: &str, input: &[u8]) -> String {
    let table = Arc::new(TokenTable::byte_level_for_tests(&["{\"", "\":", "true", "null", "ab"]));
    match plugin.compile(kind, &text(input), "{}", &table) {
        Ok(compiled) => walk(&compiled, &table, input),
        Err(e) => class("refused", format!("{:?}", e.code)),
    }
}

fn json_schema(input: &[u8]) -> String {
    compile_and_walk(&dspark_plugin_json_schema::JsonSchemaPlugin, "json-schema", input)
}

fn lark(input: &[u8]) -> String {
    compile_and_walk(&dspark_plugin_grammar::GrammarPlugin, "lark", input)
}

fn gbnf(input: &[u8]) -> String {
    compile_and_walk(&dspark_plugin_grammar::GrammarPlugin, "gbnf", input)
}

fn regex(input: &[u8]) -> String {
    compile_and_walk(&dspark_plugin_regex::RegexPlugin, "regex", input)
}

fn gguf(input: &[u8]) -> String {
    // One file, rewritten each run: its path (in every error) stays the same, so classes do.
    static DIR: std::sync::OnceLock<Option<tempfile::TempDir>> = std::sync::OnceLock::new();
    let Some(dir) = DIR.get_or_init(|| tempfile::tempdir().ok()) else { return "no temp dir".into() };
    let path = dir.path().join("fuzz.gguf");
    if std::fs::write(&path, input).is_err() {
        return "not written".into();
    }
    let mut file = match GgufFile::open(&path) {
        Ok(f) => f,
        Err(e) => return class("open", e),
    };
    let tokenizer = ModelTokenizer::load(&path, &file).map(|_| ()).map_err(|e| class("tokenizer", e));
    match Model::load(CpuBackend::new(), &mut file) {
        Ok(_) => format!("loaded ({tokenizer:?})"),
        Err(e) => class("model", e),
    }
}

fn openai_request(input: &[u8]) -> String {
    let chat = match parse_body::<ChatRequest>(input) {
        Ok((_, sampling)) => match from_request(&sampling) {
            Ok(spec) => format!("chat: {}", spec.as_ref().map_or("free", |s| s.kind())),
            Err(e) => class("chat spec", e.body()["error"]["param"].clone()),
        },
        Err(e) => class("chat", e.body()["error"]["param"].clone()),
    };
    let completion = match parse_body::<CompletionRequest>(input) {
        Ok(_) => "completion: ok".to_string(),
        Err(e) => class("completion", e.body()["error"]["param"].clone()),
    };
    format!("{chat} / {completion}")
}

fn tool_calls(input: &[u8]) -> String {
    let text = text(input);
    let mut calls = 0;
    for format in Format::ALL {
        for finished in [false, true] {
            let parsed = format.syntax().parse(&text, finished);
            calls += parsed.calls.len();
        }
    }
    let tools = compile_and_walk(&dspark_plugin_tool_call::ToolCallPlugin, "tool-call", input);
    format!("{} calls / {tools}", calls.min(3))
}
