//! Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status a client library maps to the right exception (`BadRequestError`, `NotFoundError`,
//! `AuthenticationError`, `RateLimitError`, ...).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An API error: status, message, and optionally the offending parameter and a code.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong and what to do, for a person.
    pub message: String,
    /// The request field at fault (`messages[0].content`, `response_format.json_schema`).
    pub param: Option<String>,
    /// A stable machine-readable code (`model_not_found`, `invalid_api_key`, ...).
    pub code: Option<&'static str>,
    /// Seconds after which a retry may succeed (503 and 429).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None, retry_after: None }
    }

    /// 400 about field `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self { param: Some(param.into()), ..Self::new(StatusCode::BAD_REQUEST, message) }
    }

    /// 400 not tied to one field.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404 for an unknown model.
    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                format!("The model `{model}` does not exist. GET /v1/models lists the models served."),
            )
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self { code: Some("invalid_api_key"), ..Self::new(StatusCode::UNAUTHORIZED, message) }
    }

    /// 429 when the queue is full.
    pub fn overloaded(message: impl Into<String>) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(1),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, message)
        }
    }

    /// 503 while a model loads.
    pub fn loading(model: &str) -> Self {
        Self {
            code: Some("model_loading"),
            retry_after: Some(2),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, format!("model {model} is loading"))
        }
    }

    /// 503 for a model that failed to load.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            code: Some("model_unavailable"),
            retry_after: Some(10),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 503 for a constraint plugin that cannot serve (quarantined, or failed to load).
    pub fn plugin_unavailable(message: impl Into<String>) -> Self {
        Self {
            code: Some("plugin_unavailable"),
            retry_after: Some(10),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
        }
    }

    /// 503 for a request refused, or ended, because the server is shutting down.
    pub fn shutting_down() -> Self {
        Self {
            code: Some("server_shutting_down"),
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server is shutting down; retry the request (on another replica)",
            )
        }
    }

    /// 408 for a request that did not arrive in time.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::REQUEST_TIMEOUT, message)
    }

    /// 413.
    pub fn too_large(limit: usize) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is larger than the limit of {limit} bytes"))
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// OpenAI's `type` for this status.
    pub fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "service_unavailable_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind(), "param": self.param, "code": self.code}})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after
            && let Ok(value) = HeaderValue::from_str(&seconds.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        response
    }
}
