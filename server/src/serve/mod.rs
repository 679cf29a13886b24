//! `dspark serve`: the OpenAI-compatible HTTP server.
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`,
//! `GET /v1/plugins`, `GET /health`, `GET /metrics`. With an API key, every `/v1` route
//! requires `Authorization: Bearer KEY` (401 otherwise); `/health` and `/metrics` stay open
//! for probes and scrapers, as in vLLM.
//!
//! Data flow (ARCHITECTURE.md): handler ([`handlers`]) -> request validation ([`api`]) ->
//! constraint resolution ([`constraint`]) -> the model entry's engine thread ([`worker`]) ->
//! events back to the handler -> JSON or SSE. Entries come from `--model` or a config file
//! ([`config`]) and reload when it changes ([`models`]).

pub mod api;
pub mod config;
pub mod constraint;
pub mod error;
pub mod handlers;
pub mod metrics;
pub mod models;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dspark_host::plugin::{PluginRuntime, RuntimeConfig};
use dspark_host::registry::Registry;

use self::config::{EntryConfig, ModelEntry};
use self::error::ApiError;
use self::metrics::Metrics;
use self::models::Models;

/// Shared state of the handlers.
pub struct AppState {
    /// The model entries.
    pub models: Arc<Models>,
    /// The plugin registry.
    pub registry: Arc<Registry>,
    /// All series.
    pub metrics: Arc<Metrics>,
    /// Required bearer token, if any.
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub body_limit: usize,
}

/// Everything `dspark serve` needs to start.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Entries from the command line (`--model`).
    pub entries: Vec<ModelEntry>,
    /// A config file of entries, watched for changes.
    pub config: Option<PathBuf>,
    /// Required bearer token.
    pub api_key: Option<String>,
    /// The plugin registry directory.
    pub plugins_dir: PathBuf,
    /// Plugin runtime state directory.
    pub state_dir: PathBuf,
    /// Largest request body in bytes.
    pub body_limit: usize,
}

/// Default entry settings for `--model`.
pub fn cli_entry(name: String, path: PathBuf, config: EntryConfig) -> ModelEntry {
    ModelEntry { name, path, config }
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(handlers::chat_completions))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/models", get(handlers::models))
        .route("/v1/plugins", get(handlers::plugins))
        // vLLM serves these beside /v1; here they take the API key like the model routes.
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .merge(v1)
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .layer(DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}

async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        match given.and_then(|v| v.strip_prefix("Bearer ")) {
            Some(k) if k.trim() == key => {}
            Some(_) => return ApiError::unauthorized("Incorrect API key provided.").into_response(),
            None => {
                return ApiError::unauthorized("Missing API key: send `Authorization: Bearer <key>`.").into_response();
            }
        }
    }
    next.run(request).await
}

/// Starts the server and serves until interrupted.
pub fn run(options: ServeOptions) -> anyhow::Result<()> {
    let runtime = PluginRuntime::new(RuntimeConfig::new(options.state_dir.clone()))?;
    let registry = Arc::new(Registry::new(options.plugins_dir.clone(), runtime)?);
    let report = registry.scan();
    for (name, error) in &report.failed {
        tracing::warn!(plugin = %name, "plugin not loaded: {error}");
    }
    let _registry_watch = registry.watch(Duration::from_secs(1), |report| {
        tracing::info!(added = ?report.added, replaced = ?report.replaced, removed = ?report.removed, failed = ?report.failed, "plugin registry changed");
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
        api_key: options.api_key.clone(),
        body_limit: options.body_limit,
    });
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(options.addr)
            .await
            .with_context(|| format!("cannot listen on {}", options.addr))?;
        tracing::info!("listening on http://{}", listener.local_addr()?);
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .context("the server failed")
    })
}
