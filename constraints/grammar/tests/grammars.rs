//! The fixture grammars: valid texts are accepted token by token (masks and commits agree),
//! invalid ones rejected, and random walks through the masks produce texts the grammar and,
//! for JSON, `serde_json` accept.

use std::sync::Arc;

use dspark_guest::testing::walk_text;
use dspark_guest::{CompiledConstraint, ErrorCode, Mask, Plugin, TokenTable};
use dspark_plugin_grammar::{GrammarPlugin, compile_recognizer};

fn fixture(name: &str) -> String {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn table() -> Arc<TokenTable> {
    Arc::new(TokenTable::byte_level_for_tests(&[
        "SELECT", " FROM", "select", "\":", "{\"", "\"}", "  ", "\n", "12", "let", " = ", "();", "while", ",\"", "\"\"",
    ]))
}

fn compile(kind: &str, source: &str) -> (Arc<TokenTable>, Arc<dyn CompiledConstraint>) {
    let table = table();
    let c = GrammarPlugin.compile(kind, source, "{}", &table).unwrap_or_else(|e| panic!("{e}"));
    (table, c)
}

fn check(kind: &str, file: &str, valid: &[&str], invalid: &[&str]) {
    let (table, c) = compile(kind, &fixture(file));
    for text in valid {
        let w = walk_text(&mut *c.new_matcher(), &table, text.as_bytes());
        assert!(w.accepted(), "{file}: {text:?} must be accepted: {w:?}");
        assert!(!w.mask_commit_mismatch, "{file}: {text:?}");
    }
    for text in invalid {
        let w = walk_text(&mut *c.new_matcher(), &table, text.as_bytes());
        assert!(!w.accepted(), "{file}: {text:?} must be rejected");
        assert!(!w.mask_commit_mismatch, "{file}: {text:?}");
    }
}

#[test]
fn json_in_both_syntaxes() {
    let valid =
        [r#"{}"#, r#"{"a":1}"#, r#"{"a": [1, -2.5e3, "x\n", true, null], "b": {"c": false}}"#, "{\n  \"k\": \"v\"}"];
    let invalid = [r#"{"a":}"#, r#"{"a":1,}"#, r#"[1]"#, r#"{"a":01x}"#, r#"{"a" 1}"#, r#"{'a':1}"#];
    check("gbnf", "json.gbnf", &valid, &invalid);
    let lark_valid = [r#"{}"#, r#"{"a":1}"#, r#"[1, 2, {"x": null}]"#, r#" { "a" : [ true ] } "#, r#""just a string""#];
    check("lark", "json.lark", &lark_valid, &[r#"{"a":}"#, r#"[1,]"#, r#"{"a" 1}"#, "tru"]);
}

#[test]
fn arithmetic_with_left_recursion() {
    let valid = ["1", "1+2*3", "(a + b) * -c / 2.5", "x-y-z", "-(-(1))"];
    let invalid = ["1+", "*2", "(1", "1 2", "a b"];
    check("lark", "arithmetic.lark", &valid, &invalid);
    check("gbnf", "arithmetic.gbnf", &["1", "1 + 2*3", "(1 - 2) / -3.5"], &["1 +", "(1", "1..2"]);
}

#[test]
fn sql_select_subset() {
    let valid = [
        "SELECT * FROM users;",
        "select name, age FROM users WHERE age >= 18 AND city = 'Paris' ORDER BY age DESC LIMIT 10",
        "SELECT COUNT(*) FROM orders WHERE status != 'void'",
        "SELECT u.name FROM u",
    ];
    let invalid = ["SELECT FROM users", "SELECT * users", "SELECT * FROM users WHERE", "SELECT * FROM users LIMIT x"];
    check("lark", "sql.lark", &valid, &invalid);
}

#[test]
fn csv_with_three_columns() {
    let valid = ["a,b,c\n1,2,3\n", "name,\"a, b\",x\n,,\n\"q\"\"q\",2,3\n"];
    let invalid = ["a,b\n1,2\n", "a,b,c\n1,2,3,4\n", "a,b,c\n", "a,\"b,c\n1,2,3\n"];
    check("gbnf", "csv3.gbnf", &valid, &invalid);
}

#[test]
fn a_small_programming_language() {
    let valid = [
        "fn add(a, b) { return a + b; }",
        "let x = 1; while x < 10 { x = x * 2; } print(add(x, 3));",
        "fn f() { if n == 0 { return 1; } else { return n * f(n - 1); } }",
    ];
    let invalid = ["fn (a) { }", "let x 1;", "while x { x = 1 }", "fn f() { return 1 }"];
    check("lark", "lang.lark", &valid, &invalid);
}

/// Random walks: at each step a random allowed token (forced spans taken as they come), until
/// the matcher stops or accepts after a minimum length, or a cap; accepted texts must match.
#[test]
fn random_walks_produce_sentences() {
    let table = table();
    for (kind, file) in [
        ("gbnf", "json.gbnf"),
        ("lark", "json.lark"),
        ("lark", "arithmetic.lark"),
        ("lark", "sql.lark"),
        ("gbnf", "csv3.gbnf"),
        ("lark", "lang.lark"),
    ] {
        let source = fixture(file);
        let rec = compile_recognizer(kind, &source).unwrap();
        let c = GrammarPlugin.compile(kind, &source, "{}", &table).unwrap();
        let mut finished = 0;
        for seed in 0..40u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = move |n: usize| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng % n as u64) as usize
            };
            let mut m = c.new_matcher();
            let mut text = Vec::new();
            for _ in 0..400 {
                let allowed: Vec<u32> = match m.compute_mask().unwrap() {
                    Mask::All => (0..table.vocab_size() as u32).collect(),
                    mask => (0..table.vocab_size() as u32).filter(|&t| mask.allows(t)).collect(),
                };
                assert!(!allowed.is_empty(), "{file}: a dead end after {:?}", String::from_utf8_lossy(&text));
                // Prefer ending once something was written, so walks finish.
                let eos = allowed.iter().copied().find(|&t| table.is_eos(t));
                // Half the time, structure (punctuation, space, newline), so walks make progress.
                let structural: Vec<u32> = allowed
                    .iter()
                    .copied()
                    .filter(|&t| {
                        !table.is_eos(t)
                            && table.token_bytes(t).iter().all(|b| b.is_ascii_punctuation() || b.is_ascii_whitespace())
                    })
                    .collect();
                let t = match eos {
                    Some(e) if text.len() > 20 && next(3) == 0 => e,
                    _ if !structural.is_empty() && next(2) == 0 => structural[next(structural.len())],
                    _ => allowed[next(allowed.len())],
                };
                if table.is_eos(t) {
                    m.commit(&[t]).unwrap();
                    break;
                }
                let r = m.commit(&[t]).unwrap();
                text.extend_from_slice(table.token_bytes(t));
                for &f in &r.forced {
                    text.extend_from_slice(table.token_bytes(f));
                }
                if r.stop {
                    break;
                }
            }
            if m.is_accepting() || m.is_stopped() {
                finished += 1;
                assert!(
                    rec.matches(&text),
                    "{file}: walk {seed} wrote {:?}, which does not match",
                    String::from_utf8_lossy(&text)
                );
                if file == "json.gbnf" {
                    let v: Result<serde_json::Value, _> = serde_json::from_slice(&text);
                    assert!(v.is_ok(), "{file}: {:?} is not JSON", String::from_utf8_lossy(&text));
                }
            }
        }
        assert!(finished >= 4, "{file}: only {finished} of 40 walks finished");
        eprintln!("{file}: {finished} of 40 walks finished");
    }
}

#[test]
fn errors_name_the_place() {
    let table = table();
    let err = |kind: &str, src: &str| GrammarPlugin.compile(kind, src, "{}", &table).err().unwrap();
    let e = err("lark", "start: a\na: \"x\" b\n");
    assert_eq!((e.code, e.location.as_deref()), (ErrorCode::InvalidSource, Some("2:8")), "{e}");
    assert_eq!(e.message, "`b` is not defined");
    let e = err("gbnf", "root ::= \"a\" (\n");
    assert_eq!(e.location.as_deref(), Some("1:14"), "{e}");
    let e = err("lark", "start: /(?!x)y/\n");
    assert!(e.message.contains("invalid regex"), "{e}");
    assert_eq!(e.location.as_deref(), Some("1:8"));
    let e = err("lark", "start: a\na: b \"x\"\nb: a \"y\"\n");
    assert!(e.message.starts_with("left recursion through"), "{e}");
    let e = err("gbnf", "rot ::= \"a\"");
    assert_eq!(e.message, "the grammar has no `root` rule (where output starts)");
    let e = err("grammar", "root ::= \"a\"{1,100000}");
    assert_eq!(e.code, ErrorCode::TooLarge, "{e}");
}
