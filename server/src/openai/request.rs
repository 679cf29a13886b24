//! OpenAI request bodies, parsed with the path of any field of the wrong type, and turned into
//! engine parameters with range checks that name the field.
//!
//! Unknown fields are ignored (clients send vendor extras), as vLLM does. Accepted extras:
//! vLLM's `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `stop_token_ids`, `prompt_logprobs`,
//! `structured_outputs` and the older `guided_*` fields, and dspark's plugin extension in
//! `response_format` (see [`super::constraint`]).

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use dspark_host::engine::SamplingParams;
use dspark_host::engine::sampler::{AllowedTokens, LogitBias, MAX_TOP_LOGPROBS};

use crate::serving::error::ApiError;

/// Parses a JSON body; a malformed body is a 400 saying so.
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    Ok(value)
}

/// Reads `T` from a parsed body; a missing field or a field of the wrong type names the field
/// (`messages[0].role`).
pub fn from_body<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize::<_, T>(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // A missing field is reported at the object that lacks it.
        let missing = message.strip_prefix("missing field `").and_then(|m| m.split('`').next()).map(str::to_string);
        match (missing, path.as_str()) {
            (Some(field), "." | "") => ApiError::invalid(field.clone(), format!("`{field}` is required")),
            (_, "." | "") => ApiError::bad_request(format!("invalid request body: {message}")),
            _ => ApiError::invalid(path.clone(), format!("`{path}`: {message}")),
        }
    })
}

/// Parses a whole request of type `T` with its sampling fields.
pub fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<(T, Sampling), ApiError> {
    let value = parse_json(body)?;
    Ok((from_body(&value)?, from_body(&value)?))
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and structure fields shared by chat and completions (read from the same body as
/// the endpoint's own fields).
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    /// Most completion tokens (legacy name).
    pub max_tokens: Option<u64>,
    /// Most completion tokens.
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// vLLM: keep the k best tokens (-1 or 0: all).
    pub top_k: Option<i64>,
    /// vLLM: relative probability floor.
    pub min_p: Option<f32>,
    /// Choices to generate.
    pub n: Option<u32>,
    /// Stream with server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Stop string or strings.
    pub stop: Option<Value>,
    /// Seed.
    pub seed: Option<i64>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// vLLM repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// OpenAI: token id (a string) to a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// vLLM: do not stop at EOS.
    #[serde(default)]
    pub ignore_eos: bool,
    /// vLLM: extra stop token ids.
    #[serde(default)]
    pub stop_token_ids: Vec<u32>,
    /// vLLM: the fewest completion tokens before EOS, a stop token id or a stop string may
    /// end the answer.
    pub min_tokens: Option<u64>,
    /// vLLM: the only token ids sampling may choose.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// vLLM: end the text with the stop string that ended it.
    #[serde(default)]
    pub include_stop_str_in_output: bool,
    /// vLLM: leave special tokens (e.g. `<|im_end|>` after `ignore_eos`) out of the text
    /// (default true).
    pub skip_special_tokens: Option<bool>,
    /// vLLM: keep only the prompt's last this many tokens (after the chat template).
    pub truncate_prompt_tokens: Option<u64>,
    /// vLLM: words the answer must not contain (each as the model's tokens would spell it,
    /// with and without a leading space).
    pub bad_words: Option<Vec<String>>,
    /// vLLM: score the prompt's tokens, each with this many best alternatives.
    pub prompt_logprobs: Option<u32>,
    /// Structured output (OpenAI).
    pub response_format: Option<Value>,
    /// vLLM structured outputs.
    pub structured_outputs: Option<Value>,
    /// vLLM (older): a JSON schema.
    pub guided_json: Option<Value>,
    /// vLLM (older): a regular expression.
    pub guided_regex: Option<String>,
    /// vLLM (older): one of these strings.
    pub guided_choice: Option<Vec<String>>,
    /// vLLM (older): a grammar.
    pub guided_grammar: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The served model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Value>,
    /// Return log-probabilities.
    #[serde(default)]
    pub logprobs: bool,
    /// Alternatives per token.
    pub top_logprobs: Option<u32>,
    /// Tools the model may call.
    pub tools: Option<Vec<Value>>,
    /// Tool choice.
    pub tool_choice: Option<Value>,
    /// Whether several tool calls may be made in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The served model name.
    pub model: String,
    /// A string, a list of strings, a list of token ids or a list of those.
    pub prompt: Value,
    /// Alternatives per token (legacy completions take a number).
    pub logprobs: Option<u32>,
    /// Prepend the prompt to the output.
    #[serde(default)]
    pub echo: bool,
    /// Text after the completion (not supported).
    pub suffix: Option<String>,
    /// Candidates to generate and choose `n` from (only `n` itself is supported: every
    /// candidate generated is returned).
    pub best_of: Option<u32>,
}

/// `POST /tokenize` (vLLM's), besides a chat request's fields when it gives `messages`.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    /// The served model name.
    pub model: String,
    /// Text to tokenise as a completions prompt.
    pub prompt: Option<String>,
    /// With `prompt`: add the model's BOS where it wants one (default true).
    pub add_special_tokens: Option<bool>,
    /// With `messages`: open the assistant's turn (default true).
    pub add_generation_prompt: Option<bool>,
    /// Return each token's text too.
    #[serde(default)]
    pub return_token_strs: bool,
}

/// `POST /detokenize` (vLLM's).
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    /// The served model name.
    pub model: String,
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// Engine parameters resolved from a request.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Sampling parameters (seed of choice 0).
    pub sampling: SamplingParams,
    /// Most completion tokens, if limited.
    pub max_tokens: Option<usize>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Choices.
    pub n: usize,
    /// Streaming.
    pub stream: bool,
    /// Usage chunk at the end of a stream.
    pub include_usage: bool,
    /// vLLM's `ignore_eos`.
    pub ignore_eos: bool,
    /// vLLM's `stop_token_ids`.
    pub stop_token_ids: Vec<u32>,
    /// vLLM's `min_tokens` (0 when not given).
    pub min_tokens: usize,
    /// vLLM's `include_stop_str_in_output`.
    pub include_stop_str_in_output: bool,
    /// vLLM's `skip_special_tokens` (true when not given).
    pub skip_special_tokens: bool,
    /// vLLM's `truncate_prompt_tokens`: the most prompt tokens kept, from the end.
    pub truncate_prompt_tokens: Option<usize>,
    /// vLLM's `bad_words`, as given (the handler turns them into token sequences with the
    /// model's tokenizer).
    pub bad_words: Vec<String>,
    /// vLLM's `prompt_logprobs`: alternatives per scored prompt token.
    pub prompt_logprobs: Option<usize>,
}

impl Resolved {
    /// `prompt` cut to its last `truncate_prompt_tokens` tokens (vLLM cuts from the left, so
    /// the end of a conversation, where the assistant's turn opens, is kept).
    pub fn truncate_prompt(&self, mut prompt: Vec<u32>) -> Vec<u32> {
        if let Some(keep) = self.truncate_prompt_tokens
            && prompt.len() > keep
        {
            prompt.drain(..prompt.len() - keep);
        }
        prompt
    }
}

/// Defaults a model entry sets for requests that leave a parameter out.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingDefaults {
    /// Default temperature.
    pub temperature: Option<f32>,
    /// Default top_p.
    pub top_p: Option<f32>,
    /// Default top_k.
    pub top_k: Option<i64>,
    /// Default min_p.
    pub min_p: Option<f32>,
    /// Default max_tokens.
    pub max_tokens: Option<u64>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f32>,
}

/// Most choices per request.
pub const MAX_N: u32 = 16;
/// Most stop strings.
pub const MAX_STOPS: usize = 16;
/// Most `bad_words` entries: each is checked against the output's end at every sampled token.
pub const MAX_BAD_WORDS: usize = 128;

impl Sampling {
    /// Checks ranges and resolves defaults. `logprobs` is the number of alternatives when
    /// log-probabilities are wanted; `vocab` is the model's vocabulary size (for
    /// `logit_bias`).
    pub fn resolve(
        &self,
        logprobs: Option<u32>,
        defaults: &SamplingDefaults,
        vocab: usize,
    ) -> Result<Resolved, ApiError> {
        self.resolve_echo(logprobs, defaults, vocab, false)
    }

    /// [`Self::resolve`] for a completions request: with `echo`, `max_tokens` may be 0 (the
    /// prompt is returned, scored where `logprobs` asks, and nothing is generated; vLLM's
    /// behaviour).
    pub fn resolve_echo(
        &self,
        logprobs: Option<u32>,
        defaults: &SamplingDefaults,
        vocab: usize,
        echo: bool,
    ) -> Result<Resolved, ApiError> {
        let max_tokens = match (self.max_completion_tokens, self.max_tokens, defaults.max_tokens) {
            (Some(m), _, _) => Some(("max_completion_tokens", m)),
            (None, Some(m), _) => Some(("max_tokens", m)),
            (None, None, Some(m)) => Some(("max_tokens", m)),
            _ => None,
        };
        if let Some((field, 0)) = max_tokens
            && !echo
        {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` must be at least 1 (0 is allowed only with `echo` on /v1/completions)"),
            ));
        }
        let n = self.n.unwrap_or(1);
        if n == 0 || n > MAX_N {
            return Err(ApiError::invalid("n", format!("`n` must be between 1 and {MAX_N}, got {n}")));
        }
        if self.stream_options.is_some() && !self.stream {
            // As OpenAI and vLLM answer: the options would be ignored silently otherwise.
            return Err(ApiError::invalid("stream_options", "`stream_options` is only allowed with `stream: true`"));
        }
        if let Some(k) = logprobs
            && k as usize > MAX_TOP_LOGPROBS
        {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
            ));
        }
        if let Some(k) = self.prompt_logprobs
            && k as usize > MAX_TOP_LOGPROBS
        {
            return Err(ApiError::invalid(
                "prompt_logprobs",
                format!("`prompt_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}"),
            ));
        }
        let stop = match &self.stop {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::invalid("stop", "`stop` must be a string or an array of strings"))?,
            Some(_) => return Err(ApiError::invalid("stop", "`stop` must be a string or an array of strings")),
        };
        if stop.len() > MAX_STOPS {
            return Err(ApiError::invalid("stop", format!("`stop` may hold at most {MAX_STOPS} strings")));
        }
        let top_k = self.top_k.or(defaults.top_k).unwrap_or(0);
        if top_k < -1 {
            return Err(ApiError::invalid("top_k", format!("`top_k` must be -1, 0 or positive, got {top_k}")));
        }
        let min_tokens = usize::try_from(self.min_tokens.unwrap_or(0)).unwrap_or(usize::MAX);
        if let Some((field, max)) = max_tokens
            && min_tokens as u64 > max
        {
            return Err(ApiError::invalid(
                "min_tokens",
                format!("`min_tokens` ({min_tokens}) must not exceed `{field}` ({max})"),
            ));
        }
        let bad_words = self.bad_words.clone().unwrap_or_default();
        if bad_words.len() > MAX_BAD_WORDS {
            return Err(ApiError::invalid(
                "bad_words",
                format!("`bad_words` may hold at most {MAX_BAD_WORDS} words, got {}", bad_words.len()),
            ));
        }
        if bad_words.iter().any(|w| w.trim().is_empty()) {
            return Err(ApiError::invalid("bad_words", "`bad_words` entries must not be empty or only whitespace"));
        }
        if self.truncate_prompt_tokens == Some(0) {
            return Err(ApiError::invalid("truncate_prompt_tokens", "`truncate_prompt_tokens` must be at least 1"));
        }
        let logit_bias = self.logit_bias(vocab)?;
        let allowed_tokens = match &self.allowed_token_ids {
            None => None,
            Some(ids) => Some(
                AllowedTokens::new(ids.iter().copied(), vocab)
                    .map_err(|e| ApiError::invalid("allowed_token_ids", e.to_string()))?,
            ),
        };
        let sampling = SamplingParams {
            temperature: self.temperature.or(defaults.temperature).unwrap_or(1.0),
            top_p: self.top_p.or(defaults.top_p).unwrap_or(1.0),
            top_k: top_k.max(0) as usize,
            min_p: self.min_p.or(defaults.min_p).unwrap_or(0.0),
            seed: self.seed.map(|s| s as u64),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.or(defaults.repetition_penalty).unwrap_or(1.0),
            logprobs: logprobs.map(|k| k as usize),
            logit_bias,
            allowed_tokens,
            // Token sequences: filled in with the model's tokenizer when the request is
            // submitted (from `Resolved::bad_words`).
            bad_words: Vec::new(),
        };
        sampling.validate().map_err(|e| {
            let dspark_host::engine::sampler::ParamError::OutOfRange { name, .. } = &e;
            ApiError::invalid(*name, e.to_string())
        })?;
        Ok(Resolved {
            sampling,
            max_tokens: max_tokens.map(|(_, m)| usize::try_from(m).unwrap_or(usize::MAX)),
            stop,
            n: n as usize,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            ignore_eos: self.ignore_eos,
            stop_token_ids: self.stop_token_ids.clone(),
            min_tokens,
            include_stop_str_in_output: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens.unwrap_or(true),
            truncate_prompt_tokens: self.truncate_prompt_tokens.map(|k| usize::try_from(k).unwrap_or(usize::MAX)),
            bad_words,
            prompt_logprobs: self.prompt_logprobs.map(|k| k as usize),
        })
    }

    /// `logit_bias` as OpenAI takes it: an object from token ids, written as strings of
    /// digits, to numbers in [-100, 100]; ids must be in the model's vocabulary. (llama.cpp
    /// also takes text keys and `false`; vLLM and OpenAI do not, and neither does dspark.)
    fn logit_bias(&self, vocab: usize) -> Result<LogitBias, ApiError> {
        let invalid = |message: String| ApiError::invalid("logit_bias", message);
        let Some(map) = &self.logit_bias else { return Ok(LogitBias::default()) };
        let mut entries = Vec::with_capacity(map.len());
        for (key, value) in map {
            // Digits only: `parse` alone would take "+5".
            let digits = key.bytes().all(|b| b.is_ascii_digit());
            let token = key.parse::<u32>().ok().filter(|_| digits).ok_or_else(|| {
                invalid(format!("`logit_bias` keys must be token ids (digits, as strings), got {key:?}"))
            })?;
            let bias = value
                .as_f64()
                .ok_or_else(|| invalid(format!("`logit_bias` for token {token} must be a number, got {value}")))?;
            entries.push((token, bias));
        }
        LogitBias::new(entries, vocab).map_err(|e| invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_errors_name_the_field() {
        let err = parse_body::<ChatRequest>(br#"{"model": "m", "messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("temperature"));
        assert_eq!(err.status.as_u16(), 400);
        let err =
            parse_body::<ChatRequest>(br#"{"model": "m", "messages": [], "stream_options": {"include_usage": 1}}"#)
                .unwrap_err();
        assert_eq!(err.param.as_deref(), Some("stream_options.include_usage"));
        let err = parse_body::<ChatRequest>(br#"{"model": "m"}"#).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert_eq!(err.message, "`messages` is required");
        let err = parse_body::<ChatRequest>(b"{not json").unwrap_err();
        assert!(err.message.starts_with("the request body is not valid JSON"), "{}", err.message);
    }

    #[test]
    fn ranges_are_checked() {
        let (_, sampling) = parse_body::<ChatRequest>(br#"{"model": "m", "messages": [], "top_p": 1.5}"#).unwrap();
        let err = sampling.resolve(None, &SamplingDefaults::default(), 100).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("top_p"));
        assert_eq!(err.message, "`top_p` must be in (0, 1], got 1.5");
        let (_, sampling) = parse_body::<ChatRequest>(br#"{"model": "m", "messages": [], "max_tokens": 0}"#).unwrap();
        let err = sampling.resolve(None, &SamplingDefaults::default(), 100).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("max_tokens"));
    }

    #[test]
    fn logit_bias_takes_token_ids_within_the_vocabulary() {
        let resolve = |bias: &str| {
            let body = format!(r#"{{"model": "m", "messages": [], "logit_bias": {bias}}}"#);
            let (_, sampling) = parse_body::<ChatRequest>(body.as_bytes())?;
            sampling.resolve(None, &SamplingDefaults::default(), 100)
        };
        let ok = resolve(r#"{"7": -100, "3": 2.5, "0": 100}"#).unwrap();
        assert_eq!(ok.sampling.logit_bias.entries(), &[(0, 100.0), (3, 2.5), (7, -100.0)]);
        assert!(resolve("null").unwrap().sampling.logit_bias.is_empty());
        let message = |bias: &str| {
            let err = resolve(bias).unwrap_err();
            assert_eq!((err.status.as_u16(), err.param.as_deref()), (400, Some("logit_bias")), "{bias}");
            err.message
        };
        assert_eq!(message(r#"{"100": 1}"#), "`logit_bias` names token 100, outside the vocabulary (ids 0 to 99)");
        assert_eq!(message(r#"{"5": 101}"#), "`logit_bias` for token 5 must be between -100 and 100, got 101");
        assert_eq!(message(r#"{"5": "up"}"#), "`logit_bias` for token 5 must be a number, got \"up\"");
        assert_eq!(
            message(r#"{"hello": 1}"#),
            "`logit_bias` keys must be token ids (digits, as strings), got \"hello\""
        );
        assert_eq!(message(r#"{"+5": 1}"#), "`logit_bias` keys must be token ids (digits, as strings), got \"+5\"");
        assert!(message("[1, 2]").starts_with("`logit_bias`: invalid type"));
    }

    #[test]
    fn min_tokens_allowed_token_ids_and_included_stops_are_read_and_checked() {
        let resolve = |fields: &str| {
            let body = format!(r#"{{"model": "m", "messages": [], {fields}}}"#);
            let (_, sampling) = parse_body::<ChatRequest>(body.as_bytes())?;
            sampling.resolve(None, &SamplingDefaults::default(), 100)
        };
        let ok = resolve(
            r#""min_tokens": 5, "max_tokens": 5, "allowed_token_ids": [9, 2, 9], "include_stop_str_in_output": true"#,
        )
        .unwrap();
        assert_eq!(ok.min_tokens, 5);
        assert_eq!(ok.sampling.allowed_tokens.as_ref().map(|a| a.ids().to_vec()), Some(vec![2, 9]));
        assert!(ok.include_stop_str_in_output);
        let plain = resolve(r#""n": 1"#).unwrap();
        assert_eq!(
            (plain.min_tokens, plain.sampling.allowed_tokens, plain.include_stop_str_in_output),
            (0, None, false)
        );
        let error = |fields: &str| {
            let err = resolve(fields).unwrap_err();
            (err.status.as_u16(), err.param.unwrap_or_default(), err.message)
        };
        assert_eq!(
            error(r#""min_tokens": 6, "max_completion_tokens": 5"#),
            (400, "min_tokens".into(), "`min_tokens` (6) must not exceed `max_completion_tokens` (5)".into())
        );
        assert_eq!(
            error(r#""allowed_token_ids": [3, 100]"#),
            (
                400,
                "allowed_token_ids".into(),
                "`allowed_token_ids` names token 100, outside the vocabulary (ids 0 to 99)".into()
            )
        );
        assert_eq!(
            error(r#""allowed_token_ids": []"#),
            (400, "allowed_token_ids".into(), "`allowed_token_ids` must name at least one token".into())
        );
        assert_eq!(error(r#""min_tokens": -1"#).1, "min_tokens");
        assert_eq!(
            error(r#""bad_words": ["ok", " "]"#),
            (400, "bad_words".into(), "`bad_words` entries must not be empty or only whitespace".into())
        );
        let many = format!(r#""bad_words": [{}]"#, vec![r#""w""#; MAX_BAD_WORDS + 1].join(", "));
        assert_eq!(error(&many).2, format!("`bad_words` may hold at most {MAX_BAD_WORDS} words, got 129"));
        assert_eq!(
            error(r#""truncate_prompt_tokens": 0"#),
            (400, "truncate_prompt_tokens".into(), "`truncate_prompt_tokens` must be at least 1".into())
        );
    }

    #[test]
    fn prompts_are_truncated_from_the_left_and_special_tokens_skipped_by_default() {
        let resolve = |fields: &str| {
            let body = format!(r#"{{"model": "m", "messages": [], {fields}}}"#);
            let (_, sampling) = parse_body::<ChatRequest>(body.as_bytes()).unwrap();
            sampling.resolve(None, &SamplingDefaults::default(), 100).unwrap()
        };
        let r = resolve(r#""truncate_prompt_tokens": 3"#);
        assert_eq!(r.truncate_prompt(vec![1, 2, 3, 4, 5]), vec![3, 4, 5]);
        assert_eq!(r.truncate_prompt(vec![1, 2]), vec![1, 2]);
        assert!(r.skip_special_tokens);
        let r = resolve(r#""skip_special_tokens": false"#);
        assert_eq!(r.truncate_prompt(vec![1, 2, 3, 4, 5]), vec![1, 2, 3, 4, 5]);
        assert!(!r.skip_special_tokens);
    }
}
