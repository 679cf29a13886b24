//! The json-schema plugin against JSONSchemaBench with the real Llama-3 tokenizer, natively:
//!
//! - every valid instance of a schema that compiles is accepted token by token (forced spans
//!   consumed where they match), every invalid one is rejected, counted per run;
//! - random walks (random allowed tokens, forced spans applied, until the constraint is
//!   complete or a length cap) produce documents that the `jsonschema` crate validates.
//!
//! CI runs the committed sample (`tests/data/jsonschemabench-sample`); the full benchmark runs
//! with `DSPARK_BENCH_DIR=$PWD/../shared/data/jsonschemabench cargo test --release -p dspark-tests
//! --test json_schema_walks -- --nocapture`. `DSPARK_WALKS` sets the walks per schema.

use std::path::PathBuf;

use dspark_guest::{Matcher, Plugin, TokenSet, TokenTable};
use dspark_host::tokenizer::CanonicalTokenizer;
use dspark_plugin_json_schema::JsonSchemaPlugin;
use dspark_tests::llama3_guest_table;
use serde_json::Value;

fn bench_files() -> Vec<PathBuf> {
    let dir = std::env::var_os("DSPARK_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| dspark_tests::repo_root().join("tests/data/jsonschemabench-sample"));
    let mut files = Vec::new();
    let mut dirs = vec![dir];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot read {}: {e}", d.display())).flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                files.push(p);
            }
        }
    }
    files.sort();
    files
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Walks `tokens`; whether they are accepted whole.
fn accepts(m: &mut dyn Matcher, tokens: &[u32]) -> bool {
    let mut i = 0;
    if let Ok(start) = m.commit(&[])
        && !start.forced.is_empty()
    {
        if tokens.starts_with(&start.forced) {
            i = start.forced.len();
        } else if m.rollback(start.forced.len() as u32).is_err() {
            return false;
        }
    }
    while i < tokens.len() {
        let Ok(mask) = m.compute_mask() else { return false };
        if !mask.allows(tokens[i]) {
            return false;
        }
        let Ok(out) = m.commit(&tokens[i..i + 1]) else { return false };
        i += 1;
        if !out.forced.is_empty() {
            if tokens.get(i..i + out.forced.len()) == Some(&out.forced[..]) {
                i += out.forced.len();
            } else if m.rollback(out.forced.len() as u32).is_err() {
                return false;
            }
        }
    }
    m.is_accepting()
}

/// The `k`-th token of `set` (ascending).
fn nth(set: &TokenSet, mut k: usize) -> Option<u32> {
    for (i, &w) in set.words().iter().enumerate() {
        let n = w.count_ones() as usize;
        if k < n {
            let mut w = w;
            for _ in 0..k {
                w &= w - 1;
            }
            return Some(i as u32 * 32 + w.trailing_zeros());
        }
        k -= n;
    }
    None
}

/// One random walk; the document if the constraint completed within `cap` tokens.
fn random_walk(
    m: &mut dyn Matcher,
    table: &TokenTable,
    closers: &TokenSet,
    rng: &mut Rng,
    cap: usize,
) -> Result<Option<Vec<u8>>, String> {
    walk_inner(m, table, closers, rng, cap)
        .map_err(|doc| format!("a dead end after {:?}", String::from_utf8_lossy(&doc)))
}

fn walk_inner(
    m: &mut dyn Matcher,
    table: &TokenTable,
    closers: &TokenSet,
    rng: &mut Rng,
    cap: usize,
) -> Result<Option<Vec<u8>>, Vec<u8>> {
    let mut doc = Vec::new();
    let Ok(start) = m.commit(&[]) else { return Err(doc) };
    start.forced.iter().for_each(|&t| doc.extend_from_slice(table.token_bytes(t)));
    for _ in 0..cap {
        let Ok(mask) = m.compute_mask() else { return Err(doc) };
        let allowed = mask.to_set(table.vocab_size());
        let count = allowed.count();
        if count == 0 {
            return Err(doc);
        }
        if let Some(&eos) = table.eos_tokens().iter().find(|t| allowed.contains(**t)) {
            if m.commit(&[eos]).is_err() {
                return Err(doc);
            }
            return Ok(Some(doc));
        }
        // Lean towards tokens that close things, so that walks end.
        let mut closing = allowed.clone();
        for (w, c) in closing.words_mut().iter_mut().zip(closers.words()) {
            *w &= *c;
        }
        let n_closing = closing.count();
        let pick = if n_closing > 0 && rng.below(10) < 6 {
            nth(&closing, rng.below(n_closing))
        } else {
            nth(&allowed, rng.below(count))
        };
        let Some(pick) = pick else { return Err(doc) };
        doc.extend_from_slice(table.token_bytes(pick));
        let Ok(out) = m.commit(&[pick]) else { return Err(doc) };
        out.forced.iter().for_each(|&t| doc.extend_from_slice(table.token_bytes(t)));
        if out.stop {
            return Ok(Some(doc));
        }
    }
    Ok(None)
}

#[test]
fn benchmark_instances_and_random_walks() {
    let (table, tok) = llama3_guest_table();
    let walks: usize = std::env::var("DSPARK_WALKS").ok().and_then(|w| w.parse().ok()).unwrap_or(3);
    let plugin = JsonSchemaPlugin;
    let (mut schemas, mut compiled, mut warned) = (0, 0, 0);
    let (mut valid_accepted, mut valid_rejected, mut invalid_rejected, mut invalid_accepted) = (0, 0, 0, 0);
    let (mut walks_valid, mut walks_capped) = (0, 0);
    let mut failures = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut closers = TokenSet::new(table.vocab_size());
    for t in 0..table.vocab_size() as u32 {
        if !table.is_special(t) && table.token_bytes(t).iter().any(|b| matches!(b, b'"' | b'}' | b']' | b',')) {
            closers.insert(t);
        }
    }
    for f in bench_files() {
        let Ok(doc) = serde_json::from_str::<Value>(&std::fs::read_to_string(&f).unwrap()) else { continue };
        schemas += 1;
        let source = serde_json::to_string(&doc["schema"]).unwrap();
        let Ok(c) = plugin.compile("json-schema", &source, r#"{"property_order":"any"}"#, &table) else { continue };
        compiled += 1;
        let approximated = !c.warnings().iter().all(|w| w.message.starts_with("unknown keyword"));
        warned += approximated as usize;
        for t in doc["tests"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let text = serde_json::to_string(&t["data"]).unwrap();
            let ok = accepts(&mut *c.new_matcher(), &tok.tokenize(text.as_bytes()));
            match (t["valid"].as_bool().unwrap_or(false), ok) {
                (true, true) => valid_accepted += 1,
                (true, false) => {
                    valid_rejected += 1;
                    failures.push(format!("valid rejected: {} {text}", f.display()));
                }
                (false, false) => invalid_rejected += 1,
                (false, true) => invalid_accepted += 1,
            }
        }
        // Random walks in schema order (the default, with forced key names).
        let Ok(ordered) = plugin.compile("json-schema", &source, "{}", &table) else { continue };
        let validator = jsonschema::validator_for(&doc["schema"]).ok();
        for _ in 0..walks {
            match random_walk(&mut *ordered.new_matcher(), &table, &closers, &mut rng, 300) {
                Err(why) => failures.push(format!("walk dead end: {} {why}", f.display())),
                Ok(None) => walks_capped += 1,
                Ok(Some(bytes)) => {
                    let parsed: Result<Value, _> = serde_json::from_slice(&bytes);
                    let problem = match (&parsed, &validator) {
                        (Ok(v), Some(val)) => val.validate(v).err().map(|e| e.to_string()),
                        (Ok(_), None) => None,
                        (Err(e), _) => Some(format!("not JSON: {e}")),
                    };
                    match problem {
                        None => walks_valid += 1,
                        Some(_) if approximated => {}
                        Some(why) => failures.push(format!(
                            "walk invalid ({why}): {} {}",
                            f.display(),
                            String::from_utf8_lossy(&bytes)
                        )),
                    }
                }
            }
        }
    }
    println!(
        "schemas {schemas} compiled {compiled} (approximated {warned}) | valid accepted {valid_accepted} rejected {valid_rejected} | invalid rejected {invalid_rejected} accepted {invalid_accepted} | walks valid {walks_valid} capped {walks_capped}"
    );
    for f in failures.iter().take(20) {
        println!("  {f}");
    }
    assert!(failures.iter().all(|f| !f.starts_with("walk")), "random walks produced invalid documents or dead ends");
    assert!(valid_accepted * 1000 >= (valid_accepted + valid_rejected) * 995, "valid instances rejected");
    assert!(compiled * 100 >= schemas * 85, "{compiled} of {schemas} compiled");
    assert!(walks_valid > 0);
}
