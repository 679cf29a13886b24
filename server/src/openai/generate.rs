//! What every completion endpoint shares: reading the body, building the constraints of its
//! choices through the host's constraint runtime, submitting them to the model's engine thread,
//! collecting the events, and the fields of a choice (finish and stop reasons, logprobs, usage)
//! with the check of a finished JSON answer against its schema.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use dspark_host::engine::sampler::Scored;
use dspark_host::engine::{
    FinishReason, GenerationRequest, SequenceConstraint, SequenceUpdate, StopReason, TokenOutput,
};
use serde_json::{Value, json};

use super::constraint::{self, ConstraintSpec};
use super::request::Resolved;
use crate::serving::error::ApiError;
use crate::serving::lifecycle::Lifecycle;
use crate::serving::models::Served;
use crate::serving::state::AppState;
use crate::serving::worker::{Event, Reservation, Ticket};

pub(super) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(super) fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    format!("{prefix}-{:016x}{:04x}", nanos, COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff)
}

pub(super) fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(state.body_limit)
        } else {
            ApiError::bad_request(format!("cannot read the request body: {rejection}"))
        }
    })
}

/// Builds the constraints of `n` choices (blocking plugin compilation off the async runtime).
pub(super) async fn constraints(
    state: &Arc<AppState>,
    served: &Arc<Served>,
    spec: &Option<ConstraintSpec>,
    n: usize,
) -> Result<Vec<Option<Box<dyn SequenceConstraint>>>, ApiError> {
    let Some(spec) = spec.clone() else { return Ok((0..n).map(|_| None).collect()) };
    // At most so many compilations at once; the rest wait their turn here, holding only
    // their place in the queue.
    let permit = state
        .compile_permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ApiError::internal("the compilation limiter is closed"))?;
    let (state, served) = (state.clone(), served.clone());
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        (0..n)
            .map(|_| {
                let built = served
                    .constraints
                    .build(&state.registry, &spec.request)
                    .map_err(|e| constraint::api_error(&spec, e))?;
                if let Some((location, message)) = built.warnings.first() {
                    tracing::warn!(
                        field = %spec.field,
                        warnings = built.warnings.len(),
                        "the constraint is approximated: at `{location}`: {message}"
                    );
                }
                Ok(Some(Box::new(built.constraint) as Box<dyn SequenceConstraint>))
            })
            .collect()
    })
    .await
    .map_err(|e| ApiError::internal(format!("constraint compilation failed: {e}")))?
}

/// Submits `n` choices for one prompt. `bad_words` are `resolved.bad_words` as token
/// sequences ([`bad_word_tokens`], once per request); `prompt_logprobs`: the prompt is scored,
/// with that many alternatives per token.
pub(super) async fn submit(
    served: &Served,
    reservation: &mut Reservation,
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
        tickets.push(served.worker.submit(request, reservation).await?);
    }
    Ok(tickets)
}

/// `bad_words` as the token sequences that spell them, as vLLM forms them: each word without
/// its leading whitespace, and with one space before it where that tokenises differently (a
/// word inside a sentence usually starts with a space token).
pub(super) fn bad_word_tokens(served: &Served, words: &[String]) -> Result<Vec<Vec<u32>>, ApiError> {
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
pub(super) fn stop_reason(reason: Option<&StopReason>) -> Value {
    match reason {
        Some(StopReason::Token(token)) => json!(token),
        Some(StopReason::Text(text)) => json!(text),
        None => Value::Null,
    }
}

pub(super) fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Error(_) => "error",
    }
}

/// Checks a finished constrained answer and counts a failure (which must never happen).
/// The validator of a request's JSON constraint, compiled once per request.
pub(super) fn output_validator(spec: &Option<ConstraintSpec>) -> Option<Arc<jsonschema::Validator>> {
    let schema = spec.as_ref()?.validate.as_ref()?;
    // A schema the plugin compiled but the validator cannot is not checked (never observed).
    jsonschema::validator_for(schema).ok().map(Arc::new)
}

pub(super) fn check_output(
    served: &Served,
    validator: Option<&jsonschema::Validator>,
    text: &str,
    finish: &FinishReason,
) {
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
pub(super) fn token_logprobs(served: &Served, tokens: &[TokenOutput]) -> Vec<Value> {
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

pub(super) struct Collected {
    pub(super) text: String,
    pub(super) tokens: Vec<TokenOutput>,
    pub(super) finish: FinishReason,
    pub(super) stop_reason: Option<StopReason>,
    pub(super) prompt_logprobs: Vec<Scored>,
}

/// Waits for a choice's whole answer; ends it with a 503 when a drain runs out of time.
pub(super) async fn collect(mut ticket: Ticket, lifecycle: &Lifecycle) -> Result<Collected, ApiError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut prompt_logprobs = Vec::new();
    loop {
        let event = tokio::select! {
            biased;
            event = ticket.events.recv() => event,
            _ = lifecycle.in_flight_ended() => return Err(ApiError::shutting_down()),
        };
        let Some(event) = event else { break };
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

pub(super) fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens})
}

/// The text of `tokens` as the vocabulary spells them, special tokens included: what `echo`
/// puts before a completion (the prompt as the model read it, after any truncation).
pub(super) fn tokens_text(served: &Served, tokens: &[u32]) -> String {
    let table = served.worker.tokenizer.tokenizer.table();
    let bytes: Vec<u8> = tokens.iter().flat_map(|&t| table.token_bytes(t).iter().copied()).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// vLLM's `prompt_logprobs`: `null` for the first prompt token, then for each scored token an
/// object from token ids (as strings) to `{"logprob", "rank", "decoded_token"}`, holding the
/// token itself and its `top` best alternatives.
pub(super) fn prompt_logprobs_json(served: &Served, prompt: &[u32], scores: &[Scored], top: usize) -> Value {
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
