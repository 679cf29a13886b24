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
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::trace::TraceLayer;

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
        .route_layer(middleware::from_fn_with_state(state.clone(), read_body_in_time))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key))
        .route_layer(middleware::from_fn_with_state(state.clone(), refuse_while_draining));
    // vLLM leaves /metrics open for scrapers; `--metrics-require-key` puts it behind the key.
    let mut metrics = Router::new().route("/metrics", get(info::metrics));
    if state.metrics_require_key {
        metrics = metrics.route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    }
    let router = Router::new()
        .merge(v1)
        .merge(metrics)
        .route("/health", get(info::health))
        .route("/health/live", get(info::live))
        .route("/health/ready", get(info::ready))
        .layer(DefaultBodyLimit::max(state.body_limit))
        // A handler that panics answers a 500 in the OpenAI shape; the server goes on.
        .layer(CatchPanicLayer::custom(|panic: Box<dyn std::any::Any + Send>| {
            let message = crate::serving::models::panic_message(&panic);
            tracing::error!("a request handler panicked: {message}");
            ApiError::internal(format!("the server failed on this request: {message}")).into_response()
        }))
        .layer(TraceLayer::new_for_http());
    let router = match cors(&state.cors_origins) {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.with_state(state)
}

/// The CORS policy of `--cors-allow-origin` (none when no origin is given).
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| header::HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([axum::http::Method::GET, axum::http::Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE]),
    )
}

/// Reads the whole request body within the body timeout (408 after it) and the body limit
/// (413): a client that trickles its body cannot hold a handler.
async fn read_body_in_time(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    match tokio::time::timeout(state.body_timeout, axum::body::to_bytes(body, state.body_limit)).await {
        Err(_) => {
            ApiError::timeout(format!("the request body did not arrive within {} s", state.body_timeout.as_secs_f64()))
                .into_response()
        }
        Ok(Err(e)) => {
            let over_limit = std::error::Error::source(&e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
            if over_limit {
                ApiError::too_large(state.body_limit).into_response()
            } else {
                ApiError::bad_request(format!("cannot read the request body: {e}")).into_response()
            }
        }
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await,
    }
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
