//! vLLM's `POST /tokenize` and `POST /detokenize`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::chat::chat_prompt;
use super::generate::{body_bytes, tokens_text};
use super::request::{ChatRequest, DetokenizeRequest, TokenizeRequest, from_body, parse_json};
use crate::serving::error::ApiError;
use crate::serving::state::AppState;

/// `POST /tokenize` (vLLM's): a completions `prompt` (a string) or chat `messages` (through the
/// chat template, with the model's `tools` rendering) as the model's token ids, with their
/// count and the model's `max_model_len`; `return_token_strs` adds each token's text.
pub async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    tokenize_request(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn tokenize_request(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = parse_json(&body_bytes(&state, body)?)?;
    let request: TokenizeRequest = from_body(&body)?;
    let served = state.models.get(&request.model)?;
    let tokens = match (&request.prompt, body.get("messages")) {
        (Some(prompt), None) => {
            let tokenizer = &served.worker.tokenizer;
            if request.add_special_tokens.unwrap_or(true) {
                tokenizer.encode(prompt).map_err(|e| ApiError::internal(format!("{e:#}")))?
            } else {
                let encoding = tokenizer
                    .tokenizer
                    .inner()
                    .encode(prompt.as_str(), false)
                    .map_err(|e| ApiError::internal(e.to_string()))?;
                encoding.get_ids().to_vec()
            }
        }
        (None, Some(_)) => {
            let chat: ChatRequest = from_body(&body)?;
            chat_prompt(&served, &chat, request.add_generation_prompt.unwrap_or(true))?
        }
        _ => return Err(ApiError::invalid("prompt", "give exactly one of `prompt` (a string) and `messages`")),
    };
    let token_strs = request.return_token_strs.then(|| {
        let table = served.worker.tokenizer.tokenizer.table();
        tokens.iter().map(|&t| String::from_utf8_lossy(table.token_bytes(t)).into_owned()).collect::<Vec<_>>()
    });
    Ok(axum::Json(json!({
        "count": tokens.len(), "max_model_len": served.worker.max_model_len, "tokens": tokens, "token_strs": token_strs,
    }))
    .into_response())
}

/// `POST /detokenize` (vLLM's): token ids back to text, special tokens included.
pub async fn detokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    detokenize_request(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn detokenize_request(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: DetokenizeRequest = from_body(&parse_json(&body_bytes(&state, body)?)?)?;
    let served = state.models.get(&request.model)?;
    let vocab = served.worker.vocab_size;
    if let Some(bad) = request.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid(
            "tokens",
            format!("`tokens` holds {bad}, outside the vocabulary (size {vocab})"),
        ));
    }
    Ok(axum::Json(json!({"prompt": tokens_text(&served, &request.tokens)})).into_response())
}
