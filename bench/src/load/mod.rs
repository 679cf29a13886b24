//! `dspark bench`: a load generator for any OpenAI-compatible chat endpoint (ours, llama.cpp's
//! `llama-server`, vLLM, SGLang), built to reproduce the published DSpark test and to compare
//! two targets side by side.
//!
//! Each request streams (`stream: true`), so the time to first token is measured. The default
//! profile is the published test: the `orders` workload (see [`workload`]), 200 requests at
//! concurrency 16, 20 records, `max_tokens` 1024, greedy. A CPU-sized profile is documented in
//! `docs/results.md` (5 records, 32 requests, concurrency 8).
//!
//! With `--compare`, the requests run in blocks of `2 x concurrency`, alternating which target
//! goes first (A B, B A, ...), so load on the machine and its thermal state fall on both
//! alike; each target's wall time is the sum of its blocks. For greedy runs the share of
//! requests whose answers are byte-identical between the targets is reported.
//!
//! Figures, per target:
//! - requests/s and completion tokens/s overall: finished requests and their completion tokens
//!   over the target's wall time;
//! - per-request tokens/s: the mean over requests of completion tokens over the time after the
//!   first token (`latency - TTFT`): the speed a single client sees while its answer streams;
//! - TTFT p50, latency p50 and p99 (nearest rank), mean completion tokens;
//! - % valid JSON, % schema-valid (the workload's schema, checked with the `jsonschema`
//!   crate), % records exactly right (every field of a true record found in the answer);
//! - finish-reason counts and failed requests (with the first error).
//!
//! The workload schemas hold exactly `--records` records and bound free-text fields (see
//! [`workload`]); `--any-count` leaves the array's length open, as earlier runs had it.
//!
//! `--whitespace-pattern` adds vLLM's `structured_outputs.whitespace_pattern` to constrained
//! requests (dspark and vLLM honour it; llama.cpp ignores the field). Small models that were
//! tuned on pretty-printed JSON (Qwen2.5) write better records when allowed their newlines.

pub mod client;
pub mod workload;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};

use client::{Endpoint, Outcome};
use workload::{Prompt, Workload};

/// How the target server takes the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaField {
    /// OpenAI's `response_format: {"type": "json_schema", ...}` (dspark, vLLM, llama.cpp).
    ResponseFormat,
    /// llama.cpp's top-level `json_schema`.
    JsonSchema,
    /// vLLM's older `guided_json`.
    GuidedJson,
    /// vLLM's `structured_outputs: {"json": ...}`.
    StructuredOutputs,
    /// No constraint: the schema is only described in the prompt.
    None,
}

/// Arguments of `dspark bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The target's base URL (`http://host:port`, optionally with a path prefix).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// The model name to request.
    #[arg(long)]
    model: String,
    /// Bearer token for the targets.
    #[arg(long, env = "OPENAI_API_KEY")]
    api_key: Option<String>,
    /// The workload.
    #[arg(long, value_enum, default_value = "orders")]
    workload: Workload,
    /// Requests per target.
    #[arg(long, default_value_t = 200)]
    requests: usize,
    /// Requests in flight at once, per target.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 1024)]
    max_tokens: u32,
    /// Records per prompt.
    #[arg(long, default_value_t = 20)]
    records: usize,
    /// Leave the number of records open in the schema (no `minItems`/`maxItems`; by default
    /// the array holds exactly `--records` items, as the instruction says).
    #[arg(long)]
    any_count: bool,
    /// Seed of the prompts (and of sampling, when the temperature is above 0).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sampling temperature (0: greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f64,
    /// How the target takes the schema.
    #[arg(long, value_enum, default_value = "response-format")]
    schema_field: SchemaField,
    /// Sent with every constrained request as vLLM's `structured_outputs.whitespace_pattern`
    /// (dspark and vLLM take it): the whitespace allowed between JSON tokens, for models that
    /// write JSON with newlines and indentation (compact JSON otherwise). E.g. `[\n ]{0,16}`.
    #[arg(long)]
    whitespace_pattern: Option<String>,
    /// A second target, run interleaved: a URL (`http://...`), or a model name at `--url`.
    #[arg(long)]
    compare: Option<String>,
    /// The model name at the `--compare` URL (default: `--model`).
    #[arg(long)]
    compare_model: Option<String>,
    /// How the second target takes the schema (default: `--schema-field`).
    #[arg(long, value_enum)]
    compare_schema_field: Option<SchemaField>,
    /// Seconds before a request counts as failed.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Write every answer to this file, one JSON object per line (target, index, content,
    /// finish reason, completion tokens, error, and the seconds: sent after its block's
    /// start, TTFT, latency).
    #[arg(long)]
    dump: Option<std::path::PathBuf>,
}

/// One server and model under test.
struct Target {
    label: String,
    endpoint: Endpoint,
    model: String,
    schema_field: SchemaField,
}

/// The aggregate figures of one target (see the module docs).
#[derive(Debug, Default, serde::Serialize)]
struct Summary {
    target: String,
    requests: usize,
    failed: usize,
    wall_s: f64,
    requests_per_s: f64,
    completion_tokens_per_s: f64,
    per_request_tokens_per_s: f64,
    ttft_p50_s: f64,
    latency_p50_s: f64,
    latency_p99_s: f64,
    mean_completion_tokens: f64,
    valid_json_pct: f64,
    schema_valid_pct: f64,
    records_right_pct: f64,
    finish_reasons: BTreeMap<String, usize>,
    usage_reported: bool,
    first_error: Option<String>,
}

/// Runs the benchmark.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.requests > 0 && args.concurrency > 0, "--requests and --concurrency must be positive");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(bench(args))
}

async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let primary = Target {
        label: format!("{} @ {}", args.model, args.url),
        endpoint: Endpoint::parse(&args.url, args.api_key.clone())?,
        model: args.model.clone(),
        schema_field: args.schema_field,
    };
    let secondary = match &args.compare {
        None => None,
        Some(c) if c.starts_with("http://") || c.starts_with("https://") => {
            let model = args.compare_model.clone().unwrap_or_else(|| args.model.clone());
            Some(Target {
                label: format!("{model} @ {c}"),
                endpoint: Endpoint::parse(c, args.api_key.clone())?,
                model,
                schema_field: args.compare_schema_field.unwrap_or(args.schema_field),
            })
        }
        Some(model) => Some(Target {
            label: format!("{model} @ {}", args.url),
            endpoint: primary.endpoint.clone(),
            model: model.clone(),
            schema_field: args.compare_schema_field.unwrap_or(args.schema_field),
        }),
    };
    let prompts: Vec<Arc<Prompt>> = (0..args.requests)
        .map(|i| Arc::new(workload::prompt(args.workload, args.seed, i, args.records, !args.any_count)))
        .collect();
    let targets: Vec<Arc<Target>> = std::iter::once(primary).chain(secondary).map(Arc::new).collect();
    let mut outcomes: Vec<Vec<Option<Outcome>>> = vec![vec![None; prompts.len()]; targets.len()];
    let mut walls = vec![0.0f64; targets.len()];
    let block = if targets.len() > 1 { args.concurrency * 2 } else { prompts.len() };
    for (b, start) in (0..prompts.len()).step_by(block).enumerate() {
        let end = (start + block).min(prompts.len());
        let mut order: Vec<usize> = (0..targets.len()).collect();
        if b % 2 == 1 {
            order.reverse();
        }
        for t in order {
            let (results, wall) = run_block(&targets[t], &prompts, start..end, &args).await;
            walls[t] += wall;
            for (i, o) in results {
                outcomes[t][i] = Some(o);
            }
        }
        if !args.json {
            eprintln!("  {end}/{} requests per target done", prompts.len());
        }
    }
    let validator =
        jsonschema::validator_for(&workload::schema(args.workload, (!args.any_count).then_some(args.records)))
            .map_err(|e| anyhow::anyhow!("the workload schema does not compile: {e}"))?;
    let summaries: Vec<Summary> = targets
        .iter()
        .zip(&outcomes)
        .zip(&walls)
        .map(|((t, o), &wall)| summarize(&t.label, &prompts, o, wall, &validator))
        .collect();
    if let Some(path) = &args.dump {
        let mut lines = String::new();
        for (t, outcomes) in targets.iter().zip(&outcomes) {
            for (index, o) in outcomes.iter().enumerate() {
                let Some(o) = o else { continue };
                let line = json!({"target": t.label, "index": index, "content": o.content, "finish_reason": o.finish_reason, "completion_tokens": o.completion_tokens, "error": o.error, "sent_at_s": o.sent_at, "ttft_s": o.ttft, "latency_s": o.latency});
                lines.push_str(&line.to_string());
                lines.push('\n');
            }
        }
        std::fs::write(path, lines).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let identical = (targets.len() == 2 && args.temperature == 0.0).then(|| identical_pct(&outcomes[0], &outcomes[1]));
    print(&args, &summaries, identical);
    Ok(())
}

/// Runs prompts `range` against one target with `args.concurrency` clients; returns the
/// outcomes by prompt index and the wall time.
async fn run_block(
    target: &Arc<Target>,
    prompts: &[Arc<Prompt>],
    range: std::ops::Range<usize>,
    args: &BenchArgs,
) -> (Vec<(usize, Outcome)>, f64) {
    let cursor = Arc::new(AtomicUsize::new(range.start));
    let end = range.end;
    let timeout = Duration::from_secs(args.timeout);
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.min(range.len()) {
        let (cursor, target) = (cursor.clone(), target.clone());
        let bodies: Vec<(usize, Value)> =
            range.clone().map(|i| (i, request_body(&target, &prompts[i], i, args))).collect();
        clients.spawn(async move {
            let mut done = Vec::new();
            loop {
                let i = cursor.fetch_add(1, Ordering::SeqCst);
                if i >= end {
                    return done;
                }
                let body = &bodies[i - bodies[0].0].1;
                let sent_at = started.elapsed().as_secs_f64();
                let mut outcome = client::chat(&target.endpoint, body, timeout).await;
                outcome.sent_at = sent_at;
                done.push((i, outcome));
            }
        });
    }
    let mut results = Vec::new();
    while let Some(done) = clients.join_next().await {
        results.extend(done.unwrap_or_default());
    }
    (results, started.elapsed().as_secs_f64())
}

fn request_body(target: &Target, prompt: &Prompt, index: usize, args: &BenchArgs) -> Value {
    let mut body = json!({
        "model": target.model,
        "messages": prompt.messages,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if args.temperature > 0.0 {
        body["seed"] = json!(args.seed.wrapping_add(index as u64));
    }
    if prompt.constrained {
        let schema = prompt.schema.clone();
        match target.schema_field {
            SchemaField::ResponseFormat => {
                body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": prompt.key, "schema": schema, "strict": true}});
            }
            SchemaField::JsonSchema => body["json_schema"] = schema,
            SchemaField::GuidedJson => body["guided_json"] = schema,
            SchemaField::StructuredOutputs => body["structured_outputs"] = json!({"json": schema}),
            SchemaField::None => {}
        }
        if let Some(pattern) = &args.whitespace_pattern
            && target.schema_field != SchemaField::None
        {
            if !body["structured_outputs"].is_object() {
                body["structured_outputs"] = json!({});
            }
            body["structured_outputs"]["whitespace_pattern"] = json!(pattern);
        }
    }
    body
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

fn summarize(
    label: &str,
    prompts: &[Arc<Prompt>],
    outcomes: &[Option<Outcome>],
    wall: f64,
    validator: &jsonschema::Validator,
) -> Summary {
    let mut s = Summary { target: label.to_string(), requests: outcomes.len(), wall_s: wall, ..Summary::default() };
    let (mut ttfts, mut latencies, mut speeds) = (Vec::new(), Vec::new(), Vec::new());
    let (mut tokens, mut valid, mut schema_valid, mut right, mut records) = (0u64, 0, 0, 0, 0);
    let mut ok = 0usize;
    s.usage_reported = true;
    for (prompt, outcome) in prompts.iter().zip(outcomes) {
        let Some(o) = outcome else { continue };
        if let Some(e) = &o.error {
            s.failed += 1;
            s.first_error.get_or_insert_with(|| e.clone());
            continue;
        }
        ok += 1;
        s.usage_reported &= o.usage_reported;
        *s.finish_reasons.entry(o.finish_reason.clone().unwrap_or_else(|| "none".into())).or_default() += 1;
        tokens += o.completion_tokens;
        latencies.push(o.latency);
        if let Some(t) = o.ttft {
            ttfts.push(t);
            if o.latency > t && o.completion_tokens > 1 {
                speeds.push(o.completion_tokens as f64 / (o.latency - t));
            }
        }
        let score = workload::score(prompt, validator, &o.content);
        valid += score.valid_json as usize;
        schema_valid += score.schema_valid as usize;
        right += score.records_right;
        records += score.records;
    }
    for v in [&mut ttfts, &mut latencies] {
        v.sort_by(f64::total_cmp);
    }
    let pct = |n: usize, of: usize| if of == 0 { 0.0 } else { 100.0 * n as f64 / of as f64 };
    s.requests_per_s = if wall > 0.0 { ok as f64 / wall } else { 0.0 };
    s.completion_tokens_per_s = if wall > 0.0 { tokens as f64 / wall } else { 0.0 };
    s.per_request_tokens_per_s = if speeds.is_empty() { 0.0 } else { speeds.iter().sum::<f64>() / speeds.len() as f64 };
    s.ttft_p50_s = percentile(&ttfts, 50.0);
    s.latency_p50_s = percentile(&latencies, 50.0);
    s.latency_p99_s = percentile(&latencies, 99.0);
    s.mean_completion_tokens = if ok == 0 { 0.0 } else { tokens as f64 / ok as f64 };
    s.valid_json_pct = pct(valid, ok);
    s.schema_valid_pct = pct(schema_valid, ok);
    s.records_right_pct = pct(right, records);
    s
}

fn identical_pct(a: &[Option<Outcome>], b: &[Option<Outcome>]) -> f64 {
    let pairs: Vec<(&Outcome, &Outcome)> = a
        .iter()
        .zip(b)
        .filter_map(|(x, y)| Some((x.as_ref()?, y.as_ref()?)))
        .filter(|(x, y)| x.error.is_none() && y.error.is_none())
        .collect();
    if pairs.is_empty() {
        return 0.0;
    }
    100.0 * pairs.iter().filter(|(x, y)| x.content == y.content).count() as f64 / pairs.len() as f64
}

fn print(args: &BenchArgs, summaries: &[Summary], identical: Option<f64>) {
    if args.json {
        let ratios = (summaries.len() == 2).then(|| {
            let (a, b) = (&summaries[0], &summaries[1]);
            let r = |x: f64, y: f64| if y > 0.0 { x / y } else { 0.0 };
            json!({
                "requests_per_s": r(a.requests_per_s, b.requests_per_s),
                "completion_tokens_per_s": r(a.completion_tokens_per_s, b.completion_tokens_per_s),
                "per_request_tokens_per_s": r(a.per_request_tokens_per_s, b.per_request_tokens_per_s),
                "ttft_p50_s": r(a.ttft_p50_s, b.ttft_p50_s),
                "latency_p50_s": r(a.latency_p50_s, b.latency_p50_s),
                "latency_p99_s": r(a.latency_p99_s, b.latency_p99_s),
            })
        });
        let out = json!({
            "workload": format!("{:?}", args.workload).to_lowercase(),
            "requests": args.requests,
            "concurrency": args.concurrency,
            "records": args.records,
            "records_bound_in_schema": !args.any_count,
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "targets": summaries,
            "ratios_first_over_second": ratios,
            "identical_pct": identical,
        });
        println!("{out:#}");
        return;
    }
    println!(
        "workload {:?}, {} requests per target, concurrency {}, {} records{}, max_tokens {}, temperature {}",
        args.workload,
        args.requests,
        args.concurrency,
        args.records,
        if args.any_count { " (any count)" } else { "" },
        args.max_tokens,
        args.temperature
    );
    let labels: Vec<String> = summaries.iter().map(|s| s.target.clone()).collect();
    for (i, l) in labels.iter().enumerate() {
        println!("  [{}] {l}", (b'A' + i as u8) as char);
    }
    let ratio_header = if summaries.len() == 2 { format!("{:>10}", "A/B") } else { String::new() };
    let heads: String = (0..summaries.len()).map(|i| format!("{:>14}", (b'A' + i as u8) as char)).collect();
    println!("{:<32}{heads}{ratio_header}", "");
    let row = |name: &str, get: &dyn Fn(&Summary) -> f64, digits: usize| {
        let cells: String = summaries.iter().map(|s| format!("{:>14.*}", digits, get(s))).collect();
        let ratio = if summaries.len() == 2 && get(&summaries[1]) != 0.0 {
            format!("{:>9.2}x", get(&summaries[0]) / get(&summaries[1]))
        } else {
            String::new()
        };
        println!("{name:<32}{cells}{ratio}");
    };
    row("requests/s", &|s| s.requests_per_s, 3);
    row("completion tok/s (overall)", &|s| s.completion_tokens_per_s, 1);
    row("per-request tok/s (mean)", &|s| s.per_request_tokens_per_s, 1);
    row("TTFT p50 (s)", &|s| s.ttft_p50_s, 3);
    row("latency p50 (s)", &|s| s.latency_p50_s, 2);
    row("latency p99 (s)", &|s| s.latency_p99_s, 2);
    row("mean completion tokens", &|s| s.mean_completion_tokens, 1);
    row("valid JSON %", &|s| s.valid_json_pct, 1);
    row("schema-valid %", &|s| s.schema_valid_pct, 1);
    row("records exactly right %", &|s| s.records_right_pct, 1);
    row("failed requests", &|s| s.failed as f64, 0);
    row("wall time (s)", &|s| s.wall_s, 1);
    for (i, s) in summaries.iter().enumerate() {
        let reasons: Vec<String> = s.finish_reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
        println!(
            "[{}] finish reasons: {}{}",
            (b'A' + i as u8) as char,
            reasons.join(", "),
            if s.usage_reported { "" } else { " (no usage reported: tokens counted as content chunks)" }
        );
        if let Some(e) = &s.first_error {
            println!("[{}] first error: {e}", (b'A' + i as u8) as char);
        }
    }
    if let Some(p) = identical {
        println!("byte-identical answers A vs B: {p:.1}%");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn target(schema_field: SchemaField) -> Target {
        Target {
            label: "t".into(),
            endpoint: Endpoint::parse("http://127.0.0.1:1", None).unwrap(),
            model: "m".into(),
            schema_field,
        }
    }

    #[test]
    fn a_whitespace_pattern_goes_with_every_constrained_request() {
        use clap::Parser;
        let args = Cli::parse_from(["bench", "--model", "m", "--whitespace-pattern", "[\\n ]{0,16}"]).bench;
        let prompt = workload::prompt(Workload::Orders, 0, 0, 2, true);
        let body = request_body(&target(SchemaField::ResponseFormat), &prompt, 0, &args);
        assert_eq!(body["structured_outputs"], json!({"whitespace_pattern": "[\\n ]{0,16}"}));
        assert_eq!(body["response_format"]["json_schema"]["schema"], prompt.schema);
        let body = request_body(&target(SchemaField::StructuredOutputs), &prompt, 0, &args);
        assert_eq!(body["structured_outputs"], json!({"json": prompt.schema, "whitespace_pattern": "[\\n ]{0,16}"}));
        // Unconstrained requests and schema-less targets get nothing.
        let body = request_body(&target(SchemaField::None), &prompt, 0, &args);
        assert!(body.get("structured_outputs").is_none());
        let text = workload::prompt(Workload::Text, 0, 0, 2, true);
        let body = request_body(&target(SchemaField::ResponseFormat), &text, 0, &args);
        assert!(body.get("structured_outputs").is_none() && body.get("response_format").is_none());
        // Without the option the body is as before.
        let plain = Cli::parse_from(["bench", "--model", "m"]).bench;
        let body = request_body(&target(SchemaField::ResponseFormat), &prompt, 0, &plain);
        assert!(body.get("structured_outputs").is_none());
    }
}
