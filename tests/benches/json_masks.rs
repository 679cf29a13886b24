//! The json-schema plugin's masks natively (no Wasm), Llama-3 vocabulary, over
//! JSONSchemaBench-style files (`{schema, tests}`): where `dspark constraint maskbench`
//! measures what a server sees, this one runs the same walks under a profiler with symbols.
//!
//! `cargo bench -p dspark-tests --bench json_masks -- [--options JSON] [--slowest N] FILE...` (paths from `tests/`, where cargo runs benches):
//! compiles each file's schema and walks each valid instance (serialised compactly) token by
//! token, timing every mask and taking forced spans where they match; prints the mask-time
//! summary and the slowest masks with the text before them.

use std::sync::Arc;

use dspark_guest::{CompiledConstraint, Plugin, TokenTable};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};
use dspark_plugin_json_schema::JsonSchemaPlugin;
use dspark_tests::{llama3_guest_table, walk_timing_masks};

/// One timed mask: µs, the file, and the instance text before it.
struct Timed {
    us: f64,
    file: String,
    before: String,
}

/// Walks `tokens`, timing each mask; returns whether every token was allowed (the walk stops
/// at the first one refused: a few valid instances are, as `maskbench` reports).
fn walk(c: &Arc<dyn CompiledConstraint>, table: &TokenTable, file: &str, tokens: &[u32], out: &mut Vec<Timed>) -> bool {
    let timed = |i: usize, us: f64| {
        let before: Vec<u8> =
            tokens[i.saturating_sub(12)..i].iter().flat_map(|&t| table.token_bytes(t).to_vec()).collect();
        out.push(Timed { us, file: file.to_string(), before: String::from_utf8_lossy(&before).into_owned() });
    };
    walk_timing_masks(&**c, tokens, timed).is_ok()
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut options = r#"{"property_order":"any"}"#.to_string();
    let mut slowest = 10;
    while let Some(flag) = args.first().filter(|a| a.starts_with("--")).cloned() {
        args.remove(0);
        let value = if args.is_empty() { panic!("{flag} needs a value") } else { args.remove(0) };
        match flag.as_str() {
            "--options" => options = value,
            "--slowest" => slowest = value.parse().expect("--slowest takes a number"),
            other => panic!("unknown flag {other}"),
        }
    }
    if args.is_empty() {
        eprintln!("json_masks: give JSONSchemaBench files (e.g. ../shared/data/jsonschemabench/*/*.json)");
        return;
    }
    let (table, tok): (Arc<TokenTable>, Arc<HfTokenizer>) = llama3_guest_table();
    let mut timed = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for file in &args {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        let schema = doc["schema"].to_string();
        let Ok(c) = JsonSchemaPlugin.compile("json-schema", &schema, &options, &table) else {
            eprintln!("{file}: does not compile");
            continue;
        };
        for test in doc["tests"].as_array().into_iter().flatten() {
            if test["valid"] != serde_json::Value::Bool(true) {
                continue;
            }
            let instance = serde_json::to_string(&test["data"]).expect("an instance serialises");
            if walk(&c, &table, file, &tok.tokenize(instance.as_bytes()), &mut timed) {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
    }
    if timed.is_empty() {
        return;
    }
    let mut us: Vec<f64> = timed.iter().map(|t| t.us).collect();
    us.sort_by(f64::total_cmp);
    let at = |q: usize| us[(us.len() * q / 100).min(us.len() - 1)];
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    println!("valid instances: {accepted} walked to the end, {refused} refused on the way");
    println!(
        "{} masks, µs mean {mean:.1} p50 {:.1} p90 {:.1} p99 {:.1} max {:.1}",
        us.len(),
        at(50),
        at(90),
        at(99),
        us[us.len() - 1]
    );
    timed.sort_by(|a, b| b.us.total_cmp(&a.us));
    for t in timed.iter().take(slowest) {
        println!("{:8.0} µs  {}  after {:?}", t.us, t.file, t.before);
    }
}
