//! The grammar plugin's masks natively (no Wasm) over its fixtures, Llama-3 vocabulary:
//! where `dspark constraint maskbench --plugin grammar` measures what a server sees, this
//! one runs the same walks under a profiler with symbols, and separates a grammar's first
//! masks (every walk state new) from masks over a warm walk table.
//!
//! `cargo bench -p dspark-tests --bench grammar_masks [-- ROUNDS [FILTER]]`: each round
//! compiles every fixture afresh (empty walk tables) and walks its valid samples token by
//! token, timing every mask ("first masks", what maskbench's figures are made of); then
//! walks them again over the same compiled grammars ("again": the compiled constraint's
//! mask cache answers). FILTER keeps the fixtures whose file name contains it.

use std::sync::Arc;

use dspark_guest::{CompiledConstraint, Plugin};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};
use dspark_plugin_grammar::GrammarPlugin;
use dspark_tests::{llama3_guest_table, walk_timing_masks};

/// The fixtures and their kinds, as `maskbench --plugin grammar` reads them.
const FIXTURES: [(&str, &str); 7] = [
    ("lark", "json.lark"),
    ("gbnf", "json.gbnf"),
    ("lark", "arithmetic.lark"),
    ("gbnf", "arithmetic.gbnf"),
    ("lark", "sql.lark"),
    ("gbnf", "csv3.gbnf"),
    ("lark", "lang.lark"),
];

/// Walks `text`'s tokens, pushing each mask's time in µs; panics where the grammar refuses
/// a token of a valid sample or the sample does not end accepting.
fn walk(c: &Arc<dyn CompiledConstraint>, tok: &HfTokenizer, file: &str, text: &str, times: &mut Vec<f64>) {
    let tokens = tok.tokenize(text.as_bytes());
    match walk_timing_masks(&**c, &tokens, |_, us| times.push(us)) {
        Ok(true) => {}
        Ok(false) => panic!("{file}: {text:?} does not end accepting"),
        Err(i) => panic!("{file}: token {i} of {text:?} refused"),
    }
}

/// `mean / p50 / p90 / p99 / max` of `times`.
fn summary(times: &mut [f64]) -> String {
    times.sort_by(f64::total_cmp);
    let n = times.len();
    let at = |q: usize| times[(n * q / 100).min(n - 1)];
    let mean = times.iter().sum::<f64>() / n as f64;
    format!(
        "{n} masks, µs mean {mean:.0} p50 {:.0} p90 {:.0} p99 {:.0} max {:.0}",
        at(50),
        at(90),
        at(99),
        times[n - 1]
    )
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let rounds: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(3);
    let filter = args.get(1).cloned();
    let (table, tok) = llama3_guest_table();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../constraints/grammar/tests/fixtures");
    let read = |name: &str| std::fs::read_to_string(format!("{dir}/{name}")).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut cold_medians = Vec::new();
    for round in 0..rounds {
        let (mut cold, mut warm) = (Vec::new(), Vec::new());
        for (kind, file) in FIXTURES {
            if filter.as_deref().is_some_and(|f| !file.contains(f)) {
                continue;
            }
            let samples: serde_json::Value =
                serde_json::from_str(&read(&format!("{file}.samples.json"))).expect("samples JSON");
            let texts: Vec<&str> =
                samples["valid"].as_array().expect("valid samples").iter().filter_map(|v| v.as_str()).collect();
            let c = GrammarPlugin.compile(kind, &read(file), "{}", &table).unwrap_or_else(|e| panic!("{file}: {e}"));
            for text in &texts {
                walk(&c, &tok, file, text, &mut cold);
            }
            for text in &texts {
                walk(&c, &tok, file, text, &mut warm);
            }
        }
        println!("round {round}: first masks: {}", summary(&mut cold));
        println!("round {round}: again:       {}", summary(&mut warm));
        cold_medians.push(cold[cold.len() * 99 / 100]);
    }
    cold_medians.sort_by(f64::total_cmp);
    println!("first masks p99, median of {rounds} rounds: {:.0} µs", cold_medians[rounds / 2]);
}
