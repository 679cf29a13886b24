//! The OpenAI API (with vLLM's extensions): routes, request fields, and responses.
//!
//! Routes: `POST /v1/chat/completions` ([`chat`]), `POST /v1/completions` ([`completions`]),
//! `GET /v1/models`, `GET /v1/plugins`, `GET /health`, `GET /health/live`, `GET /health/ready`,
//! `GET /metrics` ([`info`]), and vLLM's
//! `POST /tokenize` and `POST /detokenize` ([`tokenize`]). With an API key, every model route
//! requires `Authorization: Bearer KEY` with one of the keys ([`crate::serving::auth`]; 401
//! otherwise); the health probes stay open, and `/metrics` too unless `--metrics-require-key`.
//!
//! Data flow: a handler reads the body ([`request`]: typed fields, OpenAI error bodies naming
//! the field), turns the structure fields and tools into one host constraint request
//! ([`constraint`], [`tools`]), hands the choices to the entry's engine thread
//! ([`generate`]), and renders the events as one JSON answer or as SSE chunks ([`stream`]).
//! Nothing here knows about plugins, masks or the path tree: that is the host's constraint
//! runtime.

pub mod chat;
pub mod completions;
pub mod constraint;
pub mod generate;
pub mod info;
pub mod request;
pub mod stream;
pub mod tokenize;
pub mod tools;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::serving::auth::Verdict;
use crate::serving::error::ApiError;
use crate::serving::state::AppState;

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    let v1 = Router::new()
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/models", get(info::models))
        .route("/v1/plugins", get(info::plugins))
        // vLLM serves these beside /v1; here they take the API key like the model routes.
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), refuse_while_draining));
    // vLLM leaves /metrics open for scrapers; `--metrics-require-key` puts it behind the key.
    let mut metrics = Router::new().route("/metrics", get(info::metrics));
    if state.metrics_require_key {
        metrics = metrics.route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    }
    Router::new()
        .merge(v1)
        .merge(metrics)
        .route("/health", get(info::health))
        .route("/health/live", get(info::live))
        .route("/health/ready", get(info::ready))
        .layer(DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}

/// A request that arrives while the server drains (on a connection already open) is refused
/// with a 503 the client can retry elsewhere.
async fn refuse_while_draining(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.lifecycle.draining() {
        return ApiError::shutting_down().into_response();
    }
    next.run(request).await
}

async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let given = request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match state.api_keys.check(given) {
        Verdict::Allowed => next.run(request).await,
        Verdict::Wrong => ApiError::unauthorized("Incorrect API key provided.").into_response(),
        Verdict::Missing => {
            ApiError::unauthorized("Missing API key: send `Authorization: Bearer <key>`.").into_response()
        }
    }
}
