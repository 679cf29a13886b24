//! `dspark generate`: one prompt through the engine, printing the text and timings.
//!
//! Useful to check a model file and to see prompt (prefill) and decode speed on this machine
//! without the HTTP server. `--chat` wraps the message in the model's chat template.
//!
//! The output may be constrained as the server constrains it, through the host's constraint
//! runtime and the plugin registry, with no HTTP in between: `--json-schema FILE`, `--regex`,
//! `--choice` (repeated) or `--grammar FILE`, in DSpark mode (`--dspark`, the default) or the
//! classic one (`--no-dspark`). The timings then include the plugin's compile time, and the
//! forced tokens (fast-forwarded without sampling) are counted.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use dspark_host::constraint::{ConstraintMode, ConstraintRequest, ConstraintRuntime};
use dspark_host::engine::{BackendChoice, EngineConfig, GenerationRequest, SamplingParams, load};
use dspark_host::plugin::registry::{EntryState, Registry};
use serde_json::json;

use super::RuntimeArgs;

/// Arguments of `dspark generate`.
#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The GGUF model file.
    #[arg(long, default_value = "assets/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// A raw prompt (no chat template).
    #[arg(long, conflicts_with = "chat", required_unless_present = "chat")]
    prompt: Option<String>,
    /// A user message, rendered with the model's chat template.
    #[arg(long)]
    chat: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the random stream.
    #[arg(long)]
    seed: Option<u64>,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Print the prompt and output token ids to stderr.
    #[arg(long)]
    show_tokens: bool,
    /// Constrain the output to the JSON Schema in FILE.
    #[arg(long, value_name = "FILE", group = "constraint")]
    json_schema: Option<PathBuf>,
    /// Constrain the output to a regular expression.
    #[arg(long, group = "constraint")]
    regex: Option<String>,
    /// Constrain the output to one of these strings (repeat the flag for each).
    #[arg(long, group = "constraint")]
    choice: Vec<String>,
    /// Constrain the output to the grammar in FILE (Lark, or GBNF where it has `::=`).
    #[arg(long, value_name = "FILE", group = "constraint")]
    grammar: Option<PathBuf>,
    /// Drive the constraint with DSpark (path tree, fast-forward, overlap); the default.
    #[arg(long, overrides_with = "no_dspark")]
    dspark: bool,
    /// Drive the constraint the classic way: a plugin mask per step, forced tokens sampled.
    #[arg(long, overrides_with = "dspark")]
    no_dspark: bool,
    #[command(flatten)]
    runtime: RuntimeArgs,
}

impl GenerateArgs {
    /// The constraint the flags ask for, if any.
    fn constraint(&self) -> anyhow::Result<Option<ConstraintRequest>> {
        let read =
            |path: &PathBuf| std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()));
        Ok(if let Some(path) = &self.json_schema {
            let text = read(path)?;
            let schema: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
            Some(ConstraintRequest::new("json-schema", schema.to_string()))
        } else if let Some(pattern) = &self.regex {
            Some(ConstraintRequest::new("regex", pattern.clone()))
        } else if !self.choice.is_empty() {
            Some(ConstraintRequest::new("choice", json!(self.choice).to_string()))
        } else if let Some(path) = &self.grammar {
            Some(ConstraintRequest::new("grammar", read(path)?))
        } else {
            None
        })
    }

    fn mode(&self) -> ConstraintMode {
        ConstraintMode::from_dspark(self.dspark || !self.no_dspark)
    }
}

/// The plugin registry of `args`, scanned, with every folder that failed to load reported.
fn registry(args: &RuntimeArgs) -> anyhow::Result<Registry> {
    let registry = Registry::new(&args.plugins_dir, args.runtime()?)?;
    registry.scan();
    for summary in registry.list() {
        if let Some(EntryState::Failed(why)) = registry.state(&summary.name) {
            eprintln!("plugin `{}` did not load: {why}", summary.name);
        }
    }
    Ok(registry)
}

/// Runs `dspark generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let (model, tokenizer) = load(BackendChoice::Cpu, &args.model)?;
    let load_time = started.elapsed();
    let prompt = match (&args.prompt, &args.chat) {
        (Some(p), _) => p.clone(),
        (None, Some(message)) => {
            let template = tokenizer
                .compile_chat_template()
                .ok_or_else(|| anyhow!("{} has no chat template; use --prompt", args.model.display()))??;
            template.render(&[json!({"role": "user", "content": message})], None, true)?
        }
        (None, None) => unreachable!("clap requires --prompt or --chat"),
    };
    let prompt_ids = tokenizer.encode(&prompt)?;
    if args.show_tokens {
        eprintln!("prompt tokens: {prompt_ids:?}");
    }
    let mode = args.mode();
    let dspark = mode == ConstraintMode::DSpark;
    let config = EngineConfig {
        max_num_seqs: 1,
        max_num_batched_tokens: 2048,
        overlap_masks: dspark,
        masked_logits: dspark,
        guesses: dspark,
        ..EngineConfig::default()
    };
    let vocab = model.config().vocab_size;
    let tokenizer = Arc::new(tokenizer);
    let mut engine = model.engine(tokenizer.clone(), &config)?;
    let mut request = GenerationRequest::new(prompt_ids.clone());
    let compiling = Instant::now();
    if let Some(constraint) = args.constraint()? {
        let registry = registry(&args.runtime)?;
        let runtime = ConstraintRuntime::new(tokenizer, vocab, mode);
        let built =
            runtime.build(&registry, &constraint).with_context(|| format!("the {} constraint", constraint.kind))?;
        for (location, message) in &built.warnings {
            eprintln!("approximated at `{location}`: {message}");
        }
        request.constraint = Some(Box::new(built.constraint));
    }
    let compile_time = compiling.elapsed();
    request.max_tokens = Some(args.max_tokens);
    request.sampling = SamplingParams {
        temperature: args.temperature,
        seed: args.seed,
        top_p: args.top_p,
        top_k: args.top_k,
        ..SamplingParams::default()
    };
    engine.add_request(request).context("the request was refused")?;

    let mut stdout = std::io::stdout().lock();
    let begin = Instant::now();
    let mut first_token = None;
    let mut generated = 0usize;
    let mut forced = 0usize;
    let mut finish = None;
    while engine.has_work() {
        for update in engine.step()? {
            first_token.get_or_insert_with(|| begin.elapsed());
            generated += update.tokens.len();
            forced += update.tokens.iter().filter(|t| t.forced).count();
            if args.show_tokens {
                eprint!("{:?}", update.tokens.iter().map(|t| t.token).collect::<Vec<_>>());
            }
            write!(stdout, "{}", update.text)?;
            stdout.flush()?;
            finish = update.finish.or(finish);
        }
    }
    let total = begin.elapsed();
    let prefill = first_token.unwrap_or(total);
    let decode = total.saturating_sub(prefill);
    writeln!(stdout)?;
    eprintln!(
        "\nfinish: {finish:?}\nload: {:.2}s\nconstraint: {:.1} ms ({} mode), {forced} tokens forced\nprompt: {} tokens in {:.1} ms ({:.1} tokens/s)\ndecode: {} tokens in {:.1} ms ({:.1} tokens/s)",
        load_time.as_secs_f64(),
        compile_time.as_secs_f64() * 1e3,
        if dspark { "dspark" } else { "classic" },
        prompt_ids.len(),
        prefill.as_secs_f64() * 1e3,
        prompt_ids.len() as f64 / prefill.as_secs_f64().max(1e-9),
        generated.saturating_sub(1),
        decode.as_secs_f64() * 1e3,
        generated.saturating_sub(1) as f64 / decode.as_secs_f64().max(1e-9),
    );
    Ok(())
}
