//! The HTTP handlers: chat and text completions (plain and streaming), models, plugins,
//! health and metrics.
//!
//! Prompt scoring follows vLLM: `echo` (completions only) puts the prompt, as the model's
//! tokens spell it after any truncation, before the generated text, and in a stream into the
//! choice's first chunk; its tokens lead the legacy `logprobs`, each scored token listing
//! itself among its `top_logprobs` (lm-evaluation-harness's greedy test compares a token's
//! log-probability with the best of that object). `prompt_logprobs` is a per-choice field on
//! completions (in a stream, on the choice's first chunk) and a top-level one on chat, which
//! does not stream it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use dspark_host::engine::sampler::Scored;
use dspark_host::engine::{
    FinishReason, GenerationRequest, SequenceConstraint, SequenceUpdate, StopReason, TokenOutput,
};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::AppState;
use super::api::{
    ChatRequest, CompletionRequest, DetokenizeRequest, Resolved, TokenizeRequest, from_body, parse_body, parse_json,
};
use super::constraint::{self, ConstraintSpec};
use super::error::ApiError;
use super::models::Served;
use super::tools;
use super::worker::{Event, Ticket};

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}-{:016x}{:04x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(state.body_limit)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {rejection}"))
        }
    })
}

/// `GET /health`.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    let ready = state.models.all_ready();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(json!({"status": if ready { "ok" } else { "loading" }}))).into_response()
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

/// Flattens OpenAI message content (a string, or text parts) and checks roles.
fn normalise_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
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
fn chat_prompt(served: &Served, request: &ChatRequest, add_generation_prompt: bool) -> Result<Vec<u32>, ApiError> {
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

/// Builds the constraints of `n` choices (blocking plugin compilation off the async runtime).
async fn constraints(
    state: &Arc<AppState>,
    served: &Arc<Served>,
    spec: &Option<ConstraintSpec>,
    n: usize,
) -> Result<Vec<Option<Box<dyn SequenceConstraint>>>, ApiError> {
    let Some(spec) = spec.clone() else { return Ok((0..n).map(|_| None).collect()) };
    let (state, served) = (state.clone(), served.clone());
    tokio::task::spawn_blocking(move || {
        (0..n)
            .map(|_| {
                let c = constraint::build(
                    &spec,
                    &state.registry,
                    &served.pools,
                    &served.worker.tokenizer,
                    served.worker.metrics.clone(),
                    served.worker.vocab_size,
                    served.entry.config.dspark,
                )?;
                Ok(Some(Box::new(c) as Box<dyn SequenceConstraint>))
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::internal(format!("constraint compilation failed: {e}")))?
}

/// Submits `n` choices for one prompt. `bad_words` are `resolved.bad_words` as token
/// sequences ([`bad_word_tokens`], once per request); `prompt_logprobs`: the prompt is scored,
/// with that many alternatives per token.
async fn submit(
    served: &Served,
    prompt: Vec<u32>,
    resolved: &Resolved,
    bad_words: &[Vec<u32>],
    constraints: Vec<Option<Box<dyn SequenceConstraint>>>,
    prompt_logprobs: Option<usize>,
) -> Result<Vec<Ticket>, ApiError> {
    let mut tickets = Vec::with_capacity(constraints.len());
    for (i, constraint) in constraints.into_iter().enumerate() {
        let mut sampling = resolved.sampling.clone();
        sampling.bad_words = bad_words.to_vec();
        sampling.seed = sampling.seed.map(|s| s.wrapping_add(i as u64));
        let request = GenerationRequest {
            prompt: prompt.clone(),
            sampling,
            max_tokens: resolved.max_tokens,
            stop: resolved.stop.clone(),
            include_stop_str_in_output: resolved.include_stop_str_in_output,
            stop_token_ids: resolved.stop_token_ids.clone(),
            ignore_eos: resolved.ignore_eos,
            min_tokens: resolved.min_tokens,
            skip_special_tokens: resolved.skip_special_tokens,
            constraint,
            prompt_logprobs,
        };
        tickets.push(served.worker.submit(request).await?);
    }
    Ok(tickets)
}

/// `bad_words` as the token sequences that spell them, as vLLM forms them: each word without
/// its leading whitespace, and with one space before it where that tokenises differently (a
/// word inside a sentence usually starts with a space token).
fn bad_word_tokens(served: &Served, words: &[String]) -> Result<Vec<Vec<u32>>, ApiError> {
    let tokenizer = served.worker.tokenizer.tokenizer.inner();
    let mut sequences: Vec<Vec<u32>> = Vec::new();
    for word in words {
        let word = word.trim_start();
        for text in [word.to_string(), format!(" {word}")] {
            let encoding = tokenizer.encode(text.as_str(), false).map_err(|e| ApiError::internal(e.to_string()))?;
            let ids = encoding.get_ids().to_vec();
            if !ids.is_empty() && !sequences.contains(&ids) {
                sequences.push(ids);
            }
        }
    }
    Ok(sequences)
}

/// vLLM's `stop_reason` of a choice: the stop string or the `stop_token_ids` entry that
/// ended it, else `null` (EOS, a constraint's end, a length or an error).
fn stop_reason(reason: Option<&StopReason>) -> Value {
    match reason {
        Some(StopReason::Token(token)) => json!(token),
        Some(StopReason::Text(text)) => json!(text),
        None => Value::Null,
    }
}

fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Error(_) => "error",
    }
}

/// Checks a finished constrained answer and counts a failure (which must never happen).
/// The validator of a request's JSON constraint, compiled once per request.
fn output_validator(spec: &Option<ConstraintSpec>) -> Option<Arc<jsonschema::Validator>> {
    let schema = spec.as_ref()?.validate.as_ref()?;
    // A schema the plugin compiled but the validator cannot is not checked (never observed).
    jsonschema::validator_for(schema).ok().map(Arc::new)
}

fn check_output(served: &Served, validator: Option<&jsonschema::Validator>, text: &str, finish: &FinishReason) {
    let Some(validator) = validator else { return };
    if *finish != FinishReason::Stop {
        return;
    }
    let valid = serde_json::from_str::<Value>(text).is_ok_and(|value| validator.is_valid(&value));
    if !valid {
        served.worker.metrics.validation_failures.add(1);
        tracing::error!(model = %served.entry.name, "a constrained answer finished with stop but does not validate: {text}");
    }
}

/// Token logprob entries in the chat format.
fn token_logprobs(served: &Served, tokens: &[TokenOutput]) -> Vec<Value> {
    let table = served.worker.tokenizer.tokenizer.table();
    let entry = |id: u32, logprob: f32| {
        let bytes = table.token_bytes(id);
        json!({"token": String::from_utf8_lossy(bytes), "logprob": logprob, "bytes": bytes})
    };
    tokens
        .iter()
        .map(|t| {
            // A forced token had no alternative: probability 1.
            let logprob = t.logprob.unwrap_or(0.0);
            let mut e = entry(t.token, logprob);
            let top: Vec<Value> = if t.forced {
                vec![entry(t.token, 0.0)]
            } else {
                t.top_logprobs.iter().map(|&(id, lp)| entry(id, lp)).collect()
            };
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect()
}

struct Collected {
    text: String,
    tokens: Vec<TokenOutput>,
    finish: FinishReason,
    stop_reason: Option<StopReason>,
    prompt_logprobs: Vec<Scored>,
}

async fn collect(mut ticket: Ticket) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut prompt_logprobs = Vec::new();
    while let Some(event) = ticket.events.recv().await {
        match event {
            Event::Update(SequenceUpdate {
                tokens: t, text: delta, finish, stop_reason, prompt_logprobs: p, ..
            }) => {
                text.push_str(&delta);
                tokens.extend(t);
                prompt_logprobs.extend(p);
                if let Some(finish) = finish {
                    return Ok(Collected { text, tokens, finish, stop_reason, prompt_logprobs });
                }
            }
            Event::Failed(message) => return Err(ApiError::internal(message)),
        }
    }
    Err(ApiError::internal("the engine dropped the request"))
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    chat(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn chat(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
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
    tracing::info!(request_id = %id, model = %request.model, prompt_tokens = prompt.len(), n = resolved.n, stream = resolved.stream, constraint = ?spec.as_ref().map(|s| &s.kind), "chat completion");
    let constraints = constraints(&state, &served, &spec, resolved.n).await?;
    let validator = output_validator(&spec);
    let prompt_tokens = prompt.len();
    let bad_words = bad_word_tokens(&served, &resolved.bad_words)?;
    let tickets = submit(&served, prompt, &resolved, &bad_words, constraints, resolved.prompt_logprobs).await?;
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
        let out = collect(ticket).await?;
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

/// Merges the tickets' events into one channel of (choice index, event).
fn merge(tickets: Vec<Ticket>) -> mpsc::UnboundedReceiver<(usize, Event)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (index, mut ticket) in tickets.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(event) = ticket.events.recv().await {
                if tx.send((index, event)).is_err() {
                    // The client left; dropping the ticket cancels the sequence.
                    return;
                }
            }
        });
    }
    rx
}

fn sse(value: &Value) -> Result<SseEvent, std::convert::Infallible> {
    Ok(SseEvent::default().data(value.to_string()))
}

/// What a streamed response needs besides its choices' rendering.
struct StreamHead {
    served: Arc<Served>,
    validator: Option<Arc<jsonschema::Validator>>,
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    prompt_tokens: usize,
    include_usage: bool,
}

/// Streams the tickets' updates as server-sent events: `opening` choices first, then
/// whatever `render` makes of each update, the usage chunk when asked for, and `[DONE]`.
/// Finished answers are checked against their constraint on the way.
fn stream_response<F>(head: StreamHead, tickets: Vec<Ticket>, opening: Vec<Value>, mut render: F) -> Response
where
    F: FnMut(&Served, usize, &SequenceUpdate) -> Vec<Value> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let n = tickets.len();
    let mut events = merge(tickets);
    tokio::spawn(async move {
        let chunk = |choices: Value, usage: Option<Value>| {
            let mut c = json!({"id": head.id, "object": head.object, "created": head.created, "model": head.model, "choices": choices});
            if head.include_usage {
                c["usage"] = usage.unwrap_or(Value::Null);
            }
            c
        };
        for choice in opening {
            if tx.send(sse(&chunk(json!([choice]), None))).is_err() {
                return;
            }
        }
        let mut texts = vec![String::new(); n];
        let mut completion_tokens = 0;
        let mut open = n;
        while open > 0 {
            let Some((index, event)) = events.recv().await else { break };
            let update = match event {
                Event::Update(u) => u,
                Event::Failed(message) => {
                    let _ = tx.send(sse(&ApiError::internal(message).body()));
                    return;
                }
            };
            completion_tokens += update.tokens.len();
            texts[index].push_str(&update.text);
            if let Some(finish) = &update.finish {
                check_output(&head.served, head.validator.as_deref(), &texts[index], finish);
                open -= 1;
            }
            for choice in render(&head.served, index, &update) {
                if tx.send(sse(&chunk(json!([choice]), None))).is_err() {
                    return;
                }
            }
        }
        if head.include_usage {
            let _ = tx.send(sse(&chunk(json!([]), Some(usage(head.prompt_tokens, completion_tokens)))));
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default()).into_response()
}

/// The prompts of a completions request: a string, strings, token ids, or lists of ids.
fn completion_prompts(served: &Served, prompt: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let tokenizer = &served.worker.tokenizer;
    let encode = |text: &str| tokenizer.encode(text).map_err(|e| ApiError::internal(format!("{e:#}")));
    let ids = |items: &[Value]| -> Option<Vec<u32>> {
        items.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())).collect()
    };
    let invalid = || ApiError::invalid("prompt", "`prompt` must be a string, an array of strings, or token ids");
    let prompts = match prompt {
        Value::String(s) => vec![encode(s)?],
        Value::Array(items) if items.is_empty() => return Err(ApiError::invalid("prompt", "`prompt` is empty")),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            items.iter().map(|v| encode(v.as_str().unwrap_or_default())).collect::<Result<_, _>>()?
        }
        Value::Array(items) if items.iter().all(Value::is_number) => vec![ids(items).ok_or_else(invalid)?],
        Value::Array(items) if items.iter().all(Value::is_array) => {
            items.iter().map(|v| v.as_array().and_then(|a| ids(a)).ok_or_else(invalid)).collect::<Result<_, _>>()?
        }
        _ => return Err(invalid()),
    };
    let vocab = served.worker.vocab_size as u32;
    if prompts.iter().flatten().any(|&t| t >= vocab) {
        return Err(ApiError::invalid(
            "prompt",
            format!("`prompt` holds a token id outside the vocabulary (size {vocab})"),
        ));
    }
    Ok(prompts)
}

/// The text of `tokens` as the vocabulary spells them, special tokens included: what `echo`
/// puts before a completion (the prompt as the model read it, after any truncation).
fn tokens_text(served: &Served, tokens: &[u32]) -> String {
    let table = served.worker.tokenizer.tokenizer.table();
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| table.token_bytes(t).iter().copied()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// vLLM's `prompt_logprobs`: `null` for the first prompt token, then for each scored token an
/// object from token ids (as strings) to `{"logprob", "rank", "decoded_token"}`, holding the
/// token itself and its `top` best alternatives.
fn prompt_logprobs_json(served: &Served, prompt: &[u32], scores: &[Scored], top: usize) -> Value {
    let table = served.worker.tokenizer.tokenizer.table();
    let text = |id: u32| String::from_utf8_lossy(table.token_bytes(id)).into_owned();
    let first = prompt.first().map(|_| Value::Null);
    let scored = scores.iter().map(|s| {
        let mut entries = serde_json::Map::new();
        for (rank, &(id, logprob)) in s.top.iter().take(top).enumerate() {
            entries.insert(id.to_string(), json!({"logprob": logprob, "rank": rank + 1, "decoded_token": text(id)}));
        }
        entries
            .insert(s.token.to_string(), json!({"logprob": s.logprob, "rank": s.rank, "decoded_token": text(s.token)}));
        Value::Object(entries)
    });
    Value::Array(first.into_iter().chain(scored).collect())
}

/// Builds a choice's `logprobs` in the legacy completions format: `tokens`, `token_logprobs`,
/// `top_logprobs` (objects from token text to log-probability) and `text_offset` (where each
/// token starts in the choice's text, in characters), across the chunks of a stream.
struct LegacyLogprobs {
    top: usize,
    offset: usize,
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<Value>,
}

impl LegacyLogprobs {
    /// Entries with `top` alternatives each, the first token starting at character `offset`.
    fn new(top: usize, offset: usize) -> Self {
        Self {
            top,
            offset,
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        }
    }

    fn push(&mut self, text: String, logprob: Value, top: Value) {
        self.text_offset.push(json!(self.offset));
        self.offset += text.chars().count();
        self.tokens.push(json!(text));
        self.token_logprobs.push(logprob);
        self.top_logprobs.push(top);
    }

    /// The echoed prompt: its first token has no log-probability (`null`), the rest their
    /// scores, each with its alternatives and itself among them (as vLLM and OpenAI list it).
    fn push_prompt(&mut self, served: &Served, prompt: &[u32], scores: &[Scored]) {
        let table = served.worker.tokenizer.tokenizer.table();
        let text = |id: u32| String::from_utf8_lossy(table.token_bytes(id)).into_owned();
        if let Some(&first) = prompt.first() {
            self.push(text(first), Value::Null, Value::Null);
        }
        for s in scores {
            let mut top: serde_json::Map<String, Value> =
                s.top.iter().take(self.top).map(|&(id, lp)| (text(id), json!(lp))).collect();
            top.insert(text(s.token), json!(s.logprob));
            self.push(text(s.token), json!(s.logprob), Value::Object(top));
        }
    }

    /// Generated tokens; a forced token had no alternative (probability 1).
    fn push_output(&mut self, served: &Served, tokens: &[TokenOutput]) {
        let table = served.worker.tokenizer.tokenizer.table();
        let text = |id: u32| String::from_utf8_lossy(table.token_bytes(id)).into_owned();
        for t in tokens {
            let top: serde_json::Map<String, Value> = if t.forced {
                [(text(t.token), json!(0.0))].into_iter().collect()
            } else {
                t.top_logprobs.iter().map(|&(id, lp)| (text(id), json!(lp))).collect()
            };
            self.push(text(t.token), json!(t.logprob.unwrap_or(0.0)), Value::Object(top));
        }
    }

    /// The entries so far, as JSON; they are cleared, and the offset runs on (a stream's
    /// next chunk).
    fn take(&mut self) -> Value {
        json!({
            "tokens": std::mem::take(&mut self.tokens),
            "token_logprobs": std::mem::take(&mut self.token_logprobs),
            "top_logprobs": std::mem::take(&mut self.top_logprobs),
            "text_offset": std::mem::take(&mut self.text_offset),
        })
    }
}

/// `POST /v1/completions`.
pub async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

/// What a completions request does with its prompts beyond generating after them.
#[derive(Clone, Copy)]
struct PromptUse {
    /// `echo`: the prompt starts each choice's text (and its logprobs, when asked for).
    echo: bool,
    /// Alternatives per token in the legacy `logprobs`, when asked for.
    logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`.
    prompt_logprobs: Option<usize>,
}

impl PromptUse {
    /// The alternatives the engine scores each prompt token with, when it scores them: for
    /// `echo` with `logprobs`, `prompt_logprobs`, and `echo` without generation (the engine
    /// runs a request with nothing to generate only to score its prompt).
    fn scoring(&self, max_tokens: Option<usize>) -> Option<usize> {
        let echoed = self.logprobs.filter(|_| self.echo);
        let only_echo = (self.echo && max_tokens == Some(0)).then_some(0);
        [echoed, self.prompt_logprobs, only_echo].into_iter().flatten().max()
    }
}

async fn complete(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let (request, sampling): (CompletionRequest, _) = parse_body(&body)?;
    let served = state.models.get(&request.model)?;
    if request.suffix.is_some() {
        return Err(ApiError::invalid("suffix", "`suffix` is not supported"));
    }
    // Choosing the best `n` of `best_of` candidates is not built; rather than return `n`
    // plain samples as if it were, refuse (vLLM's V1 engine refuses `best_of` too).
    if let Some(best_of) = request.best_of
        && best_of != sampling.n.unwrap_or(1)
    {
        return Err(ApiError::invalid(
            "best_of",
            format!("`best_of` other than `n` is not supported (got {best_of}); ask for `n` choices instead"),
        ));
    }
    let resolved = sampling.resolve_echo(
        request.logprobs,
        &served.entry.config.sampling,
        served.worker.vocab_size,
        request.echo,
    )?;
    let uses = PromptUse {
        echo: request.echo,
        logprobs: resolved.sampling.logprobs,
        prompt_logprobs: resolved.prompt_logprobs,
    };
    let scoring = uses.scoring(resolved.max_tokens);
    let spec = constraint::from_request(&sampling)?;
    let prompts: Vec<Vec<u32>> =
        completion_prompts(&served, &request.prompt)?.into_iter().map(|p| resolved.truncate_prompt(p)).collect();
    let id = request_id("cmpl");
    tracing::info!(request_id = %id, model = %request.model, prompts = prompts.len(), n = resolved.n, stream = resolved.stream, echo = request.echo, "completion");
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let validator = output_validator(&spec);
    let bad_words = bad_word_tokens(&served, &resolved.bad_words)?;
    let mut tickets = Vec::new();
    for prompt in &prompts {
        let constraints = constraints(&state, &served, &spec, resolved.n).await?;
        tickets.extend(submit(&served, prompt.clone(), &resolved, &bad_words, constraints, scoring).await?);
    }
    // The prompt of choice `index` (choices come `n` to a prompt, in prompt order).
    let n = resolved.n;
    let created = unix_now();
    if resolved.stream {
        let head = StreamHead {
            served,
            validator,
            id,
            object: "text_completion",
            created,
            model: request.model,
            prompt_tokens,
            include_usage: resolved.include_usage,
        };
        // Per choice: its logprobs builder, and whether its first chunk (which carries the
        // echoed prompt and the prompt's scores) was sent.
        let mut logprobs: Vec<Option<LegacyLogprobs>> =
            (0..tickets.len()).map(|_| uses.logprobs.map(|k| LegacyLogprobs::new(k, 0))).collect();
        let mut started = vec![false; tickets.len()];
        return Ok(stream_response(head, tickets, Vec::new(), move |served, index, update| {
            let prompt = &prompts[index / n];
            let mut text = String::new();
            let mut choice = json!({"index": index});
            if !std::mem::replace(&mut started[index], true) {
                if uses.echo {
                    text = tokens_text(served, prompt);
                    if let Some(builder) = logprobs[index].as_mut() {
                        builder.push_prompt(served, prompt, &update.prompt_logprobs);
                    }
                }
                if let Some(top) = uses.prompt_logprobs {
                    choice["prompt_logprobs"] = prompt_logprobs_json(served, prompt, &update.prompt_logprobs, top);
                }
            }
            text.push_str(&update.text);
            let logprobs = logprobs[index].as_mut().map(|builder| {
                builder.push_output(served, &update.tokens);
                builder.take()
            });
            choice["text"] = json!(text);
            choice["logprobs"] = logprobs.unwrap_or(Value::Null);
            choice["finish_reason"] = json!(update.finish.as_ref().map(finish_reason));
            choice["stop_reason"] = stop_reason(update.stop_reason.as_ref());
            vec![choice]
        }));
    }
    let mut choices = Vec::new();
    let mut completion_tokens = 0;
    for (index, ticket) in tickets.into_iter().enumerate() {
        let out = collect(ticket).await?;
        check_output(&served, validator.as_deref(), &out.text, &out.finish);
        completion_tokens += out.tokens.len();
        let prompt = &prompts[index / n];
        let mut text = String::new();
        let mut logprobs = uses.logprobs.map(|k| LegacyLogprobs::new(k, 0));
        if uses.echo {
            text = tokens_text(&served, prompt);
            if let Some(builder) = logprobs.as_mut() {
                builder.push_prompt(&served, prompt, &out.prompt_logprobs);
            }
        }
        text.push_str(&out.text);
        let logprobs = logprobs.map(|mut builder| {
            builder.push_output(&served, &out.tokens);
            builder.take()
        });
        let (finish, stop) = (finish_reason(&out.finish), stop_reason(out.stop_reason.as_ref()));
        let mut choice =
            json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish, "stop_reason": stop});
        if let Some(top) = uses.prompt_logprobs {
            choice["prompt_logprobs"] = prompt_logprobs_json(&served, prompt, &out.prompt_logprobs, top);
        }
        choices.push(choice);
    }
    tracing::info!(request_id = %id, completion_tokens, "completion done");
    Ok(axum::Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": request.model,
        "choices": choices, "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

/// `POST /tokenize` (vLLM's): a completions `prompt` (a string) or chat `messages` (through the
/// chat template, with the model's `tools` rendering) as the model's token ids, with their
/// count and the model's `max_model_len`; `return_token_strs` adds each token's text.
pub async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    tokenize_request(state, body).await.unwrap_or_else(IntoResponse::into_response)
}

async fn tokenize_request(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
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

async fn detokenize_request(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
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
