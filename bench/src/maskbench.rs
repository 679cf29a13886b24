//! `dspark constraint maskbench`: the MaskBench method, through a real plugin in wasmtime.
//!
//! For each schema file (`{"schema", "tests": [{"data", "valid"}]}`, as in JSONSchemaBench;
//! sub-folders included, files in sorted order): time the compile; walk each valid instance,
//! serialised compactly as given, token by token, timing the mask at every step and consuming
//! forced spans where they match the instance's own tokens; walk each invalid instance to see
//! whether it is rejected (a token disallowed or the end not accepting).
//!
//! Grammar files (`*.lark`, `*.gbnf`) in the folder are benchmarked too, as their own kind
//! (`--plugin grammar`), with the texts of `FILE.samples.json` (`{"valid": [...], "invalid":
//! [...]}`) as the instances; this is how the grammar fixtures are measured.
//!
//! With `--as-tools FORMAT` each schema becomes the parameters of one tool `f` for the
//! `tool-call` plugin (`tool_choice: "required"`, one call), and each instance is walked as
//! the whole call, `<tool_call>\n{"name": "f", "arguments": INSTANCE}\n</tool_call>` in the
//! Hermes format: the same figures, for the tool-call plugin over the same arguments.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use dspark_host::plugin::registry::{EntryState, Registry};
use dspark_host::plugin::{MatcherHandle, PluginError, PluginInstance, PluginRuntime, RuntimeConfig};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};
use serde_json::{Value, json};

/// What maskbench was asked to do.
pub struct Args {
    /// The plugin registry directory.
    pub plugins_dir: PathBuf,
    /// The runtime's state directory (compiled-component cache).
    pub state_dir: PathBuf,
    /// The plugin to run.
    pub plugin: String,
    /// The kind to compile.
    pub kind: String,
    /// The plugin's options, a JSON object.
    pub options: String,
    /// A Hugging Face `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// A folder of `{schema, tests}` files (sub-folders included).
    pub data: PathBuf,
    /// Only the first N files, in sorted order.
    pub limit: Option<usize>,
    /// Print one JSON object.
    pub json: bool,
    /// How many of the slowest masks and compiles the text output lists.
    pub slowest: usize,
    /// Wrap each schema as a tool in this format.
    pub as_tools: Option<dspark_plugin_tool_call::Format>,
}

#[derive(Default)]
struct Stats {
    schemas: usize,
    compiled: usize,
    compile_errors: BTreeMap<String, usize>,
    walk_errors: BTreeMap<String, usize>,
    valid_accepted: usize,
    valid_rejected: usize,
    invalid_rejected: usize,
    invalid_accepted: usize,
    /// Accepted invalid instances by the keywords the schema's warnings name (`none` where
    /// the schema compiled without a warning: an exactness bug, not an approximation).
    invalid_accepted_by_warning: BTreeMap<String, usize>,
    compile_ms: Vec<f64>,
    mask_us: Vec<f64>,
    tokens: usize,
    forced_tokens: usize,
    /// Of those, the tokens and forced tokens of the valid instances accepted (the share a
    /// generation that stays in the language sees: an instance refused early counts all its
    /// tokens above but forces none after the refusal).
    accepted_tokens: usize,
    accepted_forced_tokens: usize,
    /// Forced spans that did not match the instance's own tokens (a tokenisation other
    /// than the canonical one), rolled back, and their tokens.
    rolled_back_spans: usize,
    rolled_back_tokens: usize,
    /// Steps whose mask allowed exactly one token (decided by the constraint, yet sampled:
    /// what longer forced spans could still take), and how often each such token came.
    single_choice_steps: usize,
    single_choice_tokens: BTreeMap<u32, usize>,
    /// The vocabulary size, for counting a mask's tokens.
    vocab: usize,
    /// The slowest masks: (µs, file, token index).
    slowest: Vec<(f64, String, usize)>,
    /// The slowest compiles: (ms, file).
    slowest_compiles: Vec<(f64, String)>,
    /// The files whose masks took longest in all: (ms, file, masks).
    heaviest: Vec<(f64, String, usize)>,
    /// The current file's mask time so far (ms) and masks.
    current_mask_ms: f64,
    current_masks: usize,
    /// How many of each are kept.
    listed: usize,
    current: String,
    /// Files whose compile trapped.
    trapped: Vec<String>,
    /// Some valid instances that were rejected.
    rejected: Vec<String>,
    /// Some invalid instances that were accepted, those under a schema compiled without a
    /// warning (exactness bugs) first.
    accepted_invalid: Vec<(bool, String)>,
}

impl Stats {
    /// Closes the current file's mask time into [`Self::heaviest`].
    fn end_file(&mut self) {
        let (ms, masks) = (std::mem::take(&mut self.current_mask_ms), std::mem::take(&mut self.current_masks));
        if masks == 0 || self.listed == 0 {
            return;
        }
        if self.heaviest.len() < self.listed || self.heaviest.last().is_some_and(|last| ms > last.0) {
            self.heaviest.push((ms, self.current.clone(), masks));
            self.heaviest.sort_by(|a, b| b.0.total_cmp(&a.0));
            self.heaviest.truncate(self.listed);
        }
    }
}

/// Files under `dir` ending in `.json`, sorted, recursively.
fn schema_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            schema_files(&p, out)?;
        } else if p.to_string_lossy().ends_with(".samples.json") {
            continue;
        } else if p.extension().is_some_and(|e| e == "json" || e == "lark" || e == "gbnf") {
            out.push(p);
        }
    }
    Ok(())
}

/// The cause of a compile error, for grouping: the keyword when one is named.
fn cause(e: &PluginError) -> String {
    match e {
        PluginError::Constraint { error, .. } => {
            let m = &error.message;
            if let Some(rest) = m.split("keyword `").nth(1) {
                format!("{}: {}", error.code.as_str(), rest.split('`').next().unwrap_or(""))
            } else if m.contains("is remote") {
                format!("{}: remote $ref", error.code.as_str())
            } else {
                let short: String = m.chars().take(48).collect();
                format!("{}: {short}", error.code.as_str())
            }
        }
        PluginError::Trap { message, call, .. } => {
            format!("trap in {call}: {}", message.chars().take(48).collect::<String>())
        }
        other => format!("{other}").chars().take(60).collect(),
    }
}

/// Where a walk stopped: the index of the token a mask or commit refused, or `tokens.len()`
/// when every token went through but the end was not accepting.
struct Refused(usize);

/// Walks `tokens`; returns whether they were accepted whole. Times masks when `stats` is given.
fn walk(
    inst: &mut PluginInstance,
    m: &MatcherHandle,
    tokens: &[u32],
    mut stats: Option<&mut Stats>,
) -> Result<Result<(), Refused>, PluginError> {
    // The span that is certain before anything is written.
    let start = inst.commit(m, &[])?;
    let mut i = 0;
    if !start.forced.is_empty() {
        if tokens.starts_with(&start.forced) {
            i = start.forced.len();
            if let Some(s) = stats.as_deref_mut() {
                s.forced_tokens += start.forced.len();
            }
        } else {
            inst.rollback(m, start.forced.len() as u32)?;
        }
    }
    while i < tokens.len() {
        let t0 = Instant::now();
        let mask = inst.compute_mask(m)?;
        let dt = t0.elapsed();
        if let Some(s) = stats.as_deref_mut() {
            let us = dt.as_secs_f64() * 1e6;
            s.mask_us.push(us);
            s.current_mask_ms += us / 1e3;
            s.current_masks += 1;
            if s.slowest.len() < s.listed || s.slowest.last().is_some_and(|last| us > last.0) {
                let entry = (us, s.current.clone(), i);
                s.slowest.push(entry);
                s.slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
                s.slowest.truncate(s.listed);
            }
        }
        if !mask.allows(tokens[i]) {
            return Ok(Err(Refused(i)));
        }
        if let Some(s) = stats.as_deref_mut()
            && s.listed > 0
            && mask.count(s.vocab) == 1
        {
            s.single_choice_steps += 1;
            *s.single_choice_tokens.entry(tokens[i]).or_default() += 1;
        }
        let out = match inst.commit(m, &tokens[i..i + 1]) {
            Ok(o) => o,
            Err(PluginError::Constraint { .. }) => return Ok(Err(Refused(i))),
            Err(e) => return Err(e),
        };
        i += 1;
        if !out.forced.is_empty() {
            if tokens.get(i..i + out.forced.len()) == Some(out.forced.as_slice()) {
                i += out.forced.len();
                if let Some(s) = stats.as_deref_mut() {
                    s.forced_tokens += out.forced.len();
                }
            } else {
                if let Some(s) = stats.as_deref_mut() {
                    s.rolled_back_spans += 1;
                    s.rolled_back_tokens += out.forced.len();
                }
                inst.rollback(m, out.forced.len() as u32)?;
            }
        }
    }
    Ok(if inst.is_accepting(m)? { Ok(()) } else { Err(Refused(tokens.len())) })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn summary(v: &mut [f64], ps: &[(&str, f64)]) -> serde_json::Map<String, Value> {
    v.sort_by(|a, b| a.total_cmp(b));
    let mean = if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
    let mut m = serde_json::Map::new();
    m.insert("mean".into(), json!(round3(mean)));
    for (name, p) in ps {
        m.insert(name.to_string(), json!(round3(percentile(v, *p))));
    }
    m.insert("max".into(), json!(round3(v.last().copied().unwrap_or(0.0))));
    m
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One benchmark file: what to compile and the texts to walk.
struct Case {
    kind: String,
    source: String,
    options: String,
    /// (text, whether it is valid).
    tests: Vec<(String, bool)>,
}

/// Reads a schema file (`{schema, tests}`) or a grammar file with its samples; `None` for a
/// file that cannot be read or parsed.
fn read_case(f: &Path, args: &Args) -> Option<Case> {
    let text = std::fs::read_to_string(f).ok()?;
    let ext = f.extension()?.to_str()?;
    if ext == "lark" || ext == "gbnf" {
        let samples_path = PathBuf::from(format!("{}.samples.json", f.display()));
        let samples: Value = serde_json::from_str(&std::fs::read_to_string(samples_path).ok()?).ok()?;
        let mut tests = Vec::new();
        for (key, valid) in [("valid", true), ("invalid", false)] {
            for t in samples[key].as_array().map(Vec::as_slice).unwrap_or(&[]) {
                tests.push((t.as_str()?.to_string(), valid));
            }
        }
        return Some(Case { kind: ext.to_string(), source: text, options: "{}".into(), tests });
    }
    let doc: Value = serde_json::from_str(&text).ok()?;
    let source = match args.as_tools {
        None => serde_json::to_string(&doc["schema"]).ok()?,
        Some(format) => json!({
            "tools": [{"type": "function", "function": {"name": "f", "parameters": doc["schema"]}}],
            "tool_choice": "required", "parallel_tool_calls": false, "format": format.name(),
        })
        .to_string(),
    };
    let mut tests = Vec::new();
    for t in doc["tests"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let mut text = serde_json::to_string(&t["data"]).ok()?;
        if let Some(format) = args.as_tools {
            let s = format.syntax();
            text = format!("{}f{}{text}{}{}", s.first_open(), s.name_to_args, s.call_close, s.section_close);
        }
        tests.push((text, t["valid"].as_bool().unwrap_or(false)));
    }
    Some(Case { kind: args.kind.clone(), source, options: args.options.clone(), tests })
}

/// Runs MaskBench over every file of `args.data`; prints the report.
pub fn run(args: Args) -> anyhow::Result<std::process::ExitCode> {
    let wall = Instant::now();
    // A benchmark measures rather than protects: traps are counted by cause, and the plugin
    // is never quarantined mid-run (its Store is still rebuilt after each trap).
    let mut config = RuntimeConfig::new(args.state_dir.clone());
    config.strike_limit = u32::MAX;
    let registry = Registry::new(&args.plugins_dir, PluginRuntime::new(config)?)?;
    registry.scan();
    let plugin = match registry.state(&args.plugin) {
        Some(EntryState::Loaded(p)) => p,
        Some(EntryState::Failed(why)) => return Err(anyhow!("plugin `{}` failed to load: {why}", args.plugin)),
        None => return Err(anyhow!("no plugin `{}` in {}", args.plugin, registry.dir().display())),
    };
    let tok = Arc::new(HfTokenizer::from_file(&args.tokenizer, None)?);
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    let mut inst = plugin.instantiate(tok.table().clone(), canonical.clone())?;
    let mut files = Vec::new();
    schema_files(&args.data, &mut files)?;
    if let Some(n) = args.limit {
        files.truncate(n);
    }
    // A file's mask time is closed when the next file begins, the last one's after the loop.
    let mut s = Stats { listed: args.slowest, vocab: tok.table().vocab_size(), ..Stats::default() };
    for f in &files {
        let Some(case) = read_case(f, &args) else { continue };
        s.schemas += 1;
        s.end_file();
        s.current = f.display().to_string();
        let t0 = Instant::now();
        let compiled = match inst.compile(&case.kind, &case.source, &case.options) {
            Ok(c) => c,
            Err(e) => {
                *s.compile_errors.entry(cause(&e)).or_default() += 1;
                if matches!(e, PluginError::Trap { .. }) {
                    s.trapped.push(s.current.clone());
                }
                continue;
            }
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        s.compile_ms.push(ms);
        if s.slowest_compiles.len() < s.listed || s.slowest_compiles.last().is_some_and(|last| ms > last.0) {
            s.slowest_compiles.push((ms, s.current.clone()));
            s.slowest_compiles.sort_by(|a, b| b.0.total_cmp(&a.0));
            s.slowest_compiles.truncate(s.listed);
        }
        s.compiled += 1;
        let mut warned: Vec<&str> =
            compiled.warnings.iter().map(|(location, _)| location.rsplit('/').next().unwrap_or("")).collect();
        warned.sort_unstable();
        warned.dedup();
        let warned = if warned.is_empty() { "none".to_string() } else { warned.join("+") };
        for (text, valid) in case.tests {
            let tokens = canonical.tokenize(text.as_bytes());
            let m = match inst.new_matcher(&compiled) {
                Ok(m) => m,
                Err(_) => break,
            };
            let forced_before = s.forced_tokens;
            let accepted = if valid {
                s.tokens += tokens.len();
                walk(&mut inst, &m, &tokens, Some(&mut s))
            } else {
                walk(&mut inst, &m, &tokens, None)
            };
            let refused = match accepted {
                Ok(Ok(())) => None,
                Ok(Err(at)) => Some(at.0),
                Err(e) => {
                    *s.walk_errors.entry(cause(&e)).or_default() += 1;
                    Some(tokens.len())
                }
            };
            if valid && refused.is_none() {
                s.accepted_tokens += tokens.len();
                s.accepted_forced_tokens += s.forced_tokens - forced_before;
            }
            match (valid, refused.is_none()) {
                (true, true) => s.valid_accepted += 1,
                (true, false) => {
                    s.valid_rejected += 1;
                    if s.rejected.len() < 8 {
                        // Where: the text before the refused token, and the token.
                        let at = refused.unwrap_or(tokens.len());
                        let before: Vec<u8> =
                            tokens[..at].iter().flat_map(|&t| tok.table().token_bytes(t).to_vec()).collect();
                        let before = String::from_utf8_lossy(&before);
                        let tail: String =
                            before.chars().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
                        let token = tokens.get(at).map_or("<end>".into(), |&t| {
                            format!("{:?}", String::from_utf8_lossy(tok.table().token_bytes(t)))
                        });
                        s.rejected.push(format!("{} at token {at} {token} after …{tail}", s.current));
                    }
                }
                (false, false) => s.invalid_rejected += 1,
                (false, true) => {
                    s.invalid_accepted += 1;
                    *s.invalid_accepted_by_warning.entry(warned.clone()).or_default() += 1;
                    if s.accepted_invalid.len() < 16 {
                        let line = format!("{} ({warned}): {}", s.current, text.chars().take(160).collect::<String>());
                        s.accepted_invalid.push((warned != "none", line));
                    }
                }
            }
            let _ = inst.drop_matcher(m);
        }
        let _ = inst.drop_compiled(compiled);
    }
    s.end_file();
    let compile_ms = summary(&mut s.compile_ms, &[("p50", 0.5), ("p99", 0.99)]);
    let mask_us = summary(&mut s.mask_us, &[("p50", 0.5), ("p90", 0.9), ("p99", 0.99)]);
    let ff_share = if s.tokens == 0 { 0.0 } else { s.forced_tokens as f64 / s.tokens as f64 };
    let report = json!({
        "schemas": s.schemas,
        "compiled": s.compiled,
        "compile_errors": s.compile_errors,
        "walk_errors": s.walk_errors,
        "valid_accepted": s.valid_accepted,
        "valid_rejected": s.valid_rejected,
        "invalid_rejected": s.invalid_rejected,
        "invalid_accepted": s.invalid_accepted,
        "invalid_accepted_by_warning": s.invalid_accepted_by_warning,
        "compile_ms": compile_ms,
        "mask_us": mask_us,
        "ff_share": round3(ff_share),
        "wall_s": round3(wall.elapsed().as_secs_f64()),
    });
    if args.json {
        println!("{report}");
    } else {
        let pct = |a: usize, b: usize| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
        println!("schemas            {}", s.schemas);
        println!("compiled           {} ({:.1}%)", s.compiled, pct(s.compiled, s.schemas));
        println!("compile errors     {}", serde_json::to_string(&report["compile_errors"])?);
        println!("walk errors        {}", serde_json::to_string(&report["walk_errors"])?);
        let valid = s.valid_accepted + s.valid_rejected;
        println!(
            "valid instances    accepted {} rejected {} ({:.2}% accepted)",
            s.valid_accepted,
            s.valid_rejected,
            pct(s.valid_accepted, valid)
        );
        println!("invalid instances  rejected {} accepted {}", s.invalid_rejected, s.invalid_accepted);
        println!("  accepted under   {}", serde_json::to_string(&report["invalid_accepted_by_warning"])?);
        s.accepted_invalid.sort_by_key(|(warned, _)| *warned);
        for (warned, a) in &s.accepted_invalid {
            println!("  accepted{} {a}", if *warned { "" } else { ", no warning" });
        }
        println!("compile ms         {}", serde_json::to_string(&report["compile_ms"])?);
        println!("mask µs            {}", serde_json::to_string(&report["mask_us"])?);
        println!("masks timed        {}", s.mask_us.len());
        for r in &s.rejected {
            println!("  valid rejected   {r}");
        }
        for file in s.trapped.iter().take(5) {
            println!("  compile trapped  {file}");
        }
        for (us, file, i) in &s.slowest {
            println!("  slow mask        {us:.0} µs at token {i} of {file}");
        }
        for (ms, file) in &s.slowest_compiles {
            println!("  slow compile     {ms:.1} ms: {file}");
        }
        let total_ms: f64 = s.mask_us.iter().sum::<f64>() / 1e3;
        for (ms, file, masks) in &s.heaviest {
            println!(
                "  mask time        {ms:.0} ms in {masks} masks ({:.1}% of all mask time): {file}",
                100.0 * ms / total_ms.max(1e-9)
            );
        }
        println!("fast-forward share {:.1}% of {} tokens", 100.0 * ff_share, s.tokens);
        println!(
            "  of accepted      {:.1}% of {} tokens",
            pct(s.accepted_forced_tokens, s.accepted_tokens),
            s.accepted_tokens
        );
        println!("  rolled back      {} spans, {} tokens", s.rolled_back_spans, s.rolled_back_tokens);
        println!(
            "  one-token masks  {} ({:.1}% of tokens): sampled steps the constraint decided alone",
            s.single_choice_steps,
            pct(s.single_choice_steps, s.tokens)
        );
        let mut most: Vec<(usize, u32)> = s.single_choice_tokens.iter().map(|(&t, &n)| (n, t)).collect();
        most.sort_by_key(|&(n, _)| std::cmp::Reverse(n));
        for (n, t) in most.into_iter().take(s.listed) {
            println!("    {n:>8}  {:?}", String::from_utf8_lossy(tok.table().token_bytes(t)));
        }
        println!("wall s             {:.1}", wall.elapsed().as_secs_f64());
    }
    Ok(std::process::ExitCode::SUCCESS)
}
