//! The listing and probe endpoints: `GET /v1/models`, `GET /v1/plugins`, `GET /health` and
//! `GET /metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::serving::state::AppState;

/// `GET /health`.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let ready = state.models.all_ready();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(json!({"status": if ready { "ok" } else { "loading" }}))).into_response()
}

/// `GET /health/live`: 200 while every engine thread runs (a liveness probe restarts the
/// process otherwise).
pub async fn live(State(state): State<Arc<AppState>>) -> Response {
    let stopped = state.models.stopped_engines();
    if stopped.is_empty() {
        (StatusCode::OK, axum::Json(json!({"status": "live"}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"status": "engine stopped", "models": stopped})))
            .into_response()
    }
}

/// `GET /health/ready`: 200 when at least one entry serves and the server is not draining (a
/// readiness probe or load balancer sends requests only then).
pub async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let status = if state.lifecycle.draining() {
        "draining"
    } else if state.models.any_ready() {
        "ready"
    } else {
        "not ready"
    };
    let code = if status == "ready" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, axum::Json(json!({"status": status}))).into_response()
}

/// `GET /v1/models`.
pub async fn models(State(state): State<Arc<AppState>>) -> Response {
    axum::Json(json!({"object": "list", "data": state.models.list()})).into_response()
}

/// `GET /v1/plugins`.
pub async fn plugins(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> =
        state.registry.list().into_iter().map(|p| serde_json::to_value(p).unwrap_or(Value::Null)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let strikes: Vec<(String, u32)> = state.registry.list().into_iter().map(|p| (p.name.clone(), p.strikes)).collect();
    ([("content-type", "text/plain; version=0.0.4")], state.metrics.render(&strikes)).into_response()
}
