//! `dspark generate`: one prompt through the engine, printing the text and timings.
//!
//! Useful to check a model file and to see prompt (prefill) and decode speed on this machine
//! without the HTTP server. `--chat` wraps the message in the model's chat template.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, anyhow};
use dspark_host::engine::{CpuBackend, EngineConfig, GenerationRequest, LlmEngine, SamplingParams, load_model};
use serde_json::json;

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
}

/// Runs `dspark generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let (model, tokenizer) = load_model(CpuBackend::new(), &args.model)?;
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
    let config = EngineConfig { max_num_seqs: 1, max_num_batched_tokens: 2048, ..EngineConfig::default() };
    let mut engine = LlmEngine::new(Arc::new(model), Arc::new(tokenizer), &config)?;
    let mut request = GenerationRequest::new(prompt_ids.clone());
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
    let mut finish = None;
    while engine.has_work() {
        for update in engine.step()? {
            first_token.get_or_insert_with(|| begin.elapsed());
            generated += update.tokens.len();
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
        "\nfinish: {finish:?}\nload: {:.2}s\nprompt: {} tokens in {:.1} ms ({:.1} tokens/s)\ndecode: {} tokens in {:.1} ms ({:.1} tokens/s)",
        load_time.as_secs_f64(),
        prompt_ids.len(),
        prefill.as_secs_f64() * 1e3,
        prompt_ids.len() as f64 / prefill.as_secs_f64().max(1e-9),
        generated.saturating_sub(1),
        decode.as_secs_f64() * 1e3,
        generated.saturating_sub(1) as f64 / decode.as_secs_f64().max(1e-9),
    );
    Ok(())
}
