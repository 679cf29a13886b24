//! The built-in `grammar` plugin: the output is a sentence of a context-free grammar.
//!
//! Kinds:
//! - `lark`: Lark syntax (vLLM's and llguidance's grammar format); see [`lark`];
//! - `gbnf`: llama.cpp's GBNF; see [`gbnf`];
//! - `grammar`: either, told apart by the source: GBNF defines rules with `::=`.
//!
//! Data flow: the source parses into an [`ast::Grammar`] (errors carry `line:column`),
//! [`compile`] lowers it to numbered alternatives whose terminals are DFAs, and
//! [`recognizer::GrammarRecognizer`] runs it byte by byte as a pushdown automaton with a set
//! of parse stacks; the SDK walks the token trie for masks and finds forced spans (keywords,
//! punctuation, anything the grammar leaves no choice about).
//!
//! What is approximated, and said so here because it is the same for every grammar: Lark
//! terminals are matched greedily byte by byte with no lexer priorities and no backtracking
//! to a shorter match, so a few texts a Lark lexer splits differently are refused or
//! accepted; Lark priorities and tree-shaping marks (`?rule`, `!rule`, `-> alias`) have no
//! effect on which texts are allowed. Options: none.

pub mod ast;
pub mod compile;
pub mod gbnf;
pub mod lark;
pub mod recognizer;

use std::sync::Arc;

use dspark_guest::{CompiledConstraint, ConstraintError, ErrorCode, Plugin, RecognizerConstraint, TokenTable};

use recognizer::GrammarRecognizer;

/// The kinds this plugin serves.
pub const KINDS: [&str; 3] = ["grammar", "lark", "gbnf"];
/// Sources longer than this are refused.
pub const MAX_SOURCE_BYTES: usize = 1 << 20;

/// Whether a `grammar` source is GBNF (it defines a rule with `::=`).
pub fn is_gbnf(source: &str) -> bool {
    source.lines().any(|l| {
        let t = l.trim_start();
        !t.starts_with('#') && !t.starts_with("//") && t.contains("::=")
    })
}

/// Parses and compiles a source of `kind`.
pub fn compile_recognizer(kind: &str, source: &str) -> Result<GrammarRecognizer, ConstraintError> {
    dspark_guest::check_kind(kind, &KINDS)?;
    if source.len() > MAX_SOURCE_BYTES {
        return Err(ConstraintError::new(
            ErrorCode::TooLarge,
            format!("the grammar is {} bytes; the limit is {MAX_SOURCE_BYTES}", source.len()),
        ));
    }
    let gbnf = match kind {
        "gbnf" => true,
        "lark" => false,
        _ => is_gbnf(source),
    };
    let syntax = if gbnf { "GBNF" } else { "Lark" };
    let grammar = if gbnf { gbnf::parse(source) } else { lark::parse(source) }.map_err(|e| {
        ConstraintError::new(ErrorCode::InvalidSource, format!("{syntax} syntax error: {}", e.message))
            .at(e.pos.to_string())
    })?;
    let compiled = compile::compile(&grammar).map_err(|e| {
        let code = if e.too_large { ErrorCode::TooLarge } else { ErrorCode::InvalidSource };
        let err = ConstraintError::new(code, e.message);
        match e.pos {
            Some(p) if p.line > 0 => err.at(p.to_string()),
            _ => err,
        }
    })?;
    Ok(GrammarRecognizer::new(compiled))
}

/// The plugin.
#[derive(Default)]
pub struct GrammarPlugin;

impl Plugin for GrammarPlugin {
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
        dspark_guest::no_options(options)?;
        let rec = compile_recognizer(kind, source)?;
        Ok(RecognizerConstraint::new(rec, table, Vec::new()))
    }
}

dspark_guest::export_plugin!(GrammarPlugin);
