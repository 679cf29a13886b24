//! `propertyNames` as a pattern every key must match (from `pattern`, `enum`/`const` or the
//! length bounds), in both property orders.

use dspark_plugin_json_schema::compile_recognizer;

fn accepts(schema: &str, options: &str, text: &str) -> bool {
    compile_recognizer("json-schema", schema, options).unwrap_or_else(|e| panic!("{e}")).0.matches(text.as_bytes())
}

#[test]
fn keys_follow_the_pattern() {
    let schema =
        r#"{"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}}"#;
    for o in ["{}", r#"{"property_order":"any"}"#] {
        assert!(accepts(schema, o, r#"{"abc":1,"x":2}"#));
        assert!(!accepts(schema, o, r#"{"Abc":1}"#));
        assert!(!accepts(schema, o, r#"{"abc":"s"}"#), "values keep the additionalProperties schema");
    }
}

#[test]
fn declared_names_outside_the_pattern_cannot_appear() {
    let schema = r#"{"type": "object", "properties": {"ok": {"type": "integer"}, "NO": {"type": "integer"}},
        "propertyNames": {"maxLength": 2}}"#;
    assert!(accepts(schema, "{}", r#"{"ok":1,"ab":3}"#));
    assert!(!accepts(schema, "{}", r#"{"abc":3}"#), "three characters");
    let required = r#"{"type": "object", "required": ["long"], "propertyNames": {"maxLength": 2}}"#;
    let e = compile_recognizer("json-schema", required, "{}").err().unwrap();
    assert!(e.message.contains("admits no value"), "{e}");
}

#[test]
fn enum_false_and_unsupported_forms() {
    let schema = r#"{"type": "object", "propertyNames": {"enum": ["a.b", "c"]}}"#;
    assert!(accepts(schema, "{}", r#"{"a.b":1,"c":2}"#));
    assert!(!accepts(schema, "{}", r#"{"axb":1}"#), "the dot is literal");
    assert!(accepts(r#"{"propertyNames": false}"#, "{}", "{}"));
    assert!(!accepts(r#"{"propertyNames": false}"#, "{}", r#"{"a":1}"#));
    let e = compile_recognizer("json-schema", r#"{"propertyNames": {"format": "email"}}"#, "{}").err().unwrap();
    assert_eq!(e.location.as_deref(), Some("#/propertyNames/format"), "{e}");
}
