//! Whitespace options: flexible whitespace (bounded per gap), a whitespace pattern, Python
//! `json.dumps` separators and indentation. Fixed layouts are checked against serde_json's
//! own pretty printer, and forced layout bytes come back as forced spans.

use std::sync::Arc;

use dspark_guest::testing::walk_text;
use dspark_guest::{ErrorCode, Plugin, Recognizer, TokenSet, TokenTable};
use dspark_plugin_json_schema::{JsonSchemaPlugin, compile_recognizer};
use serde_json::{Value, json};

const SCHEMA: &str = r#"{"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "integer"}},
    "meta": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "additionalProperties": false},
    "note": {"type": ["string", "null"]}},
  "required": ["name", "tags"], "additionalProperties": false}"#;

fn accepts(options: &str, text: &str) -> bool {
    compile_recognizer("json-schema", SCHEMA, options).unwrap().0.matches(text.as_bytes())
}

#[test]
fn flexible_whitespace_is_bounded_per_gap() {
    let o = r#"{"whitespace": "flexible"}"#;
    for ok in [
        r#"{"name":"a","tags":[]}"#,
        " {\n  \"name\" : \"a b\" ,\n  \"tags\" : [ 1 , 2 ]\t}\n",
        "{\"name\":\"a\",\"tags\":[1],\"meta\":{ }, \"note\": null }",
    ] {
        assert!(accepts(o, ok), "{ok:?}");
    }
    assert!(!accepts(o, &format!("{{{}\"name\":\"a\",\"tags\":[]}}", " ".repeat(21))), "21 spaces in one gap");
    assert!(accepts(
        r#"{"whitespace": "flexible", "max_whitespace": 30}"#,
        &format!("{{{}\"name\":\"a\",\"tags\":[]}}", " ".repeat(21))
    ));
    assert!(!accepts(o, "{\"na me\":\"a\",\"tags\":[]}"), "whitespace inside a key is not layout");
    assert!(!accepts(o, "{\"name\":\"a\",\"tags\":[1 2]}"));
}

#[test]
fn a_whitespace_pattern_applies_to_every_gap() {
    let o = r#"{"whitespace_pattern": "[ ]?"}"#;
    assert!(accepts(o, r#"{"name": "a", "tags": [1, 2]}"#));
    assert!(accepts(o, r#"{"name":"a","tags":[1,2]}"#));
    assert!(!accepts(o, r#"{"name":  "a", "tags": []}"#), "two spaces");
    assert!(!accepts(o, "{\"name\":\n\"a\",\"tags\":[]}"), "a newline");
}

#[test]
fn separators_and_indent_match_the_pretty_printers() {
    let values = [
        json!({"name": "a", "tags": []}),
        json!({"name": "x", "tags": [1, 2, 3], "meta": {}, "note": null}),
        json!({"name": "y", "tags": [7], "meta": {"ok": true}, "note": "n"}),
    ];
    for v in &values {
        let pretty = serde_json::to_string_pretty(v).unwrap();
        assert!(accepts(r#"{"indent": 2}"#, &pretty), "{pretty}");
        assert!(!accepts(r#"{"indent": 2}"#, &v.to_string()), "compact is not indented");
        assert!(!accepts(r#"{"indent": 4}"#, &pretty), "two spaces are not four");
        // Python's json.dumps(v, separators=(", ", ": ")) writes what serde_json's compact form
        // writes with those spaces added after each separator.
        let spaced = python_dumps(v);
        assert!(accepts(r#"{"separators": [", ", ": "]}"#, &spaced), "{spaced}");
        assert!(!accepts(r#"{"separators": [", ", ": "]}"#, &v.to_string()));
    }
}

/// `json.dumps(v, separators=(", ", ": "))` for the values above (no strings with commas).
fn python_dumps(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<String> = m.iter().map(|(k, v)| format!("{}: {}", json!(k), python_dumps(v))).collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(python_dumps).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

#[test]
fn fixed_layouts_are_forced() {
    let table = Arc::new(TokenTable::byte_level_for_tests(&["\n  ", "\": ", ", "]));
    let c = JsonSchemaPlugin.compile("json-schema", SCHEMA, r#"{"indent": 2}"#, &table).unwrap();
    let mut m = c.new_matcher();
    let r = m.commit(&[b'{' as u32]).unwrap();
    // `{` then, since `name` is required, the object is not empty: newline, indentation and
    // the first key are forced (the last quote held back: it may merge with what follows).
    assert_eq!(r.forced, table.tokenize(b"\n  \"name\": "));
    let w = walk_text(
        &mut *c.new_matcher(),
        &table,
        serde_json::to_string_pretty(&json!({"name": "a", "tags": [1]})).unwrap().as_bytes(),
    );
    assert!(w.accepted() && !w.mask_commit_mismatch, "{w:?}");
    assert!(w.forced_tokens > 4, "{w:?}");
}

#[test]
fn string_masks_stay_exact_under_layouts() {
    let table = TokenTable::byte_level_for_tests(&["\", ", "\",\n", "\" ,", "\"}", "\"\n}", "abc", "\"]"]);
    for options in [r#"{"whitespace": "flexible"}"#, r#"{"separators": [", ", ": "]}"#, r#"{"indent": 2}"#] {
        let (rec, _) = compile_recognizer("json-schema", SCHEMA, options).unwrap();
        let prefix = if options.contains("indent") {
            "{\n  \"name\": \"ab"
        } else if options.contains("separators") {
            "{\"name\": \"ab"
        } else {
            "{ \"name\" : \"ab"
        };
        let mut state = rec.start();
        for b in prefix.bytes() {
            state = rec.advance(&state, b).unwrap_or_else(|| panic!("{options}: {prefix:?}"));
        }
        let mut fast = TokenSet::new(table.vocab_size());
        assert!(rec.fill_mask(&state, &table, &mut fast));
        let mut slow = TokenSet::new(table.vocab_size());
        table.trie().walk(&state, &mut Vec::new(), |s, b| rec.advance(s, b), |t| slow.insert(t));
        assert_eq!(fast.words(), slow.words(), "{options}");
    }
}

#[test]
fn bad_layout_options_are_errors() {
    let table = Arc::new(TokenTable::byte_level_for_tests(&[]));
    for (options, part) in [
        (r#"{"whitespace": "flexible", "indent": 2}"#, "exclude each other"),
        (r#"{"separators": ["; ", ": "]}"#, "`separators`"),
        (r#"{"whitespace_pattern": " +"}"#, "must match the empty string"),
        (r#"{"max_whitespace": 5}"#, "applies to"),
        (r#"{"indent": 99}"#, "from 0 to 16"),
    ] {
        let e = JsonSchemaPlugin.compile("json-schema", SCHEMA, options, &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::InvalidOptions, "{options}");
        assert!(e.message.contains(part), "{options}: {}", e.message);
    }
}
