//! Serving the model entries: what `dspark serve` starts ([`run`]), the entries and their
//! loading and hot reload ([`models`], [`config`]), one engine thread per entry ([`worker`]),
//! the metrics ([`metrics`]), the state the HTTP handlers share ([`state`]) and the OpenAI
//! error body ([`error`]). The API itself is [`crate::openai`].

pub mod auth;
pub mod config;
pub mod error;
pub mod lifecycle;
pub mod listener;
pub mod metrics;
pub mod models;
pub mod state;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use dspark_host::plugin::registry::Registry;
use dspark_host::plugin::{PluginRuntime, RuntimeConfig};

use self::auth::ApiKeys;
use self::config::{EntryConfig, ModelEntry};
use self::lifecycle::Lifecycle;
use self::metrics::Metrics;
use self::models::Models;
use self::state::AppState;
use crate::openai::router;

/// Everything `dspark serve` needs to start.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Entries from the command line (`--model`).
    pub entries: Vec<ModelEntry>,
    /// A config file of entries, watched for changes.
    pub config: Option<PathBuf>,
    /// The accepted API keys.
    pub api_keys: ApiKeys,
    /// Whether `/metrics` needs a key too.
    pub metrics_require_key: bool,
    /// The plugin registry directory.
    pub plugins_dir: PathBuf,
    /// Plugin runtime state directory.
    pub state_dir: PathBuf,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Keep plugin quarantines recorded by an earlier run (else they are lifted at start).
    pub persist_quarantine: bool,
    /// How long a drain lets requests in flight finish (see [`lifecycle`]).
    pub shutdown_timeout: Duration,
    /// Connection limits and timeouts (see [`listener`]).
    pub limits: listener::Limits,
    /// Origins allowed by CORS (`*` for any); none: no CORS headers.
    pub cors_origins: Vec<String>,
}

/// Default entry settings for `--model`.
pub fn cli_entry(name: String, path: PathBuf, config: EntryConfig) -> ModelEntry {
    ModelEntry { name, path, config }
}

/// Constraint compilations run at once: one per CPU, at least two.
fn compile_concurrency() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()).max(2)
}

/// Starts the server and serves until interrupted.
pub fn run(options: ServeOptions) -> anyhow::Result<()> {
    let runtime = PluginRuntime::new(RuntimeConfig::new(options.state_dir.clone()))?;
    if !options.persist_quarantine {
        let forgotten = runtime.forget_quarantines().context("cannot clear the quarantine records")?;
        if forgotten > 0 {
            tracing::info!(
                forgotten,
                "plugin quarantines of an earlier run were lifted (--persist-quarantine keeps them)"
            );
        }
    }
    let registry = Arc::new(Registry::new(options.plugins_dir.clone(), runtime)?);
    let report = registry.scan();
    for (name, error) in &report.failed {
        tracing::warn!(plugin = %name, "plugin not loaded: {error}");
    }
    let _registry_watch = registry.watch(Duration::from_secs(1), |report| {
        tracing::info!(added = ?report.added, replaced = ?report.replaced, removed = ?report.removed, failed = ?report.failed, "plugin registry changed");
        for name in &report.unquarantined {
            tracing::info!(plugin = %name, "the quarantine was lifted; the plugin serves again");
        }
        for name in &report.kept_previous {
            tracing::warn!(plugin = %name, "the update was refused; the previous version keeps serving (GET /v1/plugins says why)");
        }
    })?;
    let metrics = Arc::new(Metrics::default());
    let models = Models::new(metrics.clone());
    let mut entries = options.entries.clone();
    if let Some(config) = &options.config {
        entries.extend(config::load_file(config)?);
    }
    if entries.is_empty() {
        anyhow::bail!("no model to serve: give --model PATH or --config FILE");
    }
    models.apply(entries, true);
    if let Some(config) = &options.config {
        models.watch(config.clone(), Duration::from_millis(500));
    }
    let state = Arc::new(AppState {
        models,
        registry,
        metrics,
        api_keys: options.api_keys.clone(),
        metrics_require_key: options.metrics_require_key,
        body_limit: options.body_limit,
        body_timeout: options.limits.body_timeout,
        cors_origins: options.cors_origins.clone(),
        lifecycle: Arc::new(Lifecycle::new(options.shutdown_timeout)),
        compile_permits: Arc::new(tokio::sync::Semaphore::new(compile_concurrency())),
    });
    let lifecycle = state.lifecycle.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(options.addr)
            .await
            .with_context(|| format!("cannot listen on {}", options.addr))?;
        let local = listener.local_addr()?;
        if !local.ip().is_loopback() && state.api_keys.is_empty() {
            tracing::warn!(
                "listening on {local}, beyond this machine, without an API key: anyone who reaches it may use the \
                 models (set --api-key or --api-key-file)"
            );
        }
        if state.api_keys.required() {
            tracing::info!(keys = state.api_keys.len(), metrics_require_key = state.metrics_require_key, "API keys required");
        }
        tracing::info!("listening on http://{local}");
        let limits = options.limits;
        listener::serve(listener, router(state), limits, async move {
            let signal = lifecycle::stop_signal().await;
            let grace = lifecycle.grace();
            tracing::info!(signal, grace_s = grace.as_secs_f64(), "draining: no new requests; those in flight may finish");
            lifecycle.begin_drain();
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::time::sleep(grace) => tracing::warn!("the grace period is over: ending the requests still in flight"),
                    signal = lifecycle::stop_signal() => tracing::warn!(signal, "a second signal: ending the requests still in flight"),
                }
                lifecycle.end_in_flight();
            });
        })
        .await
        .context("the server failed")?;
        tracing::info!("every connection is closed; exiting");
        Ok(())
    })
}
