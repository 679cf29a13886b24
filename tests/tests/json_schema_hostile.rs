//! Hostile schemas against the json-schema plugin in the real sandbox: each one is compiled
//! within the compile deadline or refused with a clear error; the host never hangs, traps or
//! runs out of memory, and the plugin keeps serving afterwards.

use std::sync::Arc;

use dspark_host::plugin::{ErrorCode, PluginError, PluginInstance};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};
use dspark_tests::{Fixture, builtin_plugin, tokenizer_json};

fn instance() -> (Fixture, PluginInstance) {
    let f = Fixture::new(&[builtin_plugin("json-schema")], |_| {});
    let tok = Arc::new(HfTokenizer::from_file(&tokenizer_json("llama3"), None).unwrap());
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    let inst = f.registry.get("json-schema").unwrap().instantiate(tok.table().clone(), canonical).unwrap();
    (f, inst)
}

/// Compiles `schema`; Ok(()) if it compiled and a mask can be computed, Err(code, message)
/// if it was refused. A trap fails the test.
fn try_schema(inst: &mut PluginInstance, schema: &str) -> Result<(), (ErrorCode, String)> {
    match inst.compile("json-schema", schema, "{}") {
        Ok(c) => {
            let m = inst.new_matcher(&c).expect("matcher");
            inst.commit(&m, &[]).expect("start");
            inst.compute_mask(&m).expect("mask");
            Ok(())
        }
        Err(PluginError::Constraint { error, .. }) => Err((error.code, error.message)),
        Err(other) => panic!("hostile schema made the plugin fail instead of refusing: {other}"),
    }
}

#[test]
fn hostile_schemas_are_compiled_or_refused_clearly() {
    let (_f, mut inst) = instance();

    let deep = format!("{}{{}}{}", r#"{"type":"array","items":"#.repeat(10_000), "}".repeat(10_000));
    let (code, msg) = try_schema(&mut inst, &deep).unwrap_err();
    assert_eq!(code, ErrorCode::TooLarge);
    assert!(msg.starts_with("the schema nests deeper than 128 levels"), "{msg}");

    let nested_props = format!("{}{{}}{}", r#"{"properties":{"a":"#.repeat(60), "}}".repeat(60));
    try_schema(&mut inst, &nested_props).expect("60 levels of properties compile");

    let values: Vec<String> = (0..100_000).map(|i| format!("\"value-{i}\"")).collect();
    try_schema(&mut inst, &format!(r#"{{"enum":[{}]}}"#, values.join(","))).expect("a 100,000-value enum compiles");

    for pattern in [r"(a|aa)*b", r"(x+x+)+y", r"^(\w+\s?)*$"] {
        let schema = serde_json::json!({"type": "string", "pattern": pattern}).to_string();
        try_schema(&mut inst, &schema).unwrap_or_else(|e| panic!("{pattern}: {e:?}"));
    }
    let (code, msg) = try_schema(&mut inst, r#"{"type":"string","pattern":"(a|b)*a(a|b){24}"}"#).unwrap_err();
    assert_eq!(code, ErrorCode::TooLarge, "{msg}");

    let (_, msg) =
        try_schema(&mut inst, r##"{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}"##)
            .unwrap_err();
    assert!(msg.contains("circular `$ref` with no base case"), "{msg}");

    let (code, msg) = try_schema(&mut inst, r#"{"$ref":"https://example.com/schema.json"}"#).unwrap_err();
    assert_eq!(code, ErrorCode::Unsupported);
    assert!(msg.contains("the sandbox has no network"), "{msg}");

    // Over 10 MB: 300,000 properties.
    let props: Vec<String> = (0..300_000).map(|i| format!(r#""property_{i:08}":{{"type":"string"}}"#)).collect();
    let big = format!(r#"{{"type":"object","properties":{{{}}}}}"#, props.join(","));
    assert!(big.len() > 10_000_000);
    let (code, msg) = try_schema(&mut inst, &big).unwrap_err();
    assert_eq!(code, ErrorCode::TooLarge, "{msg}");
    assert!(msg.ends_with("bytes; the limit is 4194304"), "{msg}");
    // Just under the size limit: 100,000 properties compile.
    let props: Vec<String> = (0..100_000).map(|i| format!(r#""property_{i:08}":{{"type":"string"}}"#)).collect();
    try_schema(&mut inst, &format!(r#"{{"type":"object","properties":{{{}}}}}"#, props.join(",")))
        .expect("a 3.5 MB schema compiles");

    // Still serving.
    try_schema(&mut inst, r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#).expect("still serving");
}
