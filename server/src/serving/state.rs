//! The state every HTTP handler shares.

use std::sync::Arc;

use dspark_host::plugin::registry::Registry;

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
    /// Required bearer token, if any.
    pub api_key: Option<String>,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Draining and shutdown.
    pub lifecycle: Arc<Lifecycle>,
}
