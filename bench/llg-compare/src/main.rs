//! MaskBench side by side: llguidance 1.9.1 (natively, as vLLM and SGLang run it) and dspark's
//! json-schema plugin (through wasmtime, via `dspark constraint maskbench --json`), on the same
//! tokenizer and schema files, in one run.
//!
//! ```sh
//! cargo run --release --manifest-path bench/llg-compare/Cargo.toml -- \
//!     --tokenizer assets/tokenizers/llama3/tokenizer.json \
//!     --data ../shared/data/jsonschemabench --dspark target/release/dspark
//! ```
//!
//! The method is dspark's maskbench (see `server/src/cli/maskbench.rs`), applied to both: per
//! schema file (`{schema, tests}`, sub-folders included, in sorted order) the compile is timed;
//! each test instance is serialised compactly as given and tokenised with the tokenizer; a
//! walk times the mask at every token, requires the token to be allowed and consumed, consumes
//! a forced span where the instance's tokens start with it, and ends by asking whether the
//! output is accepting. Valid instances count as accepted or rejected, invalid ones as rejected
//! or accepted; only the walks of valid instances are timed. llguidance is given the same
//! output language as dspark's default: compact separators, no free whitespace
//! (`x-guidance: {whitespace_flexible: false}`), properties in any order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokenId};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};

struct Args {
    tokenizer: PathBuf,
    data: PathBuf,
    limit: Option<usize>,
    dspark: Option<PathBuf>,
    /// Where to link the files llguidance compiles (for a run of both on those only).
    compiled_to: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut args = std::env::args().skip(1);
    let (mut tokenizer, mut data, mut limit, mut dspark, mut compiled_to) = (None, None, None, None, None);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--tokenizer" => tokenizer = Some(PathBuf::from(value()?)),
            "--data" => data = Some(PathBuf::from(value()?)),
            "--limit" => limit = Some(value()?.parse().context("--limit takes a number")?),
            "--dspark" => dspark = Some(PathBuf::from(value()?)),
            "--compiled-to" => compiled_to = Some(PathBuf::from(value()?)),
            other => bail!(
                "unknown argument {other}; usage: --tokenizer T.json --data DIR [--limit N] [--dspark BIN] \
                 [--compiled-to DIR]"
            ),
        }
    }
    Ok(Args {
        tokenizer: tokenizer.context("--tokenizer is required")?,
        data: data.context("--data is required")?,
        limit,
        dspark,
        compiled_to,
    })
}

/// The `.json` files under `dir`, sub-folders included, sorted by path.
fn files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let p = e?.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

#[derive(Default)]
struct Stats {
    schemas: usize,
    compiled: usize,
    compile_errors: BTreeMap<String, usize>,
    valid_accepted: usize,
    valid_rejected: usize,
    invalid_rejected: usize,
    invalid_accepted: usize,
    compile_ms: Vec<f64>,
    mask_us: Vec<f64>,
    tokens: usize,
    forced: usize,
    compiled_files: Vec<PathBuf>,
}

/// The schema with llguidance's options for dspark's default output (compact, no free
/// whitespace); boolean schemas become their object forms so the options have a place.
fn with_options(schema: &Value) -> Value {
    let mut s = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => json!({"not": {}}),
        other => other.clone(),
    };
    if let Some(o) = s.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ",", "key_separator": ":", "lenient": false}),
        );
    }
    s
}

/// Walks `tokens` through a fresh copy of the matcher; times masks into `stats` when given.
fn walk(m: &mut Matcher, tokens: &[TokenId], mut stats: Option<&mut Stats>) -> bool {
    let mut i = 0;
    let take_forced = |m: &mut Matcher, i: &mut usize, stats: &mut Option<&mut Stats>| {
        let ff = m.compute_ff_tokens();
        if !ff.is_empty() && tokens[*i..].starts_with(&ff) && m.consume_tokens(&ff).is_ok() {
            if std::env::var_os("LLG_DEBUG").is_some() {
                eprintln!("forced {:?} at {}", ff, *i);
            }
            *i += ff.len();
            if let Some(s) = stats.as_deref_mut() {
                s.forced += ff.len();
            }
        }
    };
    take_forced(m, &mut i, &mut stats);
    while i < tokens.len() {
        let t0 = Instant::now();
        let mask = m.compute_mask();
        let dt = t0.elapsed().as_secs_f64() * 1e6;
        if let Some(s) = stats.as_deref_mut() {
            s.mask_us.push(dt);
        }
        match mask {
            Ok(mask) if mask.is_allowed(tokens[i]) => {}
            _ => return false,
        }
        if m.consume_token(tokens[i]).is_err() {
            return false;
        }
        i += 1;
        take_forced(m, &mut i, &mut stats);
    }
    m.is_accepting().unwrap_or(false)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[(((sorted.len() - 1) as f64) * p).round() as usize]
}

fn summary(v: &mut [f64], ps: &[(&str, f64)]) -> Value {
    v.sort_by(f64::total_cmp);
    let mean = if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let mut o = serde_json::Map::new();
    o.insert("mean".into(), json!(mean));
    for (name, p) in ps {
        o.insert((*name).into(), json!(percentile(v, *p)));
    }
    o.insert("max".into(), json!(v.last().copied().unwrap_or(0.0)));
    Value::Object(o)
}

/// llguidance's MaskBench over `files`, as the same JSON object dspark's `--json` prints.
fn run_llguidance(args: &Args, files: &[PathBuf]) -> Result<(Value, Vec<PathBuf>)> {
    let tok = toktrie_hf_tokenizers::ByteTokenizer::from_file(&args.tokenizer)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("loading {}", args.tokenizer.display()))?;
    let env: TokEnv = tok.into_tok_env(None).map_err(|e| anyhow::anyhow!("{e}"))?;
    let caps = InferenceCapabilities { ff_tokens: true, ..Default::default() };
    let mut factory =
        ParserFactory::new(&env, caps, &SlicedBiasComputer::general_slices()).map_err(|e| anyhow::anyhow!("{e}"))?;
    factory.set_stderr_log_level(0);
    let wall = Instant::now();
    let mut s = Stats::default();
    for f in files {
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(f)?).with_context(|| format!("parsing {}", f.display()))?;
        s.schemas += 1;
        let t0 = Instant::now();
        let grammar = TopLevelGrammar::from_json_schema(with_options(&case["schema"]));
        let matcher = Matcher::new(factory.create_parser(grammar));
        if let Some(e) = matcher.get_error() {
            let cause: String = e.chars().take(60).collect();
            *s.compile_errors.entry(cause).or_default() += 1;
            continue;
        }
        s.compile_ms.push(t0.elapsed().as_secs_f64() * 1e3);
        s.compiled += 1;
        s.compiled_files.push(f.clone());
        for t in case["tests"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
            let text = serde_json::to_string(&t["data"])?;
            let valid = t["valid"].as_bool().unwrap_or(false);
            let tokens = env.tokenize_bytes(text.as_bytes());
            let mut m = matcher.deep_clone();
            let accepted = if valid {
                s.tokens += tokens.len();
                walk(&mut m, &tokens, Some(&mut s))
            } else {
                walk(&mut m, &tokens, None)
            };
            match (valid, accepted) {
                (true, true) => s.valid_accepted += 1,
                (true, false) => s.valid_rejected += 1,
                (false, false) => s.invalid_rejected += 1,
                (false, true) => s.invalid_accepted += 1,
            }
        }
    }
    let report = json!({
        "schemas": s.schemas,
        "compiled": s.compiled,
        "compile_errors": s.compile_errors,
        "valid_accepted": s.valid_accepted,
        "valid_rejected": s.valid_rejected,
        "invalid_rejected": s.invalid_rejected,
        "invalid_accepted": s.invalid_accepted,
        "compile_ms": summary(&mut s.compile_ms, &[("p50", 0.5), ("p99", 0.99)]),
        "mask_us": summary(&mut s.mask_us, &[("p50", 0.5), ("p90", 0.9), ("p99", 0.99)]),
        "ff_share": if s.tokens == 0 { 0.0 } else { s.forced as f64 / s.tokens as f64 },
        "wall_s": wall.elapsed().as_secs_f64(),
    });
    Ok((report, s.compiled_files))
}

/// dspark's maskbench on the same data (`--json`).
fn run_dspark(bin: &Path, args: &Args) -> Result<Value> {
    let mut cmd = Command::new(bin);
    cmd.args(["constraint", "maskbench", "--json", "--tokenizer"]).arg(&args.tokenizer).arg("--data").arg(&args.data);
    if let Some(n) = args.limit {
        cmd.args(["--limit", &n.to_string()]);
    }
    let out = cmd.output().with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!("{} failed: {}", bin.display(), String::from_utf8_lossy(&out.stderr));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).context("no JSON line from dspark maskbench")?;
    Ok(serde_json::from_str(line)?)
}

fn row(name: &str, a: String, b: Option<String>) {
    println!("| {name} | {a} | {} |", b.unwrap_or_else(|| "-".into()));
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let mut all = files(&args.data)?;
    if let Some(n) = args.limit {
        all.truncate(n);
    }
    let (llg, compiled) = run_llguidance(&args, &all)?;
    if let Some(dir) = &args.compiled_to {
        // Flat names: the folder path joined with `---`, as the benchmark's own names are.
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for f in &compiled {
            let rel = f.strip_prefix(&args.data).unwrap_or(f);
            let name = rel.to_string_lossy().replace('/', "---");
            let target = std::fs::canonicalize(f)?;
            std::os::unix::fs::symlink(&target, dir.join(name)).with_context(|| format!("linking {}", f.display()))?;
        }
    }
    let ds = args.dspark.as_deref().map(|bin| run_dspark(bin, &args)).transpose()?;
    let f = |v: &Value, path: &[&str]| -> String {
        let mut x = v;
        for p in path {
            x = &x[*p];
        }
        match x {
            Value::Number(n) if n.is_f64() => format!("{:.2}", n.as_f64().unwrap_or(0.0)),
            other => other.to_string(),
        }
    };
    let both = |path: &[&str]| (f(&llg, path), ds.as_ref().map(|d| f(d, path)));
    println!("| figure | llguidance 1.9.1 (native) | dspark json-schema (Wasm) |");
    println!("|---|---|---|");
    for (name, path) in [
        ("schemas", &["schemas"][..]),
        ("compiled", &["compiled"]),
        ("valid accepted", &["valid_accepted"]),
        ("valid rejected", &["valid_rejected"]),
        ("invalid rejected", &["invalid_rejected"]),
        ("invalid accepted", &["invalid_accepted"]),
        ("compile ms mean", &["compile_ms", "mean"]),
        ("compile ms p50", &["compile_ms", "p50"]),
        ("compile ms p99", &["compile_ms", "p99"]),
        ("mask µs mean", &["mask_us", "mean"]),
        ("mask µs p50", &["mask_us", "p50"]),
        ("mask µs p90", &["mask_us", "p90"]),
        ("mask µs p99", &["mask_us", "p99"]),
        ("mask µs max", &["mask_us", "max"]),
        ("fast-forward share", &["ff_share"]),
        ("wall s", &["wall_s"]),
    ] {
        let (a, b) = both(path);
        row(name, a, b);
    }
    println!();
    println!("llguidance compile errors: {}", llg["compile_errors"]);
    Ok(())
}
