//! Hashes of JSON values by equality as JSON Schema defines it (`uniqueItems`, `enum`):
//! objects equal whatever the order of their members, numbers equal by value (`1`, `1.0` and
//! `1e0` are one number), strings by their decoded text, whitespace ignored.
//!
//! The recogniser compares the items of an array under an exact `uniqueItems` over objects
//! by this hash of each item's bytes (see [`crate::graph::ArrayNode::unique_values`]). Two
//! different values that collide (about 2^-64 per pair) would make the second unwritable,
//! never a repeat writable.

use dspark_guest::key::mix;
use serde_json::Value;

/// The hash of the JSON value `bytes` encode, by JSON Schema equality; bytes that are not
/// one JSON value (never the case for what the recogniser accepts) hash by their own value.
pub fn canonical_hash(bytes: &[u8]) -> u64 {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(v) => value_hash(&v),
        Err(_) => fnv(0x9e37_79b9_7f4a_7c15, bytes),
    }
}

/// The hash of `v` by JSON Schema equality.
pub fn value_hash(v: &Value) -> u64 {
    // A tag per kind keeps `"1"`, `1` and `[1]` apart.
    match v {
        Value::Null => mix(1, 0),
        Value::Bool(b) => mix(2, *b as u64),
        Value::Number(n) => {
            // By value: integers beyond 2^53 that f64 cannot tell apart share a hash (which
            // refuses the later one, never admits a repeat).
            let f = n.as_f64().unwrap_or(0.0);
            let f = if f == 0.0 { 0.0 } else { f }; // -0 equals 0
            mix(3, f.to_bits())
        }
        Value::String(s) => mix(4, fnv(TEXT_BASIS, s.as_bytes())),
        Value::Array(items) => items.iter().fold(mix(5, items.len() as u64), |h, item| mix(h, value_hash(item))),
        Value::Object(members) => {
            // Members in a canonical order: sorted by their own hashes.
            let mut hashes: Vec<u64> =
                members.iter().map(|(k, v)| mix(fnv(TEXT_BASIS, k.as_bytes()), value_hash(v))).collect();
            hashes.sort_unstable();
            hashes.iter().fold(mix(6, hashes.len() as u64), |h, &m| mix(h, m))
        }
    }
}

/// The FNV-1a basis of a tracked string's text hash.
const TEXT_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// The key of a string item with decoded text `text` in its array's list of items written:
/// the recogniser's hash of a tracked string (FNV-1a of the UTF-8 text, kept off zero).
pub fn text_key(text: &[u8]) -> u64 {
    fnv(TEXT_BASIS, text).max(1)
}

/// The key of literal `bytes` (a compact JSON value) as an item under an exact
/// `uniqueItems` over strings and literals: a string's [`text_key`], another value's
/// [`canonical_hash`].
pub fn literal_key(bytes: &[u8]) -> u64 {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::String(s)) => text_key(s.as_bytes()),
        _ => canonical_hash(bytes),
    }
}

/// FNV-1a over `bytes` from `basis`.
fn fnv(basis: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(basis, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::canonical_hash;

    #[test]
    fn equal_values_hash_alike_and_different_ones_do_not() {
        let same = [
            (&br#"{"a":1,"b":[true,null]}"#[..], &br#"{ "b" : [true, null], "a" : 1.0 }"#[..]),
            (br#""A""#, br#""\u0041""#),
            (br#"{"x":{"p":"q","r":-0}}"#, br#"{"x":{"r":0,"p":"q"}}"#),
            (b"10", b"1e1"),
        ];
        let pair = |a: &[u8], b: &[u8]| format!("{} vs {}", String::from_utf8_lossy(a), String::from_utf8_lossy(b));
        for (a, b) in same {
            assert_eq!(canonical_hash(a), canonical_hash(b), "{}", pair(a, b));
        }
        let different = [
            (&br#"{"a":1}"#[..], &br#"{"a":"1"}"#[..]),
            (br#"{"a":1,"b":2}"#, br#"{"a":2,"b":1}"#),
            (br#"[1,2]"#, br#"[2,1]"#),
            (br#"{"a":{}}"#, br#"{"a":[]}"#),
            (br#"{"ab":"c"}"#, br#"{"a":"bc"}"#),
            (b"null", b"false"),
        ];
        for (a, b) in different {
            assert_ne!(canonical_hash(a), canonical_hash(b), "{}", pair(a, b));
        }
    }
}
