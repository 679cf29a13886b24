//! The recogniser on hand-written schemas: exactly the valid compact documents are accepted.

use dspark_guest::Recognizer;
use dspark_plugin_json_schema::compile_recognizer;

fn check(schema: &str, options: &str, valid: &[&str], invalid: &[&str]) {
    let (rec, _) = compile_recognizer("json-schema", schema, options).unwrap_or_else(|e| panic!("{schema}: {e}"));
    for v in valid {
        assert!(rec.matches(v.as_bytes()), "{schema}: should accept {v}");
    }
    for v in invalid {
        assert!(!rec.matches(v.as_bytes()), "{schema}: should reject {v}");
    }
}

#[test]
fn objects_in_schema_order_with_required_and_additional() {
    let s = r#"{"type":"object","properties":{"id":{"type":"integer"},"name":{"type":"string"},"tag":{"type":"string"}},"required":["id","name"],"additionalProperties":false}"#;
    check(
        s,
        "{}",
        &[r#"{"id":1,"name":"a"}"#, r#"{"id":-12,"name":"","tag":"x"}"#],
        &[
            r#"{"name":"a","id":1}"#,
            r#"{"id":1}"#,
            r#"{"id":1,"name":"a","x":1}"#,
            r#"{"id":1.5,"name":"a"}"#,
            r#"{"id":01,"name":"a"}"#,
        ],
    );
    check(
        s,
        r#"{"property_order":"any"}"#,
        &[r#"{"name":"a","id":1}"#, r#"{"tag":"t","id":1,"name":"a"}"#],
        &[r#"{"id":1,"id":2,"name":"a"}"#],
    );
    let open = r#"{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}"#;
    check(open, "{}", &[r#"{"a":true,"b":[1,{"c":null}]}"#], &[r#"{"a":true,"a":false}"#, r#"{"b":1,"a":true}"#]);
}

#[test]
fn arrays_strings_numbers_and_literals() {
    check(
        r#"{"type":"array","items":{"type":"integer","minimum":1,"maximum":10},"minItems":1,"maxItems":3}"#,
        "{}",
        &["[1]", "[10,2,3]"],
        &["[]", "[0]", "[11]", "[1,2,3,4]", "[1,]"],
    );
    check(
        r#"{"type":"string","minLength":2,"maxLength":3}"#,
        "{}",
        &[r#""ab""#, r#""abc""#, r#""é\n""#],
        &[r#""a""#, r#""abcd""#],
    );
    check(r#"{"type":"string","pattern":"^[a-z]+\\d$"}"#, "{}", &[r#""abc1""#], &[r#""abc""#, r#""1abc1""#]);
    check(r#"{"type":"string","pattern":"o"}"#, "{}", &[r#""foo""#, r#""o""#], &[r#""bar""#]);
    check(
        r#"{"type":"string","format":"date"}"#,
        "{}",
        &[r#""2024-02-29""#, r#""2000-02-29""#, r#""2023-11-30""#],
        &[r#""2024-13-01""#, r#""2023-02-29""#, r#""1900-02-29""#, r#""2023-11-31""#],
    );
    check(
        r#"{"type":"string","format":"date-time"}"#,
        "{}",
        &[r#""2024-05-17T10:00:00Z""#, r#""2024-05-17t10:00:00.5+02:00""#],
        &[r#""2024-05-17 10:00:00Z""#, r#""2024-05-17T10:00:60Z""#],
    );
    check(
        r#"{"type":"number","exclusiveMinimum":0,"maximum":1.5}"#,
        "{}",
        &["0.5", "1.5", "1"],
        &["0", "-1", "1.6", "2"],
    );
    // 12 could only become 12, 120-129 or 1200-1299...: none is in [2000, 2100].
    check(r#"{"type":"integer","minimum":2000,"maximum":2100}"#, "{}", &["2000", "2099"], &["12", "1999", "2101"]);
    let (rec, _) =
        compile_recognizer("json-schema", r#"{"type":"integer","minimum":2000,"maximum":2100}"#, "{}").unwrap();
    let start = dspark_guest::Recognizer::start(&rec);
    assert!(dspark_guest::Recognizer::advance(&rec, &start, b'1').is_none(), "1… never reaches [2000, 2100]");
    assert!(dspark_guest::Recognizer::advance(&rec, &start, b'2').is_some());
    check(r#"{"type":"integer","enum":[1,2]}"#, "{}", &["1", "2"], &["1.0", "3"]);
    check(r#"{"type":"integer"}"#, "{}", &["0", "-1"], &["-0", "1.0", "1e2"]);
    check(r#"{"type":"number"}"#, "{}", &["1e99", "-2.5E-07"], &["1e100", "1e999"]);
    check(r#"{"type":"integer","multipleOf":3}"#, "{}", &["0", "9", "-3"], &["4", "1.5"]);
    check(
        r#"{"type":"number","minimum":0,"maximum":1}"#,
        "{}",
        &["1e-05", "1E0", "0.5e-3", "1e+0"],
        &["2e0", "1e1", "-1e-5", "5e+"],
    );
    check(
        r#"{"enum":["red","green",1,null,{"a":[1]}]}"#,
        "{}",
        &[r#""red""#, "1", "null", r#"{"a":[1]}"#],
        &[r#""blue""#, "2", "10"],
    );
    check(r#"{"const":true}"#, "{}", &["true"], &["false"]);
    check(r#"{"type":["string","null"]}"#, "{}", &["null", r#""x""#], &["1"]);
}

#[test]
fn refs_unions_and_all_of() {
    let tree = r##"{"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"],"additionalProperties":false}},"$ref":"#/$defs/node"}"##;
    check(tree, "{}", &[r#"{"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]}"#], &[r#"{"v":1,"kids":[{"w":2}]}"#]);
    let any_of = r#"{"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"],"additionalProperties":false},{"type":"object","properties":{"b":{"type":"string"}},"required":["b"],"additionalProperties":false}]}"#;
    check(any_of, "{}", &[r#"{"a":1}"#, r#"{"b":"x"}"#], &[r#"{"a":"x"}"#, r#"{"c":1}"#]);
    let all_of = r#"{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}},"required":["b"]}]}"#;
    check(all_of, "{}", &[r#"{"a":1,"b":"x"}"#], &[r#"{"a":1}"#, r#"{"b":"x"}"#]);
    check("true", "{}", &["1", r#"{"a":[true,null]}"#, r#""s""#], &["tru", "{"]);
    let e = compile_recognizer("json-schema", "false", "{}").err().expect("`false` admits nothing");
    assert!(e.message.starts_with("the schema admits no value"), "{e}");
}

#[test]
fn unsupported_and_invalid_schemas_are_errors_with_pointers() {
    let e = compile_recognizer("json-schema", r#"{"properties":{"a":{"not":{"minLength":3}}}}"#, "{}").err().unwrap();
    assert_eq!(e.location.as_deref(), Some("#/properties/a/not"));
    assert!(e.message.contains("`not`"), "{e}");
    let e = compile_recognizer("json-schema", r#"{"$ref":"https://example.com/s.json"}"#, "{}").err().unwrap();
    assert!(e.message.contains("remote"), "{e}");
    for circular in
        [r##"{"$ref":"#"}"##, r##"{"$defs":{"a":{"$ref":"#/$defs/b"},"b":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}"##]
    {
        let e = compile_recognizer("json-schema", circular, "{}").err().expect("circular");
        assert!(e.message.contains("circular `$ref` with no base case"), "{e}");
    }
    let e = compile_recognizer("json-schema", r##"{"$ref":"#/$defs/missing"}"##, "{}").err().unwrap();
    assert!(e.message.contains("does not exist"), "{e}");
    let e = compile_recognizer("json-schema", "{", "{}").err().unwrap();
    assert!(e.message.starts_with("the schema is not valid JSON"), "{e}");
    let e = compile_recognizer("json-schema", "{}", r#"{"indentation":2}"#).err().unwrap();
    assert!(e.message.contains("unknown option `indentation`"), "{e}");
}

/// Integer bounds are exact while the number is written: no prefix is allowed that no
/// integer within the bounds can complete (a random walk would be stuck there).
#[test]
fn integer_prefixes_that_cannot_fit_are_refused() {
    let prefix_alive = |schema: &str, prefix: &str| {
        let (rec, _) = compile_recognizer("json-schema", schema, "{}").unwrap();
        prefix_alive(&rec, prefix)
    };
    let above_minus_one = r#"{"type": "integer", "exclusiveMinimum": -1}"#;
    assert!(!prefix_alive(above_minus_one, "-"), "no negative integer is above -1");
    assert!(prefix_alive(above_minus_one, "0"));
    let below_ten = r#"{"type": "integer", "exclusiveMaximum": 10}"#;
    assert!(prefix_alive(below_ten, "9"));
    assert!(!prefix_alive(below_ten, "10"), "10 is not below 10, and more digits only grow");
    let from_minus_five = r#"{"type": "integer", "minimum": -5.5, "maximum": -2}"#;
    assert!(prefix_alive(from_minus_five, "-5"));
    assert!(!prefix_alive(from_minus_five, "-6"));
    assert!(!prefix_alive(from_minus_five, "-1"), "-1 is above -2 and can only shrink to -10s");
    // Numbers keep exclusive ends loose: an exponent can still land inside.
    assert!(prefix_alive(r#"{"type": "number", "exclusiveMinimum": -1}"#, "-1"));
}

/// In schema order with no undeclared keys, a property is refused where too few come after it
/// to reach `minProperties` (the object could not be closed).
#[test]
fn schema_order_keeps_min_properties_reachable() {
    let schema = r#"{"type": "object", "minProperties": 2, "additionalProperties": false,
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}}"#;
    let (rec, _) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(rec.matches(br#"{"a":1,"c":2}"#));
    assert!(rec.matches(br#"{"b":1,"c":2}"#));
    assert!(!rec.matches(br#"{"c":1}"#));
    use dspark_guest::Recognizer;
    let mut s = rec.start();
    for &b in br#"{""# {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'a').is_some() && rec.advance(&s, b'b').is_some());
    assert!(rec.advance(&s, b'c').is_none(), "`c` first leaves nothing to make two properties");
}

/// A required property whose every branch contradicts the object around it makes the schema
/// admit nothing: an error at compile time, not a dead end while writing.
#[test]
fn unsatisfiable_required_members_are_found_at_compile_time() {
    let schema = r#"{"type": "object", "required": ["d"], "properties": {"d": {
        "type": "object", "required": ["a", "b"],
        "oneOf": [{"not": {"required": ["a"]}}, {"not": {"required": ["b"]}}]}}}"#;
    let e = compile_recognizer("json-schema", schema, "{}").err().expect("nothing fits");
    assert!(e.message.contains("admits no value"), "{e:?}");
    let arrays = r#"{"type": "array", "minItems": 4000000000, "items": {"type": "integer"}}"#;
    assert!(compile_recognizer("json-schema", arrays, "{}").is_ok(), "a huge minItems is productive (and fast)");
}

/// Numeric bounds that no number (or no integer) fits, string patterns that match no text
/// and member counts no object can have are found at compile time, as `minLength` above `maxLength` is: the server answers 400 instead of starting a generation
/// that can only end at a dead end. Bounds that leave one value keep it.
#[test]
fn bounds_and_patterns_that_admit_nothing_are_found_at_compile_time() {
    let empty = [
        r#"{"type":"integer","minimum":5,"maximum":3}"#,
        r#"{"type":"number","minimum":5,"maximum":3}"#,
        r#"{"type":"number","minimum":3,"exclusiveMaximum":3}"#,
        r#"{"type":"integer","exclusiveMinimum":3,"exclusiveMaximum":4}"#,
        r#"{"type":"integer","minimum":3.5,"maximum":3.9}"#,
        r#"{"type":"integer","minimum":1,"maximum":6,"multipleOf":7}"#,
        r#"{"type":"integer","minimum":-6,"maximum":-1,"multipleOf":7}"#,
        // Beyond 2^53 both bounds are the same f64; the exact integer bounds tell them apart.
        r#"{"type":"integer","minimum":18446744073709551615,"maximum":18446744073709551610}"#,
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":2,"maximum":1}},"required":["n"]}"#,
        // Strings: a pattern that matches no text, or lengths that contradict.
        r#"{"type":"string","pattern":"^[^\\s\\S]$"}"#,
        r#"{"type":"string","pattern":"x[^\\s\\S]"}"#,
        r#"{"type":"string","minLength":3,"maxLength":2}"#,
        // Objects: member counts that contradict.
        r#"{"type":"object","minProperties":3,"maxProperties":1}"#,
        r#"{"type":"object","properties":{"a":{},"b":{}},"required":["a","b"],"maxProperties":1}"#,
        r#"{"type":"object","properties":{"a":{},"b":false},"additionalProperties":false,"minProperties":2}"#,
    ];
    for schema in empty {
        let e =
            compile_recognizer("json-schema", schema, "{}").err().unwrap_or_else(|| panic!("{schema} admits nothing"));
        assert!(e.message.starts_with("the schema admits no value"), "{schema}: {e}");
    }
    check(r#"{"type":"number","exclusiveMinimum":3,"exclusiveMaximum":4}"#, "{}", &["3.5"], &["3", "4"]);
    check(r#"{"type":"integer","minimum":3,"maximum":3}"#, "{}", &["3"], &["2", "4"]);
    check(r#"{"type":"integer","minimum":3.5,"maximum":4.5}"#, "{}", &["4"], &["3", "5"]);
    check(r#"{"type":"integer","minimum":-8,"maximum":-6,"multipleOf":7}"#, "{}", &["-7"], &["-8", "-6"]);
    check(r#"{"type":"integer","minimum":1,"maximum":6,"multipleOf":0.5}"#, "{}", &["1", "6"], &["0", "7"]);
    check(
        r#"{"type":"object","properties":{"a":{"type":"integer"}},"patternProperties":{"^x":{"type":"integer"}},"additionalProperties":false,"minProperties":2}"#,
        "{}",
        &[r#"{"a":1,"x1":2}"#],
        &[r#"{"a":1}"#],
    );
    // Only the numbers are ruled out: the other types and optional members stay.
    check(r#"{"type":["integer","string"],"minimum":5,"maximum":3}"#, "{}", &[r#""x""#], &["4"]);
    check(r#"{"type":["string","null"],"pattern":"[^\\s\\S]"}"#, "{}", &["null"], &[r#""x""#, "\"\""]);
    check(
        r#"{"type":"object","properties":{"n":{"type":"integer","minimum":2,"maximum":1}},"additionalProperties":false}"#,
        "{}",
        &["{}"],
        &[r#"{"n":1}"#],
    );
}

/// Each `$ref` is a level of union in the graph; a chain of them longer than the recogniser
/// follows within one byte admitted nothing (the output ended at once with an error). Unions
/// are flattened at compile time, so any length works.
#[test]
fn long_reference_chains_and_nested_unions_still_admit_their_values() {
    for n in [10usize, 63, 64, 500] {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(format!("d{i}"), serde_json::json!({"$ref": format!("#/$defs/d{}", i + 1)}));
        }
        defs.insert(format!("d{n}"), serde_json::json!({"type": "integer"}));
        let schema = serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"}).to_string();
        check(&schema, "{}", &["5", "-12"], &["\"5\"", "1.5"]);
    }
    // A hundred `anyOf`s, each behind a `$ref`: two hundred levels of union.
    let mut defs = serde_json::Map::new();
    for i in 0..100 {
        defs.insert(
            format!("d{i}"),
            serde_json::json!({"anyOf": [{"$ref": format!("#/$defs/d{}", i + 1)}, {"const": i}]}),
        );
    }
    defs.insert("d100".into(), serde_json::json!({"type": "null"}));
    let nested = serde_json::json!({"$defs": defs, "$ref": "#/$defs/d0"}).to_string();
    check(&nested, "{}", &["null", "0", "99"], &["100", "true"]);
    // Two references that lead to each other and to values.
    let cycle = r##"{"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/b"},{"type":"integer"}]},"b":{"anyOf":[{"$ref":"#/$defs/a"},{"type":"string","maxLength":2}]}},"$ref":"#/$defs/a"}"##;
    check(cycle, "{}", &["7", r#""ab""#], &[r#""abc""#, "null"]);
}

/// `allOf` branches with `multipleOf` each: their common multiple, not the first one alone.
#[test]
fn multiples_from_several_branches_are_combined() {
    let s = r#"{"allOf":[{"type":"integer","multipleOf":3},{"multipleOf":5},{"minimum":1,"maximum":100}]}"#;
    check(s, "{}", &["15", "45", "90"], &["3", "5", "99", "10", "105"]);
    let s = r#"{"allOf":[{"type":"integer","multipleOf":4},{"multipleOf":6}]}"#;
    check(s, "{}", &["12", "0", "-24"], &["4", "6", "18"]);
    let s = r#"{"allOf":[{"type":"number","multipleOf":0.5},{"multipleOf":1.5}]}"#;
    check(s, "{}", &["1.5", "3"], &["0.5", "2"]);
    let e =
        compile_recognizer("json-schema", r#"{"allOf":[{"multipleOf":0.3},{"multipleOf":0.5}]}"#, "{}").err().unwrap();
    assert!(e.message.contains("common multiple is not supported"), "{e}");
    let e = compile_recognizer(
        "json-schema",
        r#"{"allOf":[{"type":"integer","multipleOf":3},{"multipleOf":5},{"minimum":1,"maximum":14}]}"#,
        "{}",
    )
    .err()
    .unwrap();
    assert!(e.message.starts_with("the schema admits no value"), "no multiple of 15 in 1..=14: {e}");
    // A prefix with no multiple left within the bounds is refused at once, not written into a
    // dead end (`3` under 2..=3, multiples of 2).
    let s = r#"{"allOf":[{"allOf":[{"type":"integer"},{"minimum":2}]},{"allOf":[{"maximum":3},{"multipleOf":2}]}]}"#;
    check(s, "{}", &["2"], &["3", "0", "4"]);
    let (rec, _) = compile_recognizer("json-schema", s, "{}").unwrap();
    assert!(!prefix_alive(&rec, "3"), "no multiple of 2 starts with 3 within 2..=3");
    let s = r#"{"type":"integer","multipleOf":7,"minimum":-20,"maximum":20}"#;
    check(s, "{}", &["-14", "0", "7", "14"], &["-21", "21", "3"]);
    let (rec, _) = compile_recognizer("json-schema", s, "{}").unwrap();
    assert!(
        prefix_alive(&rec, "-1") && prefix_alive(&rec, "1") && !prefix_alive(&rec, "-2") && !prefix_alive(&rec, "3")
    );
    // uniqueItems from either branch holds.
    let s = r#"{"allOf":[{"type":"array","items":{"type":"integer","minimum":0,"maximum":3},"uniqueItems":false},{"uniqueItems":true}]}"#;
    check(s, "{}", &["[1,2]"], &["[1,1]"]);
}

/// An exponent is refused at the digit after which no exponent ends inside the bounds (a
/// hostile-schema walk wrote `1e000002` under `enum: [1e3]` and could not end).
#[test]
fn exponents_that_cannot_end_inside_the_bounds_are_refused() {
    let s = r#"{"type":"number","minimum":1000,"maximum":5000}"#;
    check(s, "{}", &["1e3", "5e3", "1e0003", "2E+3", "1000"], &["1e2", "6e3"]);
    let (rec, _) = compile_recognizer("json-schema", s, "{}").unwrap();
    assert!(prefix_alive(&rec, "1e000") && !prefix_alive(&rec, "1e2") && !prefix_alive(&rec, "1e000002"));
    let (rec, _) = compile_recognizer("json-schema", r#"{"enum":[0,-0.5,1e3,"x"]}"#, "{}").unwrap();
    assert!(rec.matches(b"1e3") && rec.matches(b"1000") && !prefix_alive(&rec, "1e000002"));
    // The `e` and the exponent's sign too: no exponent of 9 is 5 or 10.
    let (rec, _) = compile_recognizer("json-schema", r#"{"allOf":[{"enum":[1,5,10]},{"minimum":4}]}"#, "{}").unwrap();
    assert!(rec.matches(b"5") && rec.matches(b"10") && rec.matches(b"1e1") && rec.matches(b"5E+0"));
    assert!(!prefix_alive(&rec, "9e") && !prefix_alive(&rec, "9E") && !prefix_alive(&rec, "1e-"));
    // Nor `9` or `4` themselves: no number written with those leading digits is 5 or 10.
    assert!(!prefix_alive(&rec, "9") && !prefix_alive(&rec, "4") && prefix_alive(&rec, "1"));
    let (rec, _) = compile_recognizer("json-schema", r#"{"enum":[-10, 2.5]}"#, "{}").unwrap();
    assert!(rec.matches(b"-10") && rec.matches(b"2.5") && !prefix_alive(&rec, "-9") && prefix_alive(&rec, "-1"));
    let s = r#"{"type":"number","minimum":0.001}"#;
    check(s, "{}", &["1e-3", "1e-0003", "0.005", "7"], &["1e-4"]);
    let (rec, _) = compile_recognizer("json-schema", s, "{}").unwrap();
    assert!(prefix_alive(&rec, "1e-000") && !prefix_alive(&rec, "1e-4"));
}

/// `maxLength` counts characters and a pattern's distance to a match was counted in bytes:
/// under `maxLength: 2` the second `é` (two bytes) was refused at its first byte, so `"é`
/// was a dead end (found by a random walk over a hostile schema).
#[test]
fn multibyte_characters_fill_the_room_by_characters() {
    let s = r#"{"type":"string","minLength":2,"maxLength":2,"pattern":"^[é😀]+$"}"#;
    check(s, "{}", &["\"éé\"", "\"é😀\"", "\"😀😀\""], &["\"é\"", "\"ééé\"", "\"ab\""]);
    // The room is still enforced: three characters of a pattern that needs them do not fit.
    let s = r#"{"type":"string","maxLength":2,"pattern":"^é{3}$"}"#;
    let e = compile_recognizer("json-schema", s, "{}");
    assert!(e.as_ref().map(|(rec, _)| !prefix_alive(rec, "\"é")).unwrap_or(true), "no room for three");
    let s = r#"{"type":"string","maxLength":3,"pattern":"^aé+b$"}"#;
    check(s, "{}", &["\"aéb\""], &["\"aééb\""]);
    let (rec, _) = compile_recognizer("json-schema", s, "{}").unwrap();
    assert!(prefix_alive(&rec, "\"aé") && !prefix_alive(&rec, "\"aéé"));
}

/// Whether some document under `rec` starts with `prefix` (the recogniser's promise: a state
/// it returns can still reach an accepting one).
fn prefix_alive(rec: &impl Recognizer, prefix: &str) -> bool {
    let mut state = rec.start();
    for &b in prefix.as_bytes() {
        match rec.advance(&state, b) {
            Some(next) => state = next,
            None => return false,
        }
    }
    true
}

/// An optional member whose schema admits nothing (JSONSchemaBench's libStorage schema: an
/// `instance` object requires `id` and forbids every undeclared key) cannot be started, an
/// item that admits nothing ends its array before it, and a branch that admits nothing is
/// not taken: a generation never writes a key, a `,` or a value it cannot finish.
#[test]
fn members_items_and_branches_that_admit_nothing_cannot_be_started() {
    let instance =
        r#"{"type":"object","properties":{"name":{"type":"string"}},"required":["id"],"additionalProperties":false}"#;
    for (closed, order) in [(true, "{}"), (true, r#"{"property_order":"any"}"#), (false, "{}")] {
        let schema = format!(
            r#"{{"type":"object","properties":{{"instance":{instance},"volume":{{"type":"integer"}}}},"additionalProperties":{}}}"#,
            !closed
        );
        let (rec, _) = compile_recognizer("json-schema", &schema, order).unwrap();
        // Closed, no key starts with `inst`; open, `"inst...` may be another key, but not
        // `"instance"` itself.
        let dead = if closed { r#"{"inst"# } else { r#"{"instance""# };
        assert!(!prefix_alive(&rec, dead), "{schema} {order}: the key of a value that cannot exist");
        assert!(prefix_alive(&rec, r#"{"volume":1"#) && rec.matches(br#"{"volume":1}"#), "{schema} {order}");
        assert!(rec.matches(b"{}"), "{schema} {order}");
    }
    let items = format!(r#"{{"type":"array","prefixItems":[{{"type":"integer"}}],"items":{instance}}}"#);
    let (rec, _) = compile_recognizer("json-schema", &items, "{}").unwrap();
    assert!(rec.matches(b"[1]") && rec.matches(b"[]"));
    assert!(!prefix_alive(&rec, "[1,"), "no item can follow the first");
    let branches = format!(r#"{{"anyOf":[{instance},{{"type":"boolean"}}]}}"#);
    let (rec, _) = compile_recognizer("json-schema", &branches, "{}").unwrap();
    assert!(rec.matches(b"true") && !prefix_alive(&rec, "{"), "only the boolean branch is left");
}

/// `multipleOf: 1` on a number: a fraction may be written only as zeros (`5.0`), and no
/// negative exponent, so that a walk cannot write a fraction no completion can cancel.
#[test]
fn whole_multiples_take_only_zero_fractions() {
    let schema = r#"{"type": "number", "multipleOf": 1, "maximum": 100000}"#;
    let (rec, _) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(rec.matches(b"5023"));
    assert!(rec.matches(b"5023.0"));
    assert!(!rec.matches(b"5023.4"));
    assert!(!rec.matches(b"50e-1"), "negative exponents are not offered");
    use dspark_guest::Recognizer;
    let mut s = rec.start();
    for &b in b"5023." {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'4').is_none() && rec.advance(&s, b'0').is_some());
}

#[test]
fn integer_bounds_beyond_two_to_the_53_are_exact() {
    let schema = r#"{"type":"integer","minimum":-9223372036854775808,"maximum":9223372036854775807}"#;
    let (rec, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    for ok in ["9223372036854775807", "-9223372036854775808", "0", "-1", "922337203685477580"] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    for bad in ["9223372036854775808", "9223372036854776001", "-9223372036854775809", "92233720368547758070", "-0"] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    // A prefix is refused as soon as no integer in the bounds starts with it.
    let mut s = rec.start();
    for &b in b"922337203685477581" {
        s = rec.advance(&s, b).unwrap_or_else(|| panic!("at {}", b as char));
    }
    assert!(rec.advance(&s, b'0').is_none());
    // Exclusive bounds (the draft 6 and draft 4 forms), one side open.
    let (rec, warnings) =
        compile_recognizer("json-schema", r#"{"type":"integer","exclusiveMaximum":18446744073709551615}"#, "{}")
            .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(rec.matches(b"18446744073709551614"));
    assert!(rec.matches(b"-123456789012345678901234567890"));
    assert!(!rec.matches(b"18446744073709551615"));
    assert!(!rec.matches(b"100000000000000000000"));
    let draft4 = r#"{"$schema":"http://json-schema.org/draft-04/schema#","type":"integer",
        "minimum":9007199254740993,"exclusiveMinimum":true}"#;
    let (rec, warnings) = compile_recognizer("json-schema", draft4, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(!rec.matches(b"9007199254740993"));
    assert!(rec.matches(b"9007199254740994"));
    assert!(rec.matches(b"123456789012345678901234567890"));
}

#[test]
fn other_bounds_beyond_two_to_the_53_come_with_a_warning() {
    // Numbers with fractions are compared in floating point.
    let schema = r#"{"type":"number","minimum":0,"maximum":9223372036854776000}"#;
    let (rec, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].location, "#/maximum");
    assert!(warnings[0].message.starts_with("a bound beyond 2^53 is compared in floating point"));
    assert!(rec.matches(b"9223372036854775000"));
    // A bound that is itself a float beyond 2^53 is not exact to begin with.
    let (_, warnings) = compile_recognizer("json-schema", r#"{"type":"integer","maximum":1e300}"#, "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (_, warnings) =
        compile_recognizer("json-schema", r#"{"type":"integer","maximum":9007199254740992}"#, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn unique_items_from_an_enum_are_enforced() {
    let compile = |s: &str| compile_recognizer("json-schema", s, "{}").unwrap();
    let (rec, warnings) = compile(r#"{"type":"array","items":{"enum":["a","b","c"]},"uniqueItems":true}"#);
    assert!(warnings.is_empty(), "{warnings:?}");
    for ok in [r#"[]"#, r#"["a","b"]"#, r#"["c","a","b"]"#] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    for bad in [r#"["a","a"]"#, r#"["a","b","a"]"#, r#"["c","b","a","a"]"#] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    // Once every value is written no comma is offered: no dead end.
    let mut s = rec.start();
    for &b in br#"["a","b","c""# {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b',').is_none());
    assert!(rec.advance(&s, b']').is_some());
    // Mid-item, only towards values not written yet.
    let mut s = rec.start();
    for &b in br#"["a","#.iter() {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'"').is_some());
    let quote = rec.advance(&s, b'"').unwrap();
    assert!(rec.advance(&quote, b'a').is_none(), "`a` is written already");
    assert!(rec.advance(&quote, b'b').is_some());

    // Values that are prefixes of each other.
    let (rec, _) = compile(r#"{"type":"array","items":{"enum":["ab","abc"]},"uniqueItems":true}"#);
    assert!(rec.matches(br#"["abc","ab"]"#));
    assert!(rec.matches(br#"["ab","abc"]"#));
    assert!(!rec.matches(br#"["ab","ab"]"#));
    // Booleans, through a `$ref`.
    let (rec, warnings) = compile(
        r##"{"type":"array","items":{"$ref":"#/$defs/b"},"uniqueItems":true,"$defs":{"b":{"enum":[true,false]}}}"##,
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(rec.matches(b"[true,false]"));
    assert!(!rec.matches(b"[false,false]"));
    // More items required than there are values: nothing is valid.
    assert!(
        compile_recognizer(
            "json-schema",
            r#"{"type":"array","items":{"enum":["a"]},"uniqueItems":true,"minItems":2}"#,
            "{}"
        )
        .is_err()
    );
    // Items that can repeat only in ways visible at their end: a warning, not enforced.
    let (rec, warnings) =
        compile(r#"{"type":"array","items":{"type":"string","maxLength":3,"pattern":"^x"},"uniqueItems":true}"#);
    assert_eq!(warnings.len(), 1);
    assert_eq!(warnings[0].location, "#/uniqueItems");
    assert!(rec.matches(br#"["x","x"]"#));
}

#[test]
fn unique_items_over_open_integers_are_enforced() {
    let compile = |s: &str| compile_recognizer("json-schema", s, "{}").unwrap();
    let (rec, warnings) = compile(r#"{"type":"array","items":{"type":"integer"},"uniqueItems":true}"#);
    assert!(warnings.is_empty(), "{warnings:?}");
    for ok in ["[]", "[0]", "[500,5000,50,-500,-5]", "[1,-1,10,-10,0]", "[9007199254740993,1]"] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    for bad in ["[500,500]", "[1,2,1]", "[-3,4,-3]", "[0,1,0]", "[7,8,9,10,7]"] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    // A repeat is refused where it ends: it can always go on instead.
    let mut s = rec.start();
    for &b in b"[12,-4,12" {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b',').is_none() && rec.advance(&s, b']').is_none());
    assert!(rec.advance(&s, b'3').is_some_and(|s| rec.advance(&s, b']').is_some()));
    // A zero cannot go on: once written, another is refused at its digit.
    let mut s = rec.start();
    for &b in b"[0," {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'0').is_none());
    assert!(rec.advance(&s, b'-').is_some() && rec.advance(&s, b'1').is_some());
    // `minimum` 0 or above (the xs-app status codes of JSONSchemaBench: `minimum: 1`), and a
    // `$ref`, still exact; nested arrays keep their own items.
    let (rec, warnings) = compile(
        r##"{"type":"array","items":{"$ref":"#/$defs/code"},"uniqueItems":true,"$defs":{"code":{"type":"integer","minimum":1}}}"##,
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(rec.matches(b"[500,501]"));
    assert!(!rec.matches(b"[500,500]"));
    let (rec, _) =
        compile(r#"{"type":"array","items":{"type":"array","items":{"type":"integer"},"uniqueItems":true}}"#);
    assert!(rec.matches(b"[[1,2],[1,2]]"));
    assert!(!rec.matches(b"[[1,2],[2,2]]"));
    // A `multipleOf` stays a warning, and so do more items required than the bounds hold.
    for schema in [
        r#"{"type":"array","items":{"type":"integer","multipleOf":3},"uniqueItems":true}"#,
        r#"{"type":"array","items":{"type":"integer","minimum":3,"maximum":4},"minItems":3,"uniqueItems":true}"#,
    ] {
        let (_, warnings) = compile(schema);
        assert_eq!(warnings.len(), 1, "{schema}: {warnings:?}");
    }
}

/// Bounded integers: a digit past which only written values are left is refused, and a `,`
/// once every value within the bounds is written, so a writer is never left stuck.
#[test]
fn unique_items_over_bounded_integers_are_enforced() {
    let schema = r#"{"type":"array","items":{"type":"integer","minimum":-12,"maximum":13},"uniqueItems":true}"#;
    let (rec, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    for ok in ["[]", "[1,10,13,-1,-12,0]", "[-5,5]", "[13,1]"] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    for bad in ["[1,1]", "[13,13]", "[-12,3,-12]", "[0,0]", "[14]", "[-13]"] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    let after = |text: &[u8]| {
        let mut s = rec.start();
        for &b in text {
            s = rec.advance(&s, b).unwrap_or_else(|| panic!("{:?} is a prefix", String::from_utf8_lossy(text)));
        }
        s
    };
    // `1` can still become 11 or 12 after 1, 10 and 13: refused once those are written too.
    let s = after(b"[1,10,13,");
    assert!(rec.advance(&s, b'1').is_some());
    let s = after(b"[1,10,13,11,12,");
    assert!(rec.advance(&s, b'1').is_none() && rec.advance(&s, b'2').is_some());
    // Negative prefixes likewise: `-1` covers -1, -10, -11, -12.
    let s = after(b"[-1,-10,-11,-12,");
    assert!(rec.advance(&s, b'-').is_some_and(|m| rec.advance(&m, b'1').is_none() && rec.advance(&m, b'9').is_some()));
    // Every value of a small range written: no `,`, only the end.
    let (rec, warnings) = compile_recognizer(
        "json-schema",
        r#"{"type":"array","items":{"type":"integer","minimum":1,"exclusiveMaximum":4},"uniqueItems":true}"#,
        "{}",
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut s = rec.start();
    for &b in b"[3,1,2" {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b',').is_none() && rec.advance(&s, b']').is_some());
    let mut s = rec.start();
    for &b in b"[3,1," {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'1').is_none() && rec.advance(&s, b'3').is_none() && rec.advance(&s, b'2').is_some());
}

#[test]
fn unique_items_over_open_objects_are_enforced() {
    let compile = |s: &str, o: &str| compile_recognizer("json-schema", s, o).unwrap();
    let schema = r#"{"type":"array","uniqueItems":true,"items":{"type":"object","properties":{"name":{"type":"string"},"value":{"type":"number"}},"required":["name"]}}"#;
    for options in ["{}", r#"{"property_order":"any"}"#, r#"{"whitespace":"flexible"}"#] {
        let (rec, warnings) = compile(schema, options);
        assert!(warnings.is_empty(), "{warnings:?}");
        for ok in [
            "[]",
            r#"[{"name":"a"},{"name":"b"}]"#,
            r#"[{"name":"a"},{"name":"a","value":1}]"#,
            r#"[{"name":"a","value":1},{"name":"a","value":2},{"name":"a"}]"#,
            r#"[{"name":"a","x":[1,2]},{"name":"a","x":[2,1]}]"#,
            r#"[{"name":"a"},{"name":"a","extra":null}]"#,
        ] {
            assert!(rec.matches(ok.as_bytes()), "{options}: {ok}");
        }
        for bad in [
            r#"[{"name":"a"},{"name":"a"}]"#,
            r#"[{"name":"a","value":1},{"name":"b"},{"name":"a","value":1}]"#,
            // Equal as JSON values: numbers by value, strings by their text.
            r#"[{"name":"a","value":1},{"name":"a","value":1.0}]"#,
            r#"[{"name":"A"},{"name":"A"}]"#,
            r#"[{"name":"a","x":{"p":1,"q":2}},{"name":"a","x":{"p":1,"q":2}}]"#,
        ] {
            assert!(!rec.matches(bad.as_bytes()), "{options}: {bad}");
        }
    }
    // Members in another order are the same object (any order only: schema order writes
    // declared names in one order, additional ones in any).
    let (rec, _) = compile(schema, r#"{"property_order":"any"}"#);
    assert!(!rec.matches(br#"[{"name":"a","value":1},{"value":1,"name":"a"}]"#));
    let (rec, _) = compile(schema, "{}");
    assert!(!rec.matches(br#"[{"name":"a","p":1,"q":2},{"name":"a","q":2,"p":1}]"#));
    // A repeat is refused at its `}`, where another member can always be written instead.
    let mut s = rec.start();
    for &b in br#"[{"name":"a"},{"name":"a""# {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'}').is_none());
    let on = rec.advance(&s, b',').expect("another member");
    assert!(rec.matches(br#"[{"name":"a"},{"name":"a","z":0}]"#) && on != s);
    // Through a union of objects (`oneOf` of references, as JSONSchemaBench's
    // solidaritySchema), and nested arrays keep their own items.
    let (rec, warnings) = compile(
        r##"{"type":"array","uniqueItems":true,"items":{"oneOf":[{"$ref":"#/$defs/a"},{"$ref":"#/$defs/b"}]},
            "$defs":{"a":{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},
                     "b":{"type":"object","properties":{"b":{"type":"array","uniqueItems":true,"items":{"type":"object"}}},"required":["b"]}}}"##,
        "{}",
    );
    assert!(warnings.iter().all(|w| !w.location.ends_with("/uniqueItems")), "{warnings:?}");
    assert!(rec.matches(br#"[{"a":1},{"b":[{},{"x":1}]},{"b":[{"x":1},{}]}]"#));
    assert!(!rec.matches(br#"[{"a":1},{"a":1}]"#));
    assert!(!rec.matches(br#"[{"b":[{}]},{"b":[{}]}]"#));
    assert!(!rec.matches(br#"[{"b":[{},{}]}]"#));
    // Objects that may run out of members to add stay a warning, and repeats are admitted.
    for schema in [
        r#"{"type":"array","uniqueItems":true,"items":{"type":"object","properties":{"a":{}},"additionalProperties":false}}"#,
        r#"{"type":"array","uniqueItems":true,"items":{"type":"object","maxProperties":2}}"#,
        r#"{"type":"array","uniqueItems":true,"items":{"anyOf":[{"type":"object"},{"type":"number"}]}}"#,
    ] {
        let (rec, warnings) = compile(schema, "{}");
        assert_eq!(warnings.len(), 1, "{schema}: {warnings:?}");
        assert!(rec.matches(b"[{},{}]"), "{schema}");
    }
}

#[test]
fn unique_items_over_bounded_strings_and_literals_are_enforced() {
    let compile = |s: &str| compile_recognizer("json-schema", s, "{}").unwrap();
    // JSONSchemaBench's winget tags: nullable strings of 1 to 40 characters (here 3).
    let (rec, warnings) = compile(
        r#"{"type":"array","uniqueItems":true,"items":{"type":["string","null"],"minLength":1,"maxLength":3}}"#,
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    for ok in ["[]", r#"["a","ab","abc",null]"#, r#"["abc","abd"]"#, r#"[null,"nul"]"#, r#"["é","e"]"#] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    for bad in [r#"["a","a"]"#, "[null,null]", r#"["abc","abc"]"#, r#"["ab","ab"]"#, r#"["abcd"]"#, r#"[""]"#] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    let after = |prefix: &[u8]| prefix.iter().fold(rec.start(), |s, &b| rec.advance(&s, b).unwrap());
    // A repeat that fills `maxLength` is refused at its last character, another is free.
    let s = after(br#"["abc","ab"#);
    assert!(rec.advance(&s, b'c').is_none());
    assert!(rec.advance(&s, b'd').is_some_and(|s| rec.advance(&s, b'"').is_some()));
    // A shorter repeat at its closing quote, where it can go on instead.
    let s = after(br#"["ab","ab"#);
    assert!(rec.advance(&s, b'"').is_none() && rec.advance(&s, b'x').is_some());
    // `null` once written is refused at its first byte.
    let s = after(b"[null,");
    assert!(rec.advance(&s, b'n').is_none() && rec.advance(&s, b'"').is_some());
    // Literals of other kinds beside strings; an `enum` string is the same item as a free one.
    let (rec, warnings) = compile(
        r#"{"type":"array","uniqueItems":true,"items":{"anyOf":[{"type":"string"},{"enum":["x",null]},{"type":"boolean"}]}}"#,
    );
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(rec.matches(br#"["x","y",null,true,false]"#));
    for bad in [r#"["x","x"]"#, "[null,null]", "[true,false,true]", r#"["y","x","y"]"#] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    // A pattern beside `maxLength` stays a warning.
    let (rec, warnings) =
        compile(r#"{"type":"array","uniqueItems":true,"items":{"type":"string","pattern":"^a+$","maxLength":3}}"#);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(rec.matches(br#"["a","a"]"#));
}

#[test]
fn unique_items_over_open_strings_are_enforced() {
    let (rec, warnings) =
        compile_recognizer("json-schema", r#"{"type":"array","items":{"type":"string"},"uniqueItems":true}"#, "{}")
            .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    for ok in [r#"[]"#, r#"["","x"]"#, r#"["a","ab","b","ba"]"#, r#"["John Doe","John"]"#, r#"["\n","n"]"#] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    for bad in [
        r#"["",""]"#,
        r#"["a","b","a"]"#,
        r#"["John Doe","John Doe"]"#,
        // The same text escaped differently is the same string.
        r#"["A","\u0041"]"#,
        r#"["é","\u00e9"]"#,
        r#"["\/","/"]"#,
        "[\"\u{1F600}\",\"\\ud83d\\ude00\"]",
    ] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    // Astral characters escaped as surrogate pairs keep their identity.
    assert!(rec.matches("[\"\\ud83d\\ude00\",\"\\ud83d\\ude01\"]".as_bytes()));
    // A repeat is refused at its closing quote only: the text can always go on.
    let mut s = rec.start();
    for &b in br#"["ab","ab"# {
        s = rec.advance(&s, b).unwrap();
    }
    assert!(rec.advance(&s, b'"').is_none());
    assert!(rec.advance(&s, b'c').is_some_and(|s| rec.advance(&s, b'"').is_some()));
    // The minimum length still applies, and items in nested arrays are their own.
    let (rec, warnings) = compile_recognizer(
        "json-schema",
        r#"{"type":"array","items":{"type":"array","items":{"type":"string","minLength":1},"uniqueItems":true}}"#,
        "{}",
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(rec.matches(br#"[["a","b"],["a","b"]]"#));
    assert!(!rec.matches(br#"[["a","b","a"]]"#));
    assert!(!rec.matches(br#"[["a",""]]"#));
    // A pattern every prefix of which can go on forever: enforced; one that can run out
    // (a fixed length): a warning.
    let (rec, warnings) = compile_recognizer(
        "json-schema",
        r#"{"type":"array","items":{"type":"string","pattern":"^[a-z][a-z0-9-]*$"},"uniqueItems":true}"#,
        "{}",
    )
    .unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(rec.matches(br#"["ab","ab-1","b"]"#));
    assert!(!rec.matches(br#"["ab","b","ab"]"#));
    assert!(!rec.matches(br#"["ab","1"]"#));
    let (rec, warnings) = compile_recognizer(
        "json-schema",
        r##"{"type":"array","items":{"type":"string","pattern":"^#[0-9a-f]{6}$"},"uniqueItems":true}"##,
        "{}",
    )
    .unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(rec.matches(br##"["#ff0000","#ff0000"]"##));
}

#[test]
fn a_zero_mantissa_with_an_exponent_is_zero() {
    let (rec, _) = compile_recognizer("json-schema", r#"{"type":"number","minimum":0.0167}"#, "{}").unwrap();
    for bad in ["0E600704229972575", "0e5", "0.0e1", "0.00E-3"] {
        assert!(!rec.matches(bad.as_bytes()), "{bad}");
    }
    for ok in ["1e-1", "0.5", "2E0", "0.02e0"] {
        assert!(rec.matches(ok.as_bytes()), "{ok}");
    }
    // No trap: the exponent is not offered after a zero that cannot reach the minimum.
    let zero = rec.advance(&rec.start(), b'0').unwrap();
    assert!(rec.advance(&zero, b'e').is_none());
    let (rec, _) = compile_recognizer("json-schema", r#"{"type":"number","minimum":0}"#, "{}").unwrap();
    assert!(rec.matches(b"0e5"));
}

#[test]
fn a_slash_under_a_pattern_is_written_plain_and_forced() {
    let (rec, _) = compile_recognizer("json-schema", r#"{"type":"string","pattern":"^a/b$"}"#, "{}").unwrap();
    assert!(rec.matches(br#""a/b""#));
    assert!(!rec.matches(br#""a\/b""#));
    let mut s = rec.start();
    for &b in br#""a"# {
        s = rec.advance(&s, b).unwrap();
    }
    let next: Vec<u8> = (0..=255u8).filter(|&b| rec.advance(&s, b).is_some()).collect();
    assert_eq!(next, b"/");
    // Without a pattern every JSON escape stays: `\/` is `/`.
    let (rec, _) = compile_recognizer("json-schema", r#"{"type":"string"}"#, "{}").unwrap();
    assert!(rec.matches(br#""a\/b""#));
}

/// Strict mode refuses the approximations that could let an invalid document through, at
/// their pointer, and keeps those that only leave valid documents out.
#[test]
fn strict_mode_refuses_approximations_that_admit_more() {
    let strict = r#"{"strict":true}"#;
    let refused = [
        (
            r#"{"type":"array","items":{"type":"array"},"uniqueItems":true}"#,
            "#/uniqueItems",
            "`uniqueItems` is not enforced",
        ),
        (
            r#"{"oneOf":[{"type":"string","pattern":"a"},{"type":"string","pattern":"b"}]}"#,
            "#/oneOf",
            "`oneOf` is enforced as `anyOf`",
        ),
        (r#"{"properties":{"a":{"type":"string","format":"shoe-size"}}}"#, "#/properties/a/format", "unknown format"),
        (r#"{"type":"string","format":"iri"}"#, "#/format", "format `iri` is approximated"),
        (r#"{"type":"number","multipleOf":0.1}"#, "#/multipleOf", "floating-point tolerance"),
        (r#"{"type":"number","maximum":1e300}"#, "#/maximum", "beyond 2^53"),
    ];
    for (schema, at, what) in refused {
        let (_, warnings) = compile_recognizer("json-schema", schema, "{}").unwrap();
        assert!(warnings.iter().any(|w| w.location == at && w.message.contains(what)), "{schema}: {warnings:?}");
        let e = compile_recognizer("json-schema", schema, strict).err().unwrap_or_else(|| panic!("{schema}"));
        assert_eq!(e.code, dspark_guest::ErrorCode::Unsupported, "{schema}");
        assert_eq!(e.location.as_deref(), Some(at), "{schema}");
        assert!(e.message.starts_with("strict mode: ") && e.message.contains(what), "{e}");
        assert!(e.message.ends_with("; without strict mode this is served as a warning"), "{e}");
    }
    // Warnings that never let an invalid document through are not refused.
    let kept = [
        r#"{"type":"string","format":"email"}"#,
        r#"{"type":"string","format":"hostname"}"#,
        r#"{"type":"string","maxLenght":3}"#,
    ];
    for schema in kept {
        let (_, warnings) =
            compile_recognizer("json-schema", schema, strict).unwrap_or_else(|e| panic!("{schema}: {e}"));
        assert!(!warnings.is_empty(), "{schema} is approximated");
    }
    let e = compile_recognizer("json-schema", "{}", r#"{"strict":"yes"}"#).err().unwrap();
    assert!(e.message.contains("`strict` must be true or false"), "{e}");
}

/// An email's local part is a dot-atom: runs of characters joined by single dots.
#[test]
fn email_local_parts_are_dot_atoms() {
    check(
        r#"{"type":"string","format":"email"}"#,
        "{}",
        &[r#""a.b+c@example.com""#, r#""x@y""#, r#""o'hara@ie.example""#],
        &[r#"".a@example.com""#, r#""a.@example.com""#, r#""a..b@example.com""#, r#""@example.com""#],
    );
}

/// Found by fuzzing: a `pattern` and a `format` that no string satisfies together were each
/// live alone, so after the opening quote no character was allowed. Two automata on one
/// string are now walked as a pair: the schema that admits nothing is refused, and where
/// they agree only on some texts, no prefix outside those is entered.
#[test]
fn a_pattern_and_a_format_are_walked_together() {
    let never = r#"{"type": "string", "pattern": "^[a-z]{2,5}-\\d+$", "format": "date-time"}"#;
    let e = compile_recognizer("json-schema", never, "{}").err().expect("no string satisfies both");
    assert!(e.message.starts_with("the schema admits no value"), "{}", e.message);

    let some = r#"{"type": "string", "pattern": "^(2024|abcd)", "format": "date"}"#;
    let (rec, _) = compile_recognizer("json-schema", some, "{}").unwrap();
    assert!(rec.matches(br#""2024-02-29""#));
    assert!(!rec.matches(br#""abcd-01-01""#) && !rec.matches(br#""2023-01-01""#));
    dspark_guest::testing::assert_no_dead_ends(&rec, 14);
    // Entering `"a` would be a dead end: the date format has no letters.
    let mut state = rec.start();
    state = rec.advance(&state, b'"').unwrap();
    assert!(rec.advance(&state, b'a').is_none() && rec.advance(&state, b'2').is_some());
}

/// Found by fuzzing: a pattern whose shortest match is longer than `maxLength` admits no
/// string; it was compiled, and the walk stopped dead after the opening quote.
#[test]
fn a_pattern_longer_than_max_length_admits_nothing() {
    let never = r#"{"type": "string", "maxLength": 5, "pattern": "^a(bc){3}$"}"#;
    let e = compile_recognizer("json-schema", never, "{}").err().expect("no string fits");
    assert!(e.message.starts_with("the schema admits no value"), "{}", e.message);
    let fits = r#"{"type": "string", "maxLength": 7, "pattern": "^a(bc){3}$"}"#;
    let (rec, _) = compile_recognizer("json-schema", fits, "{}").unwrap();
    assert!(rec.matches(br#""abcbcbc""#));
    dspark_guest::testing::assert_no_dead_ends(&rec, 12);
}

/// Found by fuzzing: a pattern that needs a control character the writer only spells as a
/// `\u` escape (which it does not write under a pattern) admits no string it can write.
#[test]
fn a_pattern_that_needs_an_unwritable_character_admits_nothing() {
    let never = r#"{"type": "string", "pattern": "^[a-z]{2,5}-\\an"}"#;
    let e = compile_recognizer("json-schema", never, "{}").err().expect("nothing writable matches");
    assert!(e.message.starts_with("the schema admits no value"), "{}", e.message);
    let either = r#"{"type": "string", "pattern": "^(a\\x01|b)$"}"#;
    let (rec, _) = compile_recognizer("json-schema", either, "{}").unwrap();
    dspark_guest::testing::assert_no_dead_ends(&rec, 6);
    assert!(rec.matches(br#""b""#));
}
