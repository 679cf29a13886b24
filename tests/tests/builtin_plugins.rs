//! The built-in `regex` and `choice` plugins, as wasm components in wasmtime, with real
//! tokenizers: masks agree with commits, forced spans are the tokenizer's own tokens.

use std::sync::Arc;

use dspark_host::plugin::{ErrorCode, PluginError, PluginInstance};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};
use dspark_tests::{Fixture, builtin_plugin, tokenizer_json};

struct Setup {
    _fixture: Fixture,
    tok: Arc<HfTokenizer>,
    inst: PluginInstance,
}

fn setup(plugin: &str, tokenizer: &str) -> Setup {
    let fixture = Fixture::new(&[builtin_plugin(plugin)], |_| {});
    let tok = Arc::new(HfTokenizer::from_file(&tokenizer_json(tokenizer), None).unwrap());
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    let inst = fixture.registry.get(plugin).unwrap().instantiate(tok.table().clone(), canonical).unwrap();
    Setup { _fixture: fixture, tok, inst }
}

/// Walks `text` token by token; returns (accepted, forced tokens met).
fn walk(s: &mut Setup, kind: &str, source: &str, text: &str) -> (bool, usize) {
    let c = s.inst.compile(kind, source, "{}").unwrap();
    let m = s.inst.new_matcher(&c).unwrap();
    let tokens = s.tok.tokenize(text.as_bytes());
    let mut i = 0;
    let mut forced = 0;
    while i < tokens.len() {
        let mask = s.inst.compute_mask(&m).unwrap();
        let allowed = mask.allows(tokens[i]);
        let commit = s.inst.commit(&m, &tokens[i..i + 1]);
        assert_eq!(allowed, commit.is_ok(), "mask and commit disagree on token {i} of {text:?}");
        let Ok(outcome) = commit else { return (false, forced) };
        i += 1;
        if !outcome.forced.is_empty() {
            if tokens.get(i..i + outcome.forced.len()) == Some(&outcome.forced[..]) {
                i += outcome.forced.len();
                forced += outcome.forced.len();
            } else {
                s.inst.rollback(&m, outcome.forced.len() as u32).unwrap();
            }
        }
    }
    (s.inst.is_accepting(&m).unwrap(), forced)
}

#[test]
fn regex_accepts_matches_and_rejects_the_rest_with_llama3() {
    let mut s = setup("regex", "llama3");
    let re = r"\d{4}-\d{2}-\d{2}";
    assert!(walk(&mut s, "regex", re, "2024-05-17").0);
    assert!(!walk(&mut s, "regex", re, "2024-5-17").0);
    assert!(!walk(&mut s, "regex", re, "2024-05-17T").0);
    assert!(!walk(&mut s, "regex", re, "2024-05").0);
    let email = r"[a-z]+@[a-z]+\.(com|org)";
    assert!(walk(&mut s, "regex", email, "alice@example.org").0);
    assert!(!walk(&mut s, "regex", email, "alice@example.net").0);
}

#[test]
fn regex_mask_is_exactly_the_tokens_that_stay_in_the_language() {
    let mut s = setup("regex", "qwen2.5");
    let c = s.inst.compile("regex", "[0-9]+", "{}").unwrap();
    let m = s.inst.new_matcher(&c).unwrap();
    let mask = s.inst.compute_mask(&m).unwrap();
    let table = s.tok.table().clone();
    for id in 0..table.vocab_size() as u32 {
        let b = table.token_bytes(id);
        let digits = !b.is_empty() && !table.is_special(id) && b.iter().all(u8::is_ascii_digit);
        assert_eq!(mask.allows(id), digits, "token {id} {:?}", String::from_utf8_lossy(b));
    }
    // EOS only once something was written.
    assert!(table.eos_tokens().iter().all(|&e| !mask.allows(e)));
    s.inst.commit(&m, &s.tok.tokenize(b"7")).unwrap();
    let mask = s.inst.compute_mask(&m).unwrap();
    assert!(table.eos_tokens().iter().all(|&e| mask.allows(e)));
}

#[test]
fn choice_forces_the_unique_rest_as_the_tokenizers_own_tokens() {
    let mut s = setup("choice", "llama3");
    let source = r#"["The quick brown fox jumps over the lazy dog","Lorem ipsum"]"#;
    let (accepted, forced) = walk(&mut s, "choice", source, "The quick brown fox jumps over the lazy dog");
    assert!(accepted);
    let all = s.tok.tokenize(b"The quick brown fox jumps over the lazy dog").len();
    assert_eq!(forced, all - 1, "everything after the first token is forced");
    let c = s.inst.compile("choice", source, "{}").unwrap();
    let m = s.inst.new_matcher(&c).unwrap();
    let first = s.tok.tokenize(b"The");
    let out = s.inst.commit(&m, &first).unwrap();
    assert_eq!(out.forced, s.tok.tokenize(b" quick brown fox jumps over the lazy dog"));
    assert!(out.stop);
    assert!(!walk(&mut s, "choice", source, "Lorem").0);
}

/// The smallest built-in plugin's memory (32 MiB) holds the largest vocabulary's token
/// table, trie and trie index (Qwen2.5, 152k tokens), and masks come back through it.
#[test]
fn choice_fits_its_memory_with_the_largest_vocabulary() {
    let mut s = setup("choice", "qwen2.5");
    let (accepted, _) = walk(&mut s, "choice", r#"["the quick brown fox", "a lazy dog"]"#, "the quick brown fox");
    assert!(accepted);
    assert!(!walk(&mut s, "choice", r#"["the quick brown fox", "a lazy dog"]"#, "the slow").0);
}

#[test]
fn plugin_error_values_reach_the_host_intact() {
    let mut s = setup("choice", "deepseek-v3");
    match s.inst.compile("choice", "[]", "{}").unwrap_err() {
        PluginError::Constraint { plugin, error } => {
            assert_eq!(plugin, "choice");
            assert_eq!(error.code, ErrorCode::InvalidSource);
            assert_eq!(error.message, "the list of choices is empty");
        }
        other => panic!("{other:?}"),
    }
    match s.inst.compile("choice", r#"["a"]"#, r#"{"case":"insensitive"}"#).unwrap_err() {
        PluginError::Constraint { error, .. } => assert_eq!(error.code, ErrorCode::InvalidOptions),
        other => panic!("{other:?}"),
    }
    let c = s.inst.compile("choice", r#"["yes","no"]"#, "{}").unwrap();
    let m = s.inst.new_matcher(&c).unwrap();
    match s.inst.commit(&m, &s.tok.tokenize(b"maybe")).unwrap_err() {
        PluginError::Constraint { error, .. } => assert_eq!(error.code, ErrorCode::RejectedToken),
        other => panic!("{other:?}"),
    }
    // Fork, draft validation and state keys through the component.
    let yes = s.tok.tokenize(b"yes");
    assert_eq!(s.inst.validate_draft(&m, &yes).unwrap(), yes.len() as u32);
    let k0 = s.inst.state_key(&m).unwrap();
    let f = s.inst.fork(&m).unwrap();
    s.inst.commit(&f, &yes).unwrap();
    assert!(s.inst.is_accepting(&f).unwrap() && s.inst.is_stopped(&f).unwrap());
    assert!(!s.inst.is_accepting(&m).unwrap());
    assert_eq!(s.inst.state_key(&m).unwrap(), k0);
    s.inst.drop_matcher(f).unwrap();
}
