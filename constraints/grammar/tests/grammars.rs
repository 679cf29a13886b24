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

/// Walks the valid and invalid samples of `file` (`file.samples.json`).
fn check(kind: &str, file: &str) {
    let (table, c) = compile(kind, &fixture(file));
    let samples: serde_json::Value = serde_json::from_str(&fixture(&format!("{file}.samples.json"))).unwrap();
    let texts = |k: &str| -> Vec<String> {
        samples[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    let (valid, invalid) = (texts("valid"), texts("invalid"));
    assert!(!valid.is_empty() && !invalid.is_empty(), "{file}: no samples");
    for text in &valid {
        let w = walk_text(&mut *c.new_matcher(), &table, text.as_bytes());
        assert!(w.accepted(), "{file}: {text:?} must be accepted: {w:?}");
        assert!(!w.mask_commit_mismatch, "{file}: {text:?}");
    }
    for text in &invalid {
        let w = walk_text(&mut *c.new_matcher(), &table, text.as_bytes());
        assert!(!w.accepted(), "{file}: {text:?} must be rejected");
        assert!(!w.mask_commit_mismatch, "{file}: {text:?}");
    }
}

#[test]
fn json_in_both_syntaxes() {
    check("gbnf", "json.gbnf");
    check("lark", "json.lark");
}

#[test]
fn arithmetic_with_left_recursion() {
    check("lark", "arithmetic.lark");
    check("gbnf", "arithmetic.gbnf");
}

#[test]
fn sql_select_subset() {
    check("lark", "sql.lark");
}

#[test]
fn csv_with_three_columns() {
    check("gbnf", "csv3.gbnf");
}

#[test]
fn a_small_programming_language() {
    check("lark", "lang.lark");
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

/// A grammar whose start can never finish is an error naming the rules that cannot; an
/// alternative that can never finish is dropped, so a walk never enters it and no byte of it
/// is allowed (before, `a ::= "x" a` forced `x` after `x` until the plugin's time limit).
#[test]
fn rules_that_can_never_finish_are_errors_or_dropped() {
    let table = table();
    let err = |kind: &str, src: &str| GrammarPlugin.compile(kind, src, "{}", &table).err().unwrap();
    let e = err("gbnf", "root ::= a\na ::= \"x\" a\n");
    assert_eq!(e.code, ErrorCode::InvalidSource, "{e}");
    assert_eq!(
        e.message,
        "the grammar matches no text: `root`, `a` can never finish (each alternative needs itself again, or a terminal that matches no text)"
    );
    let e = err("lark", "start: a\na: \"(\" b \")\"\nb: a | \"[\" b \"]\"\n");
    assert!(e.message.contains("`a`") && e.message.contains("`b`"), "{e}");
    let e = err("lark", "start: /[^\\s\\S]/\n");
    assert!(e.message.starts_with("the grammar matches no text"), "{e}");

    // `y` leads only into `b`, which never finishes: only `x` may start the output.
    let (table, c) = compile("gbnf", "root ::= \"x\" | \"y\" b\nb ::= \"z\" b\n");
    let mask = c.new_matcher().compute_mask().unwrap();
    assert!(mask.allows(b'x' as u32) && !mask.allows(b'y' as u32), "{mask:?}");
    assert!(walk_text(&mut *c.new_matcher(), &table, b"x").accepted());
    let w = walk_text(&mut *c.new_matcher(), &table, b"yzz");
    assert_eq!(w.rejected_at, Some(0), "{w:?}");
}

/// A vocabulary with the shapes of a real one: words with and without a leading space,
/// keywords and their extensions, words glued to punctuation, numbers and strings, so that
/// the trie has large subtrees an identifier state loops over and subtrees it leaves midway.
fn rich_table() -> Arc<TokenTable> {
    let words = "let lets letter fn fnord while whiles return returned if iff else true truex false x xy xyz \
        add adder print foo fooo food foo_bar n f a b select SELECT from FROM where null nul abc abcd abcde \
        abcdef é éa 日本語 日本 ü_x \u{1f980} abé xyü fooé";
    let mut extra: Vec<String> = Vec::new();
    for w in words.split_whitespace() {
        for prefix in ["", " ", "  ", "(", "\"", "{\""] {
            for suffix in ["", "(", ";", " =", "_x", "9", ",", "\"", "\":", ")"] {
                extra.push(format!("{prefix}{w}{suffix}"));
            }
        }
    }
    // Letters and non-ASCII only below ` qq`: an identifier state loops over the letters but
    // not over `é`, which a string state does.
    extra.extend(
        [" qq", " qqé", " qqéé", " qqa", " qqab", " qqü", "\"qq", "\"qqé", "\"qqéé", "\"qqab"].map(String::from),
    );
    extra.extend(
        ["==", " ==", "!=", "<=", " <", "12", "123", " 1", "0.5", "\"abc\"", "{}", "[]", "],", "},"].map(String::from),
    );
    let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    Arc::new(TokenTable::byte_level_for_tests(&refs))
}

/// The mask fast path (token groups stepped by their DFA alone, walk states tabulated and
/// kept across masks, subtrees an identifier state loops over taken whole) allows exactly the
/// tokens the plain trie walk allows, at every prefix of every valid sample.
#[test]
fn fast_masks_equal_the_plain_walk() {
    use dspark_guest::{Recognizer, TokenSet};
    let table = rich_table();
    for (kind, file) in [
        ("gbnf", "json.gbnf"),
        ("lark", "json.lark"),
        ("lark", "sql.lark"),
        ("gbnf", "csv3.gbnf"),
        ("lark", "lang.lark"),
    ] {
        let rec = compile_recognizer(kind, &fixture(file)).unwrap();
        let samples: serde_json::Value = serde_json::from_str(&fixture(&format!("{file}.samples.json"))).unwrap();
        for text in samples["valid"].as_array().unwrap() {
            let mut state = rec.start();
            for (i, &b) in text.as_str().unwrap().as_bytes().iter().enumerate() {
                let mut fast = TokenSet::new(table.vocab_size());
                assert!(rec.fill_mask(&state, &table, &mut fast));
                let mut slow = TokenSet::new(table.vocab_size());
                let mut stack = Vec::new();
                table.trie().walk(&state, &mut stack, |s, b| rec.advance(s, b), |t| slow.insert(t));
                assert_eq!(fast.words(), slow.words(), "{file}: {text} at byte {i}");
                state = rec.advance(&state, b).unwrap();
            }
        }
    }
}

/// A terminal that may match nothing ends at once when the next byte cannot continue it: the
/// byte goes on to what follows (the fast path must not refuse it for not starting the
/// terminal).
#[test]
fn an_empty_terminal_hands_the_byte_on() {
    use dspark_guest::{Recognizer, TokenSet};
    let table = rich_table();
    // GBNF keeps `[a]*` a terminal of its own between the two rules.
    let rec = compile_recognizer("gbnf", "root ::= b a x\nb ::= \"b\" | \"b\" b\na ::= [a]*\nx ::= \"x\" | \"x\" x\n")
        .unwrap();
    let mut state = rec.start();
    for &b in b"b" {
        state = rec.advance(&state, b).unwrap();
    }
    let mut fast = TokenSet::new(table.vocab_size());
    assert!(rec.fill_mask(&state, &table, &mut fast));
    let mut slow = TokenSet::new(table.vocab_size());
    table.trie().walk(&state, &mut Vec::new(), |s, b| rec.advance(s, b), |t| slow.insert(t));
    assert!(slow.contains(b'x' as u32) && slow.contains(b'a' as u32));
    assert_eq!(fast.words(), slow.words());
}

/// Bytes of one class (the walk table keeps a transition per class) step every state of a
/// sample's prefixes alike, and a grammar of keywords, names and punctuation has far fewer
/// classes than bytes.
#[test]
fn bytes_of_one_class_step_alike() {
    use dspark_guest::Recognizer;
    for (kind, file, most) in
        [("gbnf", "json.gbnf", 128), ("lark", "json.lark", 128), ("lark", "sql.lark", 128), ("lark", "lang.lark", 128)]
    {
        let rec = compile_recognizer(kind, &fixture(file)).unwrap();
        let classes = rec.byte_classes();
        eprintln!("{file}: {} byte classes", classes.count());
        assert!(classes.count() <= most, "{file}: {} byte classes", classes.count());
        // The first byte of each class stands for the class.
        let mut first = vec![None; classes.count()];
        for b in 0..=255u8 {
            first[classes.class_of(b) as usize].get_or_insert(b);
        }
        let samples: serde_json::Value = serde_json::from_str(&fixture(&format!("{file}.samples.json"))).unwrap();
        for text in samples["valid"].as_array().unwrap() {
            let mut state = rec.start();
            for &next in text.as_str().unwrap().as_bytes() {
                for b in 0..=255u8 {
                    let stand_in = first[classes.class_of(b) as usize].unwrap();
                    let (a, c) = (rec.advance(&state, b), rec.advance(&state, stand_in));
                    assert_eq!(
                        a.map(|s| rec.state_key(&s)),
                        c.map(|s| rec.state_key(&s)),
                        "{file}: {text} bytes {b} and {stand_in}"
                    );
                }
                state = rec.advance(&state, next).unwrap();
            }
        }
    }
}

/// Found by fuzzing the regex plugin, which shares the automata: a terminal branch that can
/// never match (`no^`) must not be entered, or the walk is at a dead end after `n`.
#[test]
fn a_terminal_branch_that_can_never_match_is_no_way_in() {
    for (kind, grammar) in [("lark", "start: /(yes|no^)/ \"!\"\n"), ("gbnf", "root ::= [a-z] \"b\" | \"x\"\n")] {
        let rec = compile_recognizer(kind, grammar).unwrap();
        dspark_guest::testing::assert_no_dead_ends(&rec, 8);
    }
    let rec = compile_recognizer("lark", "start: /(yes|no^)/\n").unwrap();
    assert!(rec.matches(b"yes") && !rec.matches(b"no"));
}
