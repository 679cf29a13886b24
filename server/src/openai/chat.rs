//! `POST /v1/chat/completions`: messages through the model's chat template, tools and
//! `tool_choice`, structured output, streamed or not.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use dspark_host::engine::FinishReason;
use serde_json::{Value, json};

use super::constraint::{self};
use super::generate::{
    bad_word_tokens, body_bytes, check_output, collect, constraints, finish_reason, output_validator,
    prompt_logprobs_json, request_id, stop_reason, submit, token_logprobs, unix_now, usage,
};
use super::request::{ChatRequest, parse_body};
use super::stream::{StreamHead, stream_response};
use super::tools;
use crate::serving::error::ApiError;
use crate::serving::models::Served;
use crate::serving::state::AppState;

/// Flattens OpenAI message content (a string, or text parts) and checks roles.
pub(super) fn normalise_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` must hold at least one message"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let Value::Object(map) = m else {
                return Err(ApiError::invalid(format!("messages[{i}]"), format!("`messages[{i}]` must be an object")));
            };
            let role = map.get("role").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(format!("messages[{i}].role"), format!("`messages[{i}].role` must be a string"))
            })?;
            if !matches!(role, "system" | "developer" | "user" | "assistant" | "tool") {
                return Err(ApiError::invalid(
                    format!("messages[{i}].role"),
                    format!("`messages[{i}].role` `{role}` is not one of system, developer, user, assistant, tool"),
                ));
            }
            let content = match map.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text"), Some(t)) => Ok(t.to_string()),
                        _ => Err(ApiError::invalid(
                            format!("messages[{i}].content"),
                            format!("`messages[{i}].content` parts must be text parts ({{\"type\": \"text\", \"text\": ...}})"),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .join(""),
                Some(_) => {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].content"),
                        format!("`messages[{i}].content` must be a string or an array of text parts"),
                    ));
                }
            };
            let mut out = map.clone();
            out.insert("role".into(), Value::String(if role == "developer" { "system".into() } else { role.into() }));
            out.insert("content".into(), Value::String(content));
            Ok(Value::Object(out))
        })
        .collect()
}

/// The prompt tokens of a chat request; `add_generation_prompt` opens the assistant's turn
/// (as a chat completion always does).
pub(super) fn chat_prompt(
    served: &Served,
    request: &ChatRequest,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let messages = tools::prepare_messages(served, normalise_messages(&request.messages)?, request.tools.as_deref());
    let tokenizer = &served.worker.tokenizer;
    let template = match &served.chat_template {
        Some(Ok(t)) => t,
        Some(Err(e)) => return Err(ApiError::internal(format!("the model's chat template does not compile: {e}"))),
        None => {
            return Err(ApiError::bad_request(format!(
                "model `{}` has no chat template; use /v1/completions",
                served.entry.name
            )));
        }
    };
    let tools = request.tools.as_deref();
    let text = template
        .render(&messages, tools, add_generation_prompt)
        .map_err(|e| ApiError::invalid("messages", format!("the chat template rejected the conversation: {e:#}")))?;
    // The template already wrote BOS where the model wants it.
    let ids =
        tokenizer.tokenizer.inner().encode(text.as_str(), false).map_err(|e| ApiError::internal(e.to_string()))?;
    Ok(ids.get_ids().to_vec())
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    chat(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

pub(super) async fn chat(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let (request, sampling): (ChatRequest, _) = parse_body(&body)?;
    let served = state.models.get(&request.model)?;
    let logprobs = request.logprobs.then(|| request.top_logprobs.unwrap_or(0));
    let resolved = sampling.resolve(logprobs, &served.entry.config.sampling, served.worker.vocab_size)?;
    let mut spec = constraint::from_request(&sampling)?;
    let tool_plan = match tools::plan(
        &served,
        request.tools.as_deref(),
        request.tool_choice.as_ref(),
        request.parallel_tool_calls,
        spec.as_ref(),
    )? {
        Some((plan, tool_spec)) => {
            if tool_spec.is_some() {
                spec = tool_spec;
            }
            Some(Arc::new(plan)).filter(|p| p.parse)
        }
        None => None,
    };
    let prompt = resolved.truncate_prompt(chat_prompt(&served, &request, true)?);
    if resolved.stream && resolved.prompt_logprobs.is_some() {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            "`prompt_logprobs` is not supported with `stream` on /v1/chat/completions; use /v1/completions or a non-streaming request",
        ));
    }
    let scored_prompt = resolved.prompt_logprobs.map(|_| prompt.clone());
    let id = request_id("chatcmpl");
    tracing::info!(request_id = %id, model = %request.model, prompt_tokens = prompt.len(), n = resolved.n, stream = resolved.stream, constraint = ?spec.as_ref().map(|s| s.kind()), "chat completion");
    // Room in the queue first, then the (possibly costly) constraints.
    let mut reservation = served.worker.reserve(resolved.n, "n")?;
    let constraints = constraints(&state, &served, &spec, resolved.n).await?;
    let validator = output_validator(&spec);
    let prompt_tokens = prompt.len();
    let bad_words = bad_word_tokens(&served, &resolved.bad_words)?;
    let tickets =
        submit(&served, &mut reservation, prompt, &resolved, &bad_words, constraints, resolved.prompt_logprobs).await?;
    let created = unix_now();
    if resolved.stream {
        let head = StreamHead {
            served,
            validator,
            id,
            object: "chat.completion.chunk",
            created,
            model: request.model,
            prompt_tokens,
            include_usage: resolved.include_usage,
            lifecycle: state.lifecycle.clone(),
        };
        let opening = (0..resolved.n)
            .map(|index| json!({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}))
            .collect();
        let want_logprobs = resolved.sampling.logprobs.is_some();
        let mut tool_streams: Vec<tools::ToolStream> = (0..resolved.n).map(|_| Default::default()).collect();
        return Ok(stream_response(head, tickets, opening, move |served, index, update| {
            let mut choices = Vec::new();
            let mut logprobs = want_logprobs.then(|| json!({"content": token_logprobs(served, &update.tokens)}));
            let mut called = false;
            match &tool_plan {
                Some(plan) => {
                    let stream = &mut tool_streams[index];
                    for delta in stream.push(plan, &update.text, update.finish.is_some()) {
                        choices.push(
                            json!({"index": index, "delta": delta, "logprobs": logprobs.take(), "finish_reason": null}),
                        );
                    }
                    if logprobs.is_some() && !update.tokens.is_empty() {
                        choices.push(json!({"index": index, "delta": {}, "logprobs": logprobs, "finish_reason": null}));
                    }
                    if update.finish.is_some() {
                        let calls = stream.calls(plan);
                        plan.check(served, &calls);
                        called = !calls.is_empty();
                    }
                }
                None => {
                    if !update.text.is_empty() || logprobs.is_some() && !update.tokens.is_empty() {
                        choices.push(json!({"index": index, "delta": {"content": update.text}, "logprobs": logprobs, "finish_reason": null}));
                    }
                }
            }
            if let Some(finish) = &update.finish {
                let reason = if called && *finish == FinishReason::Stop { "tool_calls" } else { finish_reason(finish) };
                let stop = stop_reason(update.stop_reason.as_ref());
                choices.push(json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": reason, "stop_reason": stop}));
            }
            choices
        }));
    }
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    let mut prompt_logprobs = Value::Null;
    for (index, ticket) in tickets.into_iter().enumerate() {
        let out = collect(ticket, &state.lifecycle).await?;
        check_output(&served, validator.as_deref(), &out.text, &out.finish);
        completion_tokens += out.tokens.len();
        if let (0, Some(prompt), Some(top)) = (index, &scored_prompt, resolved.prompt_logprobs) {
            prompt_logprobs = prompt_logprobs_json(&served, prompt, &out.prompt_logprobs, top);
        }
        let logprobs = resolved.sampling.logprobs.map(|_| json!({"content": token_logprobs(&served, &out.tokens)}));
        let (message, reason) = match &tool_plan {
            Some(plan) => {
                let (content, calls) = plan.finish(&served, &out.text);
                if calls.is_empty() {
                    (json!({"role": "assistant", "content": content}), finish_reason(&out.finish))
                } else {
                    let reason =
                        if out.finish == FinishReason::Stop { "tool_calls" } else { finish_reason(&out.finish) };
                    (
                        json!({"role": "assistant", "content": content, "tool_calls": tools::tool_calls_json(&calls)}),
                        reason,
                    )
                }
            }
            None => (json!({"role": "assistant", "content": out.text}), finish_reason(&out.finish)),
        };
        let stop = stop_reason(out.stop_reason.as_ref());
        choices.push(
            json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": reason, "stop_reason": stop}),
        );
    }
    tracing::info!(request_id = %id, completion_tokens, finish = ?choices.iter().map(|c| c["finish_reason"].clone()).collect::<Vec<_>>(), "chat completion done");
    let mut body = json!({
        "id": id, "object": "chat.completion", "created": created, "model": request.model,
        "choices": choices, "usage": usage(prompt_tokens, completion_tokens),
    });
    // vLLM's place for a chat request's prompt scores: beside the choices (they share the
    // prompt).
    if scored_prompt.is_some() {
        body["prompt_logprobs"] = prompt_logprobs;
    }
    Ok(axum::Json(body).into_response())
}
