//! `dependentRequired` and array-valued `dependencies` in both property orders: the texts a
//! schema admits, and no state from which the object cannot be finished.

use dspark_guest::Recognizer;
use dspark_plugin_json_schema::compile_recognizer;

const SCHEMA: &str = r#"{"type": "object",
  "properties": {"name": {"type": "string"}, "card": {"type": "integer"}, "billing": {"type": "string"}, "zip": {"type": "string"}},
  "dependentRequired": {"card": ["billing"]},
  "dependencies": {"billing": ["zip"]},
  "additionalProperties": false}"#;

fn accepts(options: &str, text: &str) -> bool {
    compile_recognizer("json-schema", SCHEMA, options).unwrap().0.matches(text.as_bytes())
}

#[test]
fn schema_order() {
    let o = "{}";
    for ok in [
        r#"{}"#,
        r#"{"name":"a"}"#,
        r#"{"card":1,"billing":"x","zip":"1"}"#,
        r#"{"billing":"x","zip":"1"}"#,
        r#"{"zip":"1"}"#,
    ] {
        assert!(accepts(o, ok), "{ok}");
    }
    for bad in
        [r#"{"card":1}"#, r#"{"card":1,"billing":"x"}"#, r#"{"billing":"x"}"#, r#"{"name":"a","card":1,"zip":"1"}"#]
    {
        assert!(!accepts(o, bad), "{bad}");
    }
}

#[test]
fn any_order() {
    let o = r#"{"property_order":"any"}"#;
    for ok in [
        r#"{"zip":"1","billing":"x","card":1}"#,
        r#"{"billing":"x","name":"n","zip":"1"}"#,
        r#"{"card":2,"zip":"1","billing":"x"}"#,
    ] {
        assert!(accepts(o, ok), "{ok}");
    }
    for bad in [r#"{"card":1,"zip":"1"}"#, r#"{"billing":"x","card":1}"#] {
        assert!(!accepts(o, bad), "{bad}");
    }
}

/// In schema order a trigger whose requirement comes earlier in the schema cannot be written
/// once the requirement was skipped: the key is refused rather than leading to a dead end.
#[test]
fn no_dead_ends_in_schema_order() {
    let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "dependentRequired": {"b": ["a"]}, "additionalProperties": false}"#;
    let (rec, _) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(rec.matches(br#"{"a":1,"b":2}"#));
    assert!(!rec.matches(br#"{"b":2}"#));
    let mut state = rec.start();
    for &b in b"{" {
        state = rec.advance(&state, b).unwrap();
    }
    // After `{"`, `b` may not start: `a` would have to come before it.
    let s = rec.advance(&state, b'"').unwrap();
    assert!(rec.advance(&s, b'a').is_some());
    assert!(rec.advance(&s, b'b').is_none(), "writing `b` first can never be completed");
}

#[test]
fn dependent_schemas_that_reduce_to_presence() {
    // `{required}`: the same as the array form.
    let (rec, _) = compile_recognizer("json-schema", r#"{"dependencies": {"a": {"required": ["b"]}}}"#, "{}").unwrap();
    assert!(rec.matches(br#"{"a":1,"b":2}"#) && !rec.matches(br#"{"a":1}"#));
    // `{not: {required}}`: mutual exclusion with the trigger.
    let schema = r#"{"type": "object", "properties": {"x": {}, "y": {}},
        "dependentSchemas": {"x": {"not": {"required": ["y"]}}}}"#;
    for o in ["{}", r#"{"property_order":"any"}"#] {
        let (rec, _) = compile_recognizer("json-schema", schema, o).unwrap();
        assert!(rec.matches(br#"{"x":1}"#) && rec.matches(br#"{"y":1}"#), "{o}");
        assert!(!rec.matches(br#"{"x":1,"y":2}"#), "{o}");
    }
}

#[test]
fn other_dependent_schemas_are_refused_with_a_pointer() {
    let e = compile_recognizer(
        "json-schema",
        r#"{"dependencies": {"a": {"properties": {"b": {"type": "string"}}}}}"#,
        "{}",
    )
    .err()
    .unwrap();
    assert_eq!(e.location.as_deref(), Some("#/dependencies/a"));
    assert!(e.message.contains("dependent schema"), "{e}");
    let (rec, _) = compile_recognizer("json-schema", r#"{"dependencies": {"a": {}, "b": true}}"#, "{}").unwrap();
    assert!(rec.matches(br#"{"a":1}"#), "trivially true dependencies constrain nothing");
}
