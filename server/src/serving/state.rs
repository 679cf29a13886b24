//! The state every HTTP handler shares.

use std::sync::Arc;

use dspark_host::plugin::registry::Registry;

use super::auth::ApiKeys;
use super::lifecycle::Lifecycle;
use super::metrics::Metrics;
use super::models::Models;

/// Shared state of the handlers.
pub struct AppState {
    /// The model entries.
    pub models: Arc<Models>,
    /// The plugin registry.
    pub registry: Arc<Registry>,
    /// All series.
    pub metrics: Arc<Metrics>,
    /// The accepted API keys (none: no key required).
    pub api_keys: ApiKeys,
    /// Whether `/metrics` needs a key too.
    pub metrics_require_key: bool,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Time a client has to send a request body.
    pub body_timeout: std::time::Duration,
    /// Origins allowed by CORS (`*`: any); empty: no CORS headers.
    pub cors_origins: Vec<String>,
    /// Constraint compilations allowed at once (each takes a blocking thread and a CPU).
    pub compile_permits: Arc<tokio::sync::Semaphore>,
    /// Draining and shutdown.
    pub lifecycle: Arc<Lifecycle>,
}
