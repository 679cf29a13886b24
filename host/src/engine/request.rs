//! A request as the engine takes it ([`GenerationRequest`]), why it may be refused
//! ([`RequestError`]), and what each step reports per sequence ([`SequenceUpdate`]).

use thiserror::Error;

use super::constraint::SequenceConstraint;
use super::sampler::{ParamError, SamplingParams, Scored};
use super::scheduler::SeqId;

/// A generation request.
pub struct GenerationRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling parameters.
    pub sampling: SamplingParams,
    /// Most generated tokens (forced ones included); `None` runs to `max_model_len`.
    pub max_tokens: Option<usize>,
    /// Stop strings (not included in the text unless `include_stop_str_in_output`).
    pub stop: Vec<String>,
    /// vLLM's `include_stop_str_in_output`: the text ends with the stop string that ended it.
    pub include_stop_str_in_output: bool,
    /// Extra token ids that end generation.
    pub stop_token_ids: Vec<u32>,
    /// Keep going past EOS.
    pub ignore_eos: bool,
    /// vLLM's `min_tokens`: until this many tokens are generated, EOS and `stop_token_ids`
    /// are not sampled and stop strings are not looked for. A constraint's end still ends
    /// the output (see [`super::sampler`]).
    pub min_tokens: usize,
    /// vLLM's `skip_special_tokens`: special tokens (other than the EOS or stop token that
    /// ends the output) add nothing to the text. The tokens themselves are returned either way.
    pub skip_special_tokens: bool,
    /// The output constraint, if any.
    pub constraint: Option<Box<dyn SequenceConstraint>>,
    /// Score the prompt: each prompt token after the first gets its log-probability given
    /// the tokens before it, its rank, and this many best alternatives
    /// ([`SequenceUpdate::prompt_logprobs`]). With it, `max_tokens` may be 0.
    pub prompt_logprobs: Option<usize>,
}

impl GenerationRequest {
    /// An unconstrained request with default sampling.
    pub fn new(prompt: Vec<u32>) -> Self {
        Self {
            prompt,
            sampling: SamplingParams::default(),
            max_tokens: None,
            stop: Vec::new(),
            include_stop_str_in_output: false,
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            min_tokens: 0,
            skip_special_tokens: true,
            constraint: None,
            prompt_logprobs: None,
        }
    }
}

/// Why a request was refused.
#[derive(Debug, Error)]
pub enum RequestError {
    /// The prompt leaves no room for output.
    #[error(
        "this model's maximum context length is {max_model_len} tokens, but the prompt has {prompt_tokens} tokens; \
         shorten the prompt (at least one token must be left for the output)"
    )]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The limit.
        max_model_len: usize,
    },
    /// No prompt tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A sampling parameter is out of range.
    #[error(transparent)]
    Params(#[from] ParamError),
    /// `max_tokens` is 0 and the prompt is not scored.
    #[error("`max_tokens` must be at least 1")]
    ZeroMaxTokens,
    /// `min_tokens` is above `max_tokens`.
    #[error("`min_tokens` ({min_tokens}) must not exceed `max_tokens` ({max_tokens})")]
    MinAboveMax {
        /// The `min_tokens` given.
        min_tokens: usize,
        /// The `max_tokens` given.
        max_tokens: usize,
    },
    /// The constraint failed before generation.
    #[error("the constraint failed to start: {0}")]
    Constraint(String),
}

/// Why a sequence ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS, a stop token, a stop string, or the constraint's end.
    Stop,
    /// `max_tokens` or `max_model_len`.
    Length,
    /// The constraint or the sampler failed; the message says why.
    Error(String),
}

/// One generated token.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenOutput {
    /// The token id.
    pub token: u32,
    /// Appended by the constraint without sampling.
    pub forced: bool,
    /// Log-probability, when requested (forced tokens have none).
    pub logprob: Option<f32>,
    /// Best alternatives, when requested.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// What one step produced for one sequence.
#[derive(Clone, Debug, PartialEq)]
pub struct SequenceUpdate {
    /// The sequence.
    pub id: SeqId,
    /// New tokens (a sampled one, then any forced span).
    pub tokens: Vec<TokenOutput>,
    /// New text (held back where a stop string might be starting).
    pub text: String,
    /// Set on the sequence's last update.
    pub finish: Option<FinishReason>,
    /// With a [`FinishReason::Stop`]: the stop string or `stop_token_ids` entry that ended
    /// the output (vLLM's `stop_reason`); `None` for EOS and a constraint's end.
    pub stop_reason: Option<StopReason>,
    /// With [`GenerationRequest::prompt_logprobs`], in the sequence's first update: the
    /// scores of prompt tokens 1, 2, ... (the first token has none); empty otherwise.
    pub prompt_logprobs: Vec<Scored>,
}

/// What ended an output with [`FinishReason::Stop`], where the request named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A token of the request's `stop_token_ids`.
    Token(u32),
    /// One of the request's stop strings.
    Text(String),
}
