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
    /// Draining and shutdown.
    pub lifecycle: Arc<Lifecycle>,
}
