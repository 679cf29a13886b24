//! `POST /v1/completions`: text or token-id prompts, `echo`, legacy `logprobs` and vLLM's
//! `prompt_logprobs` (prompt scoring as lm-evaluation-harness reads it).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use dspark_host::engine::TokenOutput;
use dspark_host::engine::sampler::Scored;
use serde_json::{Value, json};

use super::constraint::{self};
use super::generate::{
    bad_word_tokens, body_bytes, check_output, collect, constraints, finish_reason, output_validator,
    prompt_logprobs_json, request_id, stop_reason, submit, tokens_text, unix_now, usage,
};
use super::request::{CompletionRequest, parse_body};
use super::stream::{StreamHead, stream_response};
use crate::serving::error::ApiError;
use crate::serving::models::Served;
use crate::serving::state::AppState;

/// The most prompts one completions request may batch (each is tokenised before the request
/// takes its room in the queue).
pub(super) const MAX_PROMPTS: usize = 256;

/// The prompts of a completions request: a string, strings, token ids, or lists of ids.
pub(super) fn completion_prompts(served: &Served, prompt: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    if let Value::Array(items) = prompt
        && items.len() > MAX_PROMPTS
        && !items.iter().all(Value::is_number)
    {
        return Err(ApiError::invalid(
            "prompt",
            format!("`prompt` batches {} prompts; at most {MAX_PROMPTS} are accepted per request", items.len()),
        ));
    }
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

/// Builds a choice's `logprobs` in the legacy completions format: `tokens`, `token_logprobs`,
/// `top_logprobs` (objects from token text to log-probability) and `text_offset` (where each
/// token starts in the choice's text, in characters), across the chunks of a stream.
pub(super) struct LegacyLogprobs {
    pub(super) top: usize,
    pub(super) offset: usize,
    pub(super) tokens: Vec<Value>,
    pub(super) token_logprobs: Vec<Value>,
    pub(super) top_logprobs: Vec<Value>,
    pub(super) text_offset: Vec<Value>,
}

impl LegacyLogprobs {
    /// Entries with `top` alternatives each, the first token starting at character `offset`.
    pub(super) fn new(top: usize, offset: usize) -> Self {
        Self {
            top,
            offset,
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        }
    }

    pub(super) fn push(&mut self, text: String, logprob: Value, top: Value) {
        self.text_offset.push(json!(self.offset));
        self.offset += text.chars().count();
        self.tokens.push(json!(text));
        self.token_logprobs.push(logprob);
        self.top_logprobs.push(top);
    }

    /// The echoed prompt: its first token has no log-probability (`null`), the rest their
    /// scores, each with its alternatives and itself among them (as vLLM and OpenAI list it).
    pub(super) fn push_prompt(&mut self, served: &Served, prompt: &[u32], scores: &[Scored]) {
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
    pub(super) fn push_output(&mut self, served: &Served, tokens: &[TokenOutput]) {
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
    pub(super) fn take(&mut self) -> Value {
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
pub(super) struct PromptUse {
    /// `echo`: the prompt starts each choice's text (and its logprobs, when asked for).
    pub(super) echo: bool,
    /// Alternatives per token in the legacy `logprobs`, when asked for.
    pub(super) logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`.
    pub(super) prompt_logprobs: Option<usize>,
}

impl PromptUse {
    /// The alternatives the engine scores each prompt token with, when it scores them: for
    /// `echo` with `logprobs`, `prompt_logprobs`, and `echo` without generation (the engine
    /// runs a request with nothing to generate only to score its prompt).
    pub(super) fn scoring(&self, max_tokens: Option<usize>) -> Option<usize> {
        let echoed = self.logprobs.filter(|_| self.echo);
        let only_echo = (self.echo && max_tokens == Some(0)).then_some(0);
        [echoed, self.prompt_logprobs, only_echo].into_iter().flatten().max()
    }
}

pub(super) async fn complete(state: Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
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
    // Room in the queue for every sequence first, then the (possibly costly) constraints.
    let mut reservation = served.worker.reserve(prompts.len() * resolved.n, "n")?;
    let mut tickets = Vec::new();
    for prompt in &prompts {
        let constraints = constraints(&state, &served, &spec, resolved.n).await?;
        tickets.extend(
            submit(&served, &mut reservation, prompt.clone(), &resolved, &bad_words, constraints, scoring).await?,
        );
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
            lifecycle: state.lifecycle.clone(),
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
        let out = collect(ticket, &state.lifecycle).await?;
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
