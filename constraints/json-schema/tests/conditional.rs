//! `if`/`then`/`else`: the union of `allOf: [rest, if, then]` and `allOf: [rest, not(if),
//! else]`, with `not(if)` pushed inwards; forms whose negation cannot be enforced are errors
//! naming the keyword.

use dspark_guest::ErrorCode;
use dspark_plugin_json_schema::compile_recognizer;

fn accepts(schema: &str, text: &str) -> bool {
    let (rec, _) = compile_recognizer("json-schema", schema, r#"{"property_order":"any"}"#)
        .unwrap_or_else(|e| panic!("{schema}: {e}"));
    rec.matches(text.as_bytes())
}

#[test]
fn a_discriminating_const_picks_the_branch() {
    let schema = r#"{"type": "object",
        "properties": {"kind": {"type": "string"}, "size": {"type": "integer"}, "name": {"type": "string"}},
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "box"}}},
        "then": {"required": ["size"]},
        "else": {"required": ["name"]}}"#;
    assert!(accepts(schema, r#"{"kind":"box","size":3}"#));
    assert!(!accepts(schema, r#"{"kind":"box","name":"x"}"#), "a box needs its size");
    assert!(accepts(schema, r#"{"kind":"bag","name":"x"}"#));
    assert!(accepts(schema, r#"{"kind":"boxes","name":"x"}"#), "a longer string is not the const");
    assert!(accepts(schema, r#"{"kind":"bo","name":"x"}"#), "a prefix is not the const");
    assert!(accepts(schema, r#"{"kind":"","name":"x"}"#));
    assert!(!accepts(schema, r#"{"kind":"bag","size":3}"#), "anything else needs a name");
}

#[test]
fn enums_numbers_booleans_and_required_conditions() {
    let num = r#"{"if": {"enum": [1, 2.5]}, "then": {"type": "integer"}, "else": {"type": "string"}}"#;
    assert!(accepts(num, "1"));
    assert!(!accepts(num, "2.5"), "2.5 is in the enum, so it must be an integer");
    assert!(accepts(num, r#""x""#));
    assert!(!accepts(num, "3"), "not in the enum: must be a string");
    let boolean = r#"{"if": {"const": true}, "then": true, "else": {"type": "null"}}"#;
    assert!(accepts(boolean, "true"));
    assert!(!accepts(boolean, "false"));
    assert!(accepts(boolean, "null"));
    let req = r#"{"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}"#;
    assert!(accepts(req, r#"{"a":1,"b":2}"#));
    assert!(!accepts(req, r#"{"a":1}"#));
    assert!(accepts(req, r#"{"c":1}"#), "no `else`: anything without `a`");
    let typed = r#"{"if": {"type": "string"}, "then": {"maxLength": 2}, "else": {"type": "integer"}}"#;
    assert!(accepts(typed, r#""ab""#));
    assert!(!accepts(typed, r#""abc""#));
    assert!(accepts(typed, "7"));
    assert!(!accepts(typed, "true"));
}

#[test]
fn non_objects_pass_an_object_condition() {
    // `properties` holds for any non-object, so a string takes `then`.
    let schema =
        r#"{"if": {"properties": {"a": {"const": 1}}}, "then": {"type": "string"}, "else": {"type": "object"}}"#;
    assert!(accepts(schema, r#""s""#));
    assert!(!accepts(schema, "5"));
    assert!(accepts(schema, r#"{"a":2}"#), "an object with a different `a` takes `else`");
    assert!(!accepts(schema, r#"{"a":1}"#), "an object whose `a` is 1 takes `then` (a string)");
}

#[test]
fn bounds_fail_inside_their_type() {
    let schema =
        r#"{"if": {"minimum": 3, "maxLength": 2}, "then": {"type": ["integer", "string"]}, "else": {"const": 0}}"#;
    assert!(accepts(schema, "4"), "4 >= 3: then");
    assert!(!accepts(schema, "4.5"), "then wants an integer");
    assert!(accepts(schema, "0"), "0 < 3: else, and 0 is its const");
    assert!(!accepts(schema, "1"), "1 < 3: else wants 0");
    assert!(accepts(schema, r#""ab""#), "short string passes both bounds: then");
    assert!(!accepts(schema, r#""abc""#), "too long: else wants 0");
    let items = r#"{"if": {"minItems": 2}, "then": {"maxItems": 3}, "else": {"type": "array", "maxItems": 0}}"#;
    assert!(accepts(items, "[1,2]"));
    assert!(!accepts(items, "[1,2,3,4]"));
    assert!(accepts(items, "[]"));
    assert!(!accepts(items, "[1]"));
}

#[test]
fn unsupported_conditions_name_the_keyword() {
    let e = compile_recognizer("json-schema", r#"{"if": {"pattern": "^a"}, "then": {"type": "integer"}}"#, "{}")
        .err()
        .expect("an unsupported condition");
    assert_eq!(e.code, ErrorCode::Unsupported);
    assert!(e.location.as_deref().is_some_and(|l| l.contains("/if/pattern")) && e.message.contains("pattern"), "{e:?}");
}

#[test]
fn drafts_without_conditionals_ignore_them_with_a_warning() {
    let schema = r#"{"$schema": "http://json-schema.org/draft-04/schema#",
        "if": {"const": 1}, "then": {"const": 2}}"#;
    let (rec, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(rec.matches(b"1"), "draft 4 has no `if`: any value");
    assert!(warnings.iter().any(|w| w.location.ends_with("/if") && w.message.contains("draft")), "{warnings:?}");
    let (rec, _) = compile_recognizer("json-schema", schema, r#"{"draft":"7"}"#).unwrap();
    assert!(!rec.matches(b"1"), "under draft 7 the condition applies");
}

#[test]
fn conditionals_in_several_all_of_branches_each_apply() {
    let schema = r#"{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {}, "d": {}},
        "allOf": [
            {"if": {"properties": {"a": {"const": 1}}, "required": ["a"]}, "then": {"required": ["c"]}},
            {"if": {"properties": {"b": {"const": 2}}, "required": ["b"]}, "then": {"required": ["d"]}, "else": {"not": {"required": ["d"]}}}
        ]}"#;
    assert!(accepts(schema, r#"{"a":1,"b":2,"c":0,"d":0}"#));
    assert!(!accepts(schema, r#"{"a":1,"b":2,"d":0}"#), "a = 1 needs c");
    assert!(!accepts(schema, r#"{"a":1,"b":2,"c":0}"#), "b = 2 needs d");
    assert!(accepts(schema, r#"{"a":0,"b":3}"#));
    assert!(!accepts(schema, r#"{"a":0,"b":3,"d":0}"#), "b != 2 forbids d");
    let five = format!(
        r#"{{"allOf": [{}]}}"#,
        (0..5).map(|i| format!(r#"{{"if": {{"const": {i}}}, "then": true}}"#)).collect::<Vec<_>>().join(",")
    );
    let e = compile_recognizer("json-schema", &five, "{}").err().expect("too many conditions");
    assert_eq!(e.code, ErrorCode::Unsupported);
}

#[test]
fn a_condition_on_an_enum_property_of_a_typed_object() {
    // JSONSchemaBench Github_easy o4834: `c` has its own enum in `properties`.
    let schema = r#"{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                       "c": {"type": "string", "enum": ["abc", "def", "ghi", "jkl"]}},
        "if": {"properties": {"c": {"enum": ["ghi"]}}},
        "then": {"required": ["a", "b", "c"]}, "else": {"required": ["a", "c"]}}"#;
    assert!(accepts(schema, r#"{"a":"example string","b":123,"c":"ghi"}"#));
    assert!(!accepts(schema, r#"{"a":"example string","c":"ghi"}"#), "`ghi` needs `b`");
    assert!(accepts(schema, r#"{"a":"example string","c":"abc"}"#));
    assert!(!accepts(schema, r#"{"a":"example string","b":123,"c":"ghj"}"#));
}

#[test]
fn an_enum_meets_the_other_branches_keywords() {
    let pattern = r#"{"allOf": [{"type": "string", "enum": ["abc", "ghi"]}, {"type": "string", "pattern": "^a"}]}"#;
    assert!(accepts(pattern, r#""abc""#));
    assert!(!accepts(pattern, r#""ghi""#), "`ghi` fails the pattern");
    let any = r#"{"allOf": [{"type": "string", "enum": ["abc", "ghi"]}, {"anyOf": [{"type": "number"}, {"type": "string", "pattern": "^a"}]}]}"#;
    assert!(accepts(any, r#""abc""#));
    assert!(!accepts(any, r#""ghi""#), "`ghi` fails every branch");
    let enums = r#"{"enum": ["a", "b", 3], "anyOf": [{"enum": ["b", "c"]}, {"type": "integer", "minimum": 3}]}"#;
    assert!(accepts(enums, r#""b""#));
    assert!(accepts(enums, "3"));
    assert!(!accepts(enums, r#""a""#), "`a` is in no branch's enum");
}

#[test]
fn keywords_beside_an_any_of_apply_to_its_ref_branches_in_draft_4() {
    // JSONSchemaBench JsonSchemaStore resjson: `minProperties` beside `anyOf: [.., {$ref}]`.
    let schema = r##"{"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
        "additionalProperties": {"minProperties": 1, "anyOf": [{"type": "string"}, {"$ref": "#/definitions/resource"}]},
        "definitions": {"resource": {"type": "object",
            "additionalProperties": {"minProperties": 1, "anyOf": [{"type": "string"}, {"$ref": "#/definitions/resource"}]}}}}"##;
    assert!(accepts(schema, r#"{"a":"x","b":{"c":"y","d":{"e":"z"}}}"#));
    assert!(!accepts(schema, r#"{"a":"x","b":{"c":"y","d":{}}}"#), "an empty resource");
    assert!(!accepts(schema, r#"{"a":{}}"#));
    // The branch's own siblings of `$ref` are still ignored under draft 4.
    let own = r##"{"$schema": "http://json-schema.org/draft-04/schema#",
        "anyOf": [{"$ref": "#/definitions/s", "maxLength": 1}], "definitions": {"s": {"type": "string"}}}"##;
    assert!(accepts(own, r#""long""#));
}

#[test]
fn one_of_is_exact_where_its_branches_can_be_negated() {
    let xor = r#"{"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}"#;
    let (_, warnings) = compile_recognizer("json-schema", xor, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(accepts(xor, r#"{"a":1}"#));
    assert!(accepts(xor, r#"{"b":2}"#));
    assert!(!accepts(xor, r#"{"a":1,"b":2}"#), "both branches hold");
    assert!(!accepts(xor, r#"{}"#), "neither holds");
    let shapes = r#"{"oneOf": [{"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2}]}"#;
    assert!(accepts(shapes, r#""a""#));
    assert!(accepts(shapes, r#""abcd""#));
    assert!(!accepts(shapes, r#""ab""#), "both branches hold");
    // A branch whose failure cannot be enforced: `anyOf` with a warning, as before.
    let (_, warnings) =
        compile_recognizer("json-schema", r#"{"oneOf": [{"type": "integer"}, {"minimum": 2}]}"#, "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}

#[test]
fn one_of_branches_that_are_references_are_inlined() {
    let schema = r##"{"type": "object", "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        "$defs": {"a": {"required": ["a"]}, "b": {"required": ["b"]}}}"##;
    let (_, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(accepts(schema, r#"{"a":1}"#));
    assert!(!accepts(schema, r#"{"a":1,"b":2}"#));
}

#[test]
fn one_of_is_exact_beside_references_and_over_many_branches() {
    // The keywords beside the `oneOf` may hold references; nine one-key branches.
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8"];
    let branches: Vec<String> = keys.iter().map(|k| format!(r#"{{"required": ["{k}"]}}"#)).collect();
    let props: Vec<String> = keys.iter().map(|k| format!(r##""{k}": {{"$ref": "#/$defs/n"}}"##)).collect();
    let schema = format!(
        r#"{{"type": "object", "properties": {{{}}}, "oneOf": [{}], "$defs": {{"n": {{"type": "integer"}}}}}}"#,
        props.join(","),
        branches.join(",")
    );
    let (_, warnings) = compile_recognizer("json-schema", &schema, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(accepts(&schema, r#"{"k8":1}"#));
    assert!(accepts(&schema, r#"{"k3":1}"#));
    assert!(!accepts(&schema, r#"{"k3":1,"k8":2}"#), "two branches hold");
    assert!(!accepts(&schema, r#"{"k3":"x"}"#), "the referenced schema still applies");
    assert!(!accepts(&schema, r#"{}"#), "no branch holds");
}

#[test]
fn one_of_over_branches_with_references_is_strict() {
    let schema = r##"{"type": "object", "oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}],
        "$defs": {"a": {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/$defs/n"}}},
                  "b": {"type": "object", "required": ["b"], "properties": {"b": {"$ref": "#/$defs/n"}}},
                  "n": {"type": "integer"}}}"##;
    let (_, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].location, "#/oneOf");
    assert!(warnings[0].message.starts_with("`oneOf` is enforced strictly"));
    assert!(accepts(schema, r#"{"a":1}"#));
    assert!(accepts(schema, r#"{"b":2}"#));
    assert!(!accepts(schema, r#"{"a":1,"b":2}"#), "both branches hold");
    assert!(!accepts(schema, r#"{}"#), "neither holds");
    assert!(!accepts(schema, r#"{"a":"x"}"#), "the referenced schema applies");
    // Valid (only `a` holds) but refused: the price of not negating `b`'s property schema.
    assert!(!accepts(schema, r#"{"a":1,"b":"x"}"#));
}

#[test]
fn one_of_told_apart_only_by_skipped_properties_stays_any_of() {
    // Every branch requires the same properties; only `status`'s pattern tells them apart.
    let schema = r##"{"type": "object", "oneOf": [{"$ref": "#/$defs/ok"}, {"$ref": "#/$defs/fail"}],
        "$defs": {"ok": {"required": ["status", "data"], "properties": {"status": {"pattern": "^ok$"}, "data": {"$ref": "#/$defs/d"}}},
                  "fail": {"required": ["status", "data"], "properties": {"status": {"pattern": "^fail$"}, "data": {"$ref": "#/$defs/d"}}},
                  "d": {"type": "integer"}}}"##;
    let (_, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].message.starts_with("`oneOf` is enforced as `anyOf`"), "{warnings:?}");
    assert!(accepts(schema, r#"{"status":"ok","data":1}"#));
    assert!(accepts(schema, r#"{"status":"fail","data":1}"#));
}

#[test]
fn one_of_ways_to_fail_that_the_type_rules_out_are_not_cases() {
    // Four object branches, each failing in three ways of which "not an object" cannot
    // happen here: 4 x 2^3 cases instead of 4 x 3^3 (over the budget of 64).
    let branch = |k: &str| {
        format!(
            r#"{{"type": "object", "required": ["{k}"], "properties": {{"{k}": {{"type": "object",
                "required": ["name"], "properties": {{"name": {{"type": "string"}},
                "list": {{"type": "array", "items": {{"type": "string"}}}}}}}}}}}}"#
        )
    };
    let schema = format!(
        r#"{{"type": "object", "oneOf": [{}, {}, {}, {}]}}"#,
        branch("a"),
        branch("b"),
        branch("c"),
        branch("d")
    );
    let (_, warnings) = compile_recognizer("json-schema", &schema, "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].message.starts_with("`oneOf` is enforced strictly"), "{warnings:?}");
    assert!(accepts(&schema, r#"{"a":{"name":"x","list":["y"]}}"#));
    assert!(accepts(&schema, r#"{"a":{"name":"x"},"b":{"list":[]}}"#), "`b` fails by its own required");
    assert!(!accepts(&schema, r#"{"a":{"name":"x"},"b":{"name":"y"}}"#), "two branches hold");
}
