//! The in-string fast path gives exactly the tokens the generic trie walk gives.

use dspark_guest::{Recognizer, TokenSet, TokenTable};
use dspark_plugin_json_schema::compile_recognizer;

fn table() -> TokenTable {
    let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    for t in [
        "\"",
        "\",",
        "\"}",
        "\":",
        "\"]",
        "abc",
        "ab\"",
        "\\n",
        "\\\"",
        "\\u00e9",
        "\\",
        "é",
        "\u{1F600}",
        " the",
        "ABC",
        "1234",
        "a1",
        "\",\"",
        "\"},{\"",
        "name",
        "name\"",
        "zzzzzzzzzzzzzzzzzzzz",
        "ab\\",
        " \":",
        " \"",
        "b\"}",
        "ab\"}",
        "b\"},",
        "1}",
    ] {
        tokens.push(t.as_bytes().to_vec());
    }
    // Families with shared prefixes, so that the trie has subtrees large enough for the state
    // table's shortcut (a state that loops over every byte below a node) to apply.
    for w in ["abc", "name", "1234", "12", "123", "1.5", "1e5", "-1", "true", "tru", "nul", "null", "é", "日本", "zz"]
    {
        for prefix in ["", " ", "\"", "{\"", "[", ","] {
            for suffix in ["", "\"", ",", "}", "é", "9", "zzz"] {
                tokens.push(format!("{prefix}{w}{suffix}").into_bytes());
            }
        }
    }
    tokens.push(vec![0xC3]); // a UTF-8 lead byte alone
    tokens.push(vec![0xA9, b'x']); // a continuation byte first
    tokens.push(b"<eos>".to_vec());
    let eos = tokens.len() as u32 - 1;
    TokenTable::from_tokens(&tokens, &[], &[eos])
}

fn compare(schema: &str, options: &str, prefix: &str) {
    let table = table();
    let (rec, _) = compile_recognizer("json-schema", schema, options).unwrap();
    let mut state = rec.start();
    for b in prefix.bytes() {
        state =
            rec.advance(&state, b).unwrap_or_else(|| panic!("{schema}: prefix {prefix:?} rejected at {:?}", b as char));
    }
    let n = table.vocab_size();
    let mut fast = TokenSet::new(n);
    assert!(rec.fill_mask(&state, &table, &mut fast), "{schema} {prefix:?}: the fast path should apply");
    let mut slow = TokenSet::new(n);
    table.trie().walk(&state, &mut Vec::new(), |s, b| rec.advance(s, b), |t| slow.insert(t));
    let only_fast: Vec<u32> = fast.iter().filter(|t| !slow.contains(*t)).collect();
    let only_slow: Vec<u32> = slow.iter().filter(|t| !fast.contains(*t)).collect();
    assert!(
        only_fast.is_empty() && only_slow.is_empty(),
        "{schema} {prefix:?}: fast-only {only_fast:?}, walk-only {only_slow:?}"
    );
    assert!(fast.count() > 0);
}

#[test]
fn fast_masks_equal_the_trie_walk() {
    let obj = r#"{"type":"object","properties":{"name":{"type":"string"},"code":{"type":"string","pattern":"^[a-z0-9]+$","maxLength":5},"n":{"type":"integer"}}}"#;
    compare(obj, "{}", r#"{"name":""#);
    compare(obj, "{}", r#"{"name":"ab"#);
    compare(obj, "{}", r#"{"name":"x","code":""#);
    compare(obj, "{}", r#"{"name":"x","code":"abc"#);
    compare(obj, r#"{"property_order":"any"}"#, r#"{""#);
    compare(obj, r#"{"property_order":"any"}"#, r#"{"n":1,"zz"#);
    // A declared name already written: neither its own configuration nor the free key may
    // take `name"` again.
    compare(obj, r#"{"property_order":"any"}"#, r#"{"name":"x",""#);
    compare(obj, r#"{"property_order":"any"}"#, r#"{"name":"x","na"#);
    // A declared name that a closing token's content completes (`start` + ` ":`).
    let spaced = r#"{"type":"object","properties":{"start ":{"type":"boolean"},"a":{}}}"#;
    compare(spaced, r#"{"property_order":"any"}"#, r#"{"start"#);
    compare(spaced, r#"{"property_order":"any"}"#, r#"{"a":1,"start"#);
    // And the converse: the text so far is a declared name, the token's content leaves it.
    let plain = r#"{"type":"object","properties":{"start":{"type":"boolean"}}}"#;
    compare(plain, r#"{"property_order":"any"}"#, r#"{"start"#);
    compare(r#"{"type":"array","items":{"type":"string","minLength":2}}"#, "{}", r#"["a"#);
    compare(r#"{"type":"object","additionalProperties":{"type":"string"}}"#, "{}", r#"{"k":"v",""#);
    let pp = r#"{"type":"object","patternProperties":{"^a[0-9]+$":{"type":"integer"},"^name":{"type":"string"}},"additionalProperties":false}"#;
    compare(pp, "{}", r#"{""#);
    compare(pp, "{}", r#"{"a1"#);
    compare(pp, "{}", r#"{"nam"#);
    // Past `name` the key's pattern can no longer fail: the class of a plain key.
    compare(pp, "{}", r#"{"namex"#);
    compare(
        r#"{"type":"object","properties":{"a":{}},"additionalProperties":true}"#,
        r#"{"property_order":"any"}"#,
        r#"{"x\\"#,
    );
    compare(r#"{"type":"string","pattern":"^[a-c]*x$","maxLength":4}"#, "{}", r#""ab"#);
    compare(r#"{"type":"string","pattern":"b"}"#, "{}", r#""aa"#);
    // A search pattern before and after it has matched (then it rules nothing out), and an
    // anchored prefix once written.
    compare(r#"{"type":"string","pattern":"[a-z0-9]{3}"}"#, "{}", r#""a-b"#);
    compare(r#"{"type":"string","pattern":"[a-z0-9]{3}"}"#, "{}", r#""abc"#);
    compare(r#"{"type":"string","pattern":"^a","maxLength":4}"#, "{}", r#""a"#);
    compare(r#"{"type":"string","pattern":"^ab","minLength":3}"#, "{}", r#""ab"#);
    // Length bounds with room for most tokens but not the longest (20 characters): the
    // unbounded class, with the long tokens stepped through exactly.
    for (max_length, prefix) in [(18, r#""ab"#), (22, r#""a"#), (21, r#""a"#), (23, r#""abc"#)] {
        let schema = format!(r#"{{"type":"string","pattern":"^[a-z0-9]+$","maxLength":{max_length}}}"#);
        compare(&schema, "{}", prefix);
    }
    compare(r#"{"type":"string","pattern":"^[a-z]*x[0-9]{3}$","maxLength":24}"#, "{}", r#""zzz"#);
    compare(r#"{"type":"string","pattern":"^[a-z]*x[0-9]{3}$","maxLength":26}"#, "{}", r#""zz"#);
    // States outside strings take the state table's walk.
    compare(obj, "{}", "");
    compare(obj, "{}", r#"{"name":"x","code":"a","n":"#);
    compare(obj, "{}", r#"{"name":"x","code":"a","n":12"#);
    compare(obj, r#"{"property_order":"any"}"#, r#"{"n":1"#);
    compare(r#"{"type":"array","items":{"type":"number","maximum":100}}"#, "{}", r#"[1,2.5"#);
    compare(r#"{"type":"array","items":{"enum":["abc","abd",null,true,12]}}"#, "{}", r#"["#);
    let unique = r#"{"type":"array","items":{"enum":["abc","abd","name",null,true]},"uniqueItems":true}"#;
    compare(unique, "{}", r#"["#);
    compare(unique, "{}", r#"["abc","#);
    compare(unique, "{}", r#"["abc",null,"ab"#);
    compare(unique, "{}", r#"["abc",null,true,"name""#);
    // Open strings under `uniqueItems`: closing tokens that would repeat an item are refused.
    let texts = r#"{"type":"array","items":{"type":"string"},"uniqueItems":true}"#;
    for prefix in [r#"[""#, r#"["ab"#, r#"["abc","ab"#, r#"["abc","ab","#, r#"["abc","name","a"#, r#"["ab","","#] {
        compare(texts, "{}", prefix);
    }
    compare(texts, r#"{"whitespace":"flexible"}"#, r#"["ab", "a"#);
    let patterned = r#"{"type":"array","items":{"type":"string","pattern":"^[a-z]+$"},"uniqueItems":true}"#;
    for prefix in [r#"[""#, r#"["abc","ab"#, r#"["abc","name","#] {
        compare(patterned, "{}", prefix);
    }
    // Integers under `uniqueItems`: the tokens that would end a repeat are refused.
    let ints = r#"{"type":"array","items":{"type":"integer"},"uniqueItems":true}"#;
    for prefix in ["[", "[12,", "[12,1", "[12,-4,12", "[0,", "[0,1,-1", "[5,50,500,"] {
        compare(ints, "{}", prefix);
    }
    compare(ints, r#"{"whitespace":"flexible"}"#, "[12, 1");
    // Bounded integers: the tokens whose digits lead only to written values are refused too.
    let bounded = r#"{"type":"array","items":{"type":"integer","minimum":-12,"maximum":13},"uniqueItems":true}"#;
    for prefix in ["[", "[1,10,13,11,12,", "[1,10,13,11,12,-1", "[-1,-10,-11,-12,-", "[0,", "[13,1"] {
        compare(bounded, "{}", prefix);
    }
    compare(r#"{}"#, "{}", r#"{"a":[1,{"b":"#);
    // Objects under `uniqueItems`: the tokens whose `}` would end a repeat are refused, those
    // that close a string first (`"}`) included.
    let objects = r#"{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"integer"}}},"uniqueItems":true}"#;
    for prefix in [
        "[",
        r#"[{"name":"ab"}"#,
        r#"[{"name":"ab"},"#,
        r#"[{"name":"ab"},{"name":"a"#,
        r#"[{"name":"ab"},{"name":"ab"#,
        r#"[{"name":"ab","n":1},{"name":"ab","n":"#,
        r#"[{"name":"ab","n":1},{"name":"ab","n":1"#,
        r#"[{},{"#,
    ] {
        compare(objects, "{}", prefix);
        compare(objects, r#"{"property_order":"any"}"#, prefix);
    }
    compare(objects, r#"{"property_order":"any"}"#, r#"[{"n":1,"name":"ab"},{"name":"ab","n":1"#);
    compare(objects, r#"{"property_order":"any"}"#, r#"[{"x":"ab"},{"x":"a"#);
    // Bounded strings beside `null` under `uniqueItems`: tokens that fill `maxLength` with a
    // repeat, and closing tokens that repeat, are refused.
    let tags = r#"{"type":"array","items":{"type":["string","null"],"minLength":1,"maxLength":3},"uniqueItems":true}"#;
    for prefix in
        ["[", r#"[""#, r#"["ab","a"#, r#"["abc",""#, r#"["abc","a"#, r#"["abc","ab"#, "[null,", r#"["a",null,""#]
    {
        compare(tags, "{}", prefix);
    }
    let long = r#"{"type":"array","items":{"type":"string","maxLength":21},"uniqueItems":true}"#;
    compare(long, "{}", r#"["azzzzzzzzzzzzzzzzzzzz",""#);
    compare(long, "{}", r#"["azzzzzzzzzzzzzzzzzzzz","a"#);
}
