//! `not` in the forms pushed inwards: `not: {}`, `not: {required: [...]}` (alone, in `anyOf`,
//! in `allOf`) and `not: {type: ...}`; other forms are errors naming `not`.

use dspark_plugin_json_schema::compile_recognizer;

fn accepts(schema: &str, options: &str, text: &str) -> bool {
    compile_recognizer("json-schema", schema, options).unwrap_or_else(|e| panic!("{e}")).0.matches(text.as_bytes())
}

#[test]
fn required_sets_that_must_not_all_appear() {
    let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "not": {"required": ["a", "b"]}}"#;
    for o in ["{}", r#"{"property_order":"any"}"#] {
        assert!(accepts(schema, o, r#"{"a":1,"c":3}"#), "{o}");
        assert!(accepts(schema, o, r#"{"b":2,"c":3}"#), "{o}");
        assert!(!accepts(schema, o, r#"{"a":1,"b":2}"#), "{o}");
    }
    let single = r#"{"type": "object", "not": {"required": ["secret"]}}"#;
    assert!(accepts(single, "{}", r#"{"other":1}"#));
    assert!(!accepts(single, "{}", r#"{"secret":1}"#), "an additional key of that name is refused too");
    let any = r#"{"type": "object", "not": {"anyOf": [{"required": ["x"]}, {"required": ["y"]}]}}"#;
    assert!(accepts(any, "{}", r#"{"z":1}"#));
    assert!(!accepts(any, "{}", r#"{"y":1}"#));
}

/// A forbidden set with a required member: the optional members are refused once writing
/// them would leave the required one unwritable (no dead end).
#[test]
fn a_required_member_is_counted_as_coming() {
    let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a"], "not": {"required": ["a", "b"]}, "additionalProperties": false}"#;
    let o = r#"{"property_order":"any"}"#;
    assert!(accepts(schema, o, r#"{"a":1}"#));
    assert!(!accepts(schema, o, r#"{"b":1,"a":2}"#));
    let (rec, _) = compile_recognizer("json-schema", schema, o).unwrap();
    use dspark_guest::Recognizer;
    let mut s = rec.start();
    for &b in br#"{""# {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'b').is_none(), "`b` first would make `a` impossible");
    let all = r#"{"type": "object", "required": ["a", "b"], "not": {"required": ["a", "b"]}}"#;
    assert!(compile_recognizer("json-schema", all, "{}").is_err(), "no object satisfies both");
}

#[test]
fn empty_not_and_types() {
    let schema =
        r#"{"type": "object", "properties": {"gone": {"not": {}}, "v": {"not": {"type": ["string", "null"]}}}}"#;
    assert!(accepts(schema, "{}", r#"{"v":1}"#));
    assert!(accepts(schema, "{}", r#"{"v":[true]}"#));
    assert!(!accepts(schema, "{}", r#"{"v":"s"}"#));
    assert!(!accepts(schema, "{}", r#"{"gone":1}"#));
    let e = compile_recognizer("json-schema", r#"{"not": {"pattern": "^a"}}"#, "{}").err().unwrap();
    assert_eq!(e.location.as_deref(), Some("#/not"), "{e}");
    assert!(e.message.contains("`not`"), "{e}");
}
