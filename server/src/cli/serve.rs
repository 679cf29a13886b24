//! `dspark serve`: arguments in the style GPUStack's custom-backend `run_command` passes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use dspark_host::plugin::RuntimeConfig;

use crate::serving::auth::ApiKeys;
use crate::serving::config::{EntryConfig, KvCacheDtype};
use crate::serving::listener::Limits;
use crate::serving::{ServeOptions, cli_entry};

/// The default model, fetched by `scripts/fetch-assets.sh`.
pub const DEFAULT_MODEL: &str = "assets/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Arguments of `dspark serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A GGUF model to serve (default: SmolLM2 from assets/ when no --config is given).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The name clients use in `model` (default: the file name without `.gguf`).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on the model routes (repeatable: any of the keys).
    #[arg(long, env = "DSPARK_API_KEY")]
    api_key: Vec<String>,
    /// A file of accepted API keys, one per line (`#` comments and blank lines ignored).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Put `/metrics` behind the API key too.
    #[arg(long)]
    metrics_require_key: bool,
    /// Sequences running at once (for --model).
    #[arg(long, default_value_t = 16)]
    max_num_seqs: usize,
    /// Longest sequence, prompt plus output (for --model; default: the model's context, at
    /// most 4096).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Turn DSpark off for --model (the classic one-mask-per-step path).
    #[arg(long)]
    no_dspark: bool,
    /// Prompt-lookup draft tokens per step for --model (vLLM's ngram method; 0: off;
    /// default: 2 with DSpark).
    #[arg(long)]
    num_speculative_tokens: Option<usize>,
    /// For --model: rows beyond one per request that constrained requests get per step, in
    /// all, while an unconstrained request is decoding (default 0: their fast-forward chunks
    /// then go a row a step, so unconstrained requests keep their speed on a CPU).
    #[arg(long, default_value_t = 0)]
    extra_rows_beside_unconstrained: usize,
    /// Batch-invariant kernels for --model: greedy answers independent of batching.
    #[arg(long)]
    batch_invariant: bool,
    /// The KV cache's element type for --model: auto (bf16 where the CPU has AVX-512 BF16,
    /// else f16), f16, bf16, f32 or int8.
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto)]
    kv_cache_dtype: KvCacheDtype,
    /// GPUStack-style model entries (YAML, one `kind: Model` document each), reloaded on change.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The plugin registry directory.
    #[arg(long, default_value = "plugins", env = "DSPARK_PLUGINS_DIR")]
    plugins_dir: PathBuf,
    /// Compiled-plugin cache and quarantine records (default: $DSPARK_STATE_DIR, else
    /// ~/.cache/dspark).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Keep plugin quarantines across restarts (by default a new process starts every plugin
    /// afresh; `dspark plugins unquarantine` lifts one at any time).
    #[arg(long)]
    persist_quarantine: bool,
    /// Seconds a SIGTERM or SIGINT lets requests in flight finish before ending them (with an
    /// error event and `[DONE]` for streams); the process then exits 0.
    #[arg(long, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Open connections at most; more wait to be accepted.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds a client has to send a request's head; also the longest an idle keep-alive
    /// connection stays open.
    #[arg(long, default_value_t = 30.0)]
    header_timeout: f64,
    /// Seconds a client has to send a request's body (408 after).
    #[arg(long, default_value_t = 60.0)]
    body_timeout: f64,
    /// Send CORS headers allowing this origin (repeatable; `*` for any). Off by default.
    #[arg(long)]
    cors_allow_origin: Vec<String>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 8 << 20)]
    max_body_bytes: usize,
}

/// `value` seconds of a flag, refused when negative or not a number.
fn seconds(flag: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| anyhow::anyhow!("{flag} {value} is not a number of seconds"))
}

/// Runs `dspark serve`.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let addr: SocketAddr = format!("{}:{}", args.host, args.port)
        .parse()
        .with_context(|| format!("--host {} --port {} is not an address", args.host, args.port))?;
    let model = match (&args.model, &args.config) {
        (Some(m), _) => Some(m.clone()),
        (None, None) => Some(PathBuf::from(DEFAULT_MODEL)),
        (None, Some(_)) => None,
    };
    let mut entries = Vec::new();
    if let Some(path) = model {
        if !path.is_file() {
            bail!("model file {} not found (scripts/fetch-assets.sh fetches the default model)", path.display());
        }
        let name = args.served_model_name.clone().unwrap_or_else(|| {
            path.file_name().map(|f| f.to_string_lossy().trim_end_matches(".gguf").to_string()).unwrap_or_default()
        });
        let config = EntryConfig {
            dspark: !args.no_dspark,
            max_num_seqs: args.max_num_seqs,
            max_model_len: args.max_model_len,
            batch_invariant: args.batch_invariant,
            num_speculative_tokens: args.num_speculative_tokens,
            extra_rows_beside_unconstrained: args.extra_rows_beside_unconstrained,
            kv_cache_dtype: args.kv_cache_dtype,
            ..EntryConfig::default()
        };
        config.validate().context("--model")?;
        entries.push(cli_entry(name, path, config));
    }
    crate::serving::run(ServeOptions {
        addr,
        entries,
        config: args.config,
        api_keys: ApiKeys::new(&args.api_key, args.api_key_file.as_deref())?,
        metrics_require_key: args.metrics_require_key,
        plugins_dir: args.plugins_dir,
        state_dir: match args.state_dir {
            Some(d) => d,
            None => RuntimeConfig::default_state_dir()?,
        },
        body_limit: args.max_body_bytes,
        persist_quarantine: args.persist_quarantine,
        shutdown_timeout: seconds("--shutdown-timeout", args.shutdown_timeout)?,
        limits: Limits {
            max_connections: args.max_connections,
            header_timeout: seconds("--header-timeout", args.header_timeout)?,
            body_timeout: seconds("--body-timeout", args.body_timeout)?,
        },
        cors_origins: args.cors_allow_origin,
    })
}
