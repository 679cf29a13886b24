//! The formats the json-schema plugin calls exact accept exactly the strings the `jsonschema`
//! crate's format checks accept, and `hostname` (approximated strictly) a subset of them:
//! hand-picked edge cases, and mutations of valid examples.

use dspark_plugin_json_schema::compile_recognizer;
use serde_json::{Value, json};

/// Formats whose pattern the plugin says is exact, with valid examples to mutate and the
/// characters mutations insert.
const EXACT: &[(&str, &[&str], &str)] = &[
    ("ipv6", &["1:2:3:4:5:6:7:8", "fe80::1", "::ffff:10.0.0.1", "2001:db8::8a2e:370:7334"], "0123456789abcdefABCDEF:."),
    (
        "uri",
        &["http://user@example.com:8080/a/b?c=d#e", "urn:isbn:0451450523", "http://[::1]/", "a:%2F"],
        "aZ09:/?#[]@%2fF.-_~!$&'()*+,;=v x",
    ),
    ("uri-reference", &["../a/b?c#d", "//host:80/p", "http://h/p", "?q", "a/b:c"], "aZ09:/?#[]@%2fF.-_~!$&'()*+,;=v x"),
    ("ipv4", &["192.168.0.1", "0.0.0.0", "255.255.255.255"], "0123456789.25"),
    ("date", &["2024-02-29", "2023-12-31", "1900-02-28"], "0123456789-"),
    ("uuid", &["123e4567-e89b-12d3-a456-426614174000"], "0123456789abcdefABCDEF-g"),
    ("date-time", &["2024-02-29T23:59:59Z", "2023-01-01t00:00:00.5+05:30"], "0123456789-:TtZz.+"),
    ("time", &["23:59:59Z", "00:00:00.123-01:00"], "0123456789:Zz.+-"),
    ("duration", &["P1Y2M3DT4H5M6S", "P3W", "PT1M"], "PYMWDTHS0123"),
];

/// The plugin's recogniser and the `jsonschema` crate's validator for strings of `format`.
struct Both {
    format: &'static str,
    rec: dspark_plugin_json_schema::recognizer::SchemaRecognizer,
    validator: jsonschema::Validator,
}

impl Both {
    fn new(format: &'static str) -> Self {
        let schema = json!({ "type": "string", "format": format });
        let (rec, warnings) = compile_recognizer("json-schema", &schema.to_string(), "{}").unwrap();
        assert!(warnings.is_empty(), "{format}: {warnings:?}");
        let validator = jsonschema::options().should_validate_formats(true).build(&schema).unwrap();
        Both { format, rec, validator }
    }

    /// Asserts that both agree on `text`; whether it is valid.
    fn check(&self, text: &str) -> bool {
        let instance = Value::String(text.to_string());
        let ours = self.rec.matches(instance.to_string().as_bytes());
        let theirs = self.validator.is_valid(&instance);
        assert_eq!(ours, theirs, "format {}: {text:?} (accepted here: {ours})", self.format);
        ours
    }
}

#[test]
fn exact_formats_agree_with_the_jsonschema_crate_on_edge_cases() {
    let cases: &[(&'static str, &[&str])] = &[
        (
            "ipv6",
            &[
                "::",
                "::1",
                "1::",
                "1:2:3:4:5:6:7:8",
                "1:2:3:4:5:6:7::",
                "::2:3:4:5:6:7:8",
                "1:2:3:4:5:6:7:8:9",
                "1:2:3:4:5:6:7",
                "::ffff:1.2.3.4",
                "::ffff:1.2.3.04",
                "::ffff:256.2.3.4",
                "1::2::3",
                ":1::",
                "12345::",
                "fe80::1%eth0",
                "1:2:3:4:5:6:1.2.3.4",
                "1:2:3:4:5:6:7:1.2.3.4",
                "a:b:c:d:e:f:0:0",
                "",
                ":",
                ":::",
            ],
        ),
        (
            "uri",
            &[
                "http://example.com",
                "http://example.com/a/b?c=d#e",
                "urn:isbn:0451450523",
                "mailto:a@b.c",
                "a:",
                "a:b:c",
                "http://[::1]:8080/",
                "http://[v1.x]/",
                "http://[::1",
                "http://a b",
                "//example.com",
                "/a/b",
                "1a:b",
                "http://user:pw@host:80/p",
                "http://a@b@c",
                "http://host:8a/",
                "a:%2F",
                "a:%2",
                "a:%zz",
                "http://ex.com/?q=a?b#f?g",
                "a:#frag#",
                "ftp://[1:2:3:4:5:6:7:8]/",
                "a://",
                "a:///",
            ],
        ),
        (
            "uri-reference",
            &[
                "",
                "://",
                "a",
                "a/b:c",
                "a:b",
                "ab_c:d",
                "/a:b",
                "//host",
                "//host:80/p?q#f",
                "?x",
                "#f",
                "%41",
                "%4",
                "../a/./b",
                "//[::1]/",
                "// x",
                "a b",
                "[::1]",
                "//u@h:1",
                "//h:x",
            ],
        ),
    ];
    for (format, texts) in cases {
        let both = Both::new(format);
        for t in *texts {
            both.check(t);
        }
    }
}

/// The plugin's recogniser of strings of an approximated `format` (it warns once) and the
/// `jsonschema` crate's validator.
fn approximated(format: &str) -> (dspark_plugin_json_schema::recognizer::SchemaRecognizer, jsonschema::Validator) {
    let schema = json!({ "type": "string", "format": format });
    let (rec, warnings) = compile_recognizer("json-schema", &schema.to_string(), "{}").unwrap();
    assert_eq!(warnings.len(), 1, "{format} is approximated: {warnings:?}");
    (rec, jsonschema::options().should_validate_formats(true).build(&schema).unwrap())
}

/// A small deterministic generator (xorshift), so failures reproduce.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[test]
fn strict_hostnames_are_valid_hostnames() {
    let (rec, validator) = approximated("hostname");
    let label63 = "a".repeat(63);
    let long = [label63.as_str(); 4].join(".");
    for (text, ours) in [
        ("example.com", true),
        ("a-b.c-d.e", true),
        ("a--b.com", true),
        ("ab--c.com", false), // reserved for IDNA
        ("xn--bcher-kva.example", false),
        (label63.as_str(), true),
        (&long[..253], true),
        (&long[..255], false),
        ("-a.com", false),
        ("a.com.", false),
    ] {
        let instance = Value::String(text.to_string());
        assert_eq!(rec.matches(instance.to_string().as_bytes()), ours, "{text}");
        if ours {
            assert!(validator.is_valid(&instance), "{text}");
        }
    }
    assert!(validator.is_valid(&json!("xn--bcher-kva.example")), "valid, though not written here");
}

#[test]
fn exact_formats_agree_with_the_jsonschema_crate_on_random_strings() {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
    for &(format, seeds, alphabet) in EXACT {
        let both = Both::new(format);
        let chars: Vec<char> = alphabet.chars().collect();
        let mut accepted = 0;
        for i in 0..4000 {
            // One to three edits (insert, delete, replace) of a valid example.
            let mut text: Vec<char> = seeds[i % seeds.len()].chars().collect();
            for _ in 0..=next() % 3 {
                let at = (next() as usize) % (text.len() + 1);
                let c = chars[(next() % chars.len() as u64) as usize];
                match next() % 3 {
                    0 => text.insert(at, c),
                    1 if at < text.len() => {
                        text.remove(at);
                    }
                    _ if at < text.len() => text[at] = c,
                    _ => text.push(c),
                }
            }
            let text: String = text.into_iter().collect();
            accepted += both.check(&text) as usize;
        }
        // Both sides of the line are exercised.
        assert!((100..3900).contains(&accepted), "{format}: {accepted} of 4000 mutations valid");
    }
}

#[test]
fn regex_values_follow_the_ecma_syntax_but_for_deep_groups_and_back_references() {
    let (rec, validator) = approximated("regex");
    let ours = |text: &str| rec.matches(Value::String(text.to_string()).to_string().as_bytes());
    let theirs = |text: &str| validator.is_valid(&Value::String(text.to_string()));
    let nine_deep = format!("{}a{}", "(".repeat(9), ")".repeat(9));
    let eight_deep = format!("{}a{}", "(".repeat(8), ")".repeat(8));
    for text in [
        "",
        "^[a-z]+$",
        r"\d{3}-\d{4}",
        "(a|b)*c",
        "[[]",
        r"[\]]",
        "[(]",
        r"\(",
        "(?:a(?<n>b)(?=c))",
        "^(https?://)?[\\w.-]+(/[^\\s]*)?$",
        "a*?",
        "()",
        "[]",
        "[^]",
        r"\u{41}",
        r"\p{L}",
        "a||b",
        "(?<=a)b",
        "(?!)",
        "x{2,}y{1,3}?",
        &eight_deep,
    ] {
        assert!(theirs(text), "a valid regex: {text:?}");
        assert!(ours(text), "written: {text:?}");
    }
    for text in [
        "[", "(a", "a)", "a\\", "[a-z", "((a)", "a)(", "[\\]", "a]b", "a{", "a}", "{2}", "*a", "a**", "a+*", "\\q",
        "a|*", "(*)", "^*", "?", "(?", "\\b*", "(?x)",
    ] {
        assert!(!theirs(text), "not a regex: {text:?}");
        assert!(!ours(text), "refused: {text:?}");
    }
    assert!(theirs("(a)\\1") && !ours("(a)\\1"), "back references are not written");
    assert!(theirs(&nine_deep) && !ours(&nine_deep), "groups nested deeper than 8 are not written");

    // Never a valid regex refused (within the depth, which short strings keep): random
    // strings over the characters that make the structure.
    let mut next = xorshift(0x2545_F491_4F6C_DD1D);
    let chars: Vec<char> = "()[]\\a|*^?".chars().collect();
    let (mut valid, mut refused_invalid) = (0, 0);
    for _ in 0..4000 {
        let len = (next() % 9) as usize;
        let text: String = (0..len).map(|_| chars[(next() % chars.len() as u64) as usize]).collect();
        if theirs(&text) {
            valid += 1;
            assert!(ours(&text), "a valid regex refused: {text:?}");
        } else if !ours(&text) {
            refused_invalid += 1;
        }
    }
    assert!(valid > 300 && refused_invalid > 1000, "{valid} valid, {refused_invalid} invalid refused");
}
