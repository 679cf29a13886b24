//! What a request asks of sampling ([`SamplingParams`]), its typed parts (`logit_bias`,
//! `allowed_token_ids`) and the checks of their ranges ([`ParamError`]). The operations that
//! apply them to a row of logits are in the parent module.

use thiserror::Error;

/// How to pick tokens. Defaults are OpenAI's (temperature 1, no truncation, no penalties).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f32,
    /// Nucleus mass in (0, 1].
    pub top_p: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Drop tokens below `min_p` times the most likely one's probability.
    pub min_p: f32,
    /// Seed of this request's random stream; `None` draws one.
    pub seed: Option<u64>,
    /// OpenAI presence penalty in [-2, 2].
    pub presence_penalty: f32,
    /// OpenAI frequency penalty in [-2, 2].
    pub frequency_penalty: f32,
    /// vLLM repetition penalty (> 0, 1 is off).
    pub repetition_penalty: f32,
    /// Return this many alternatives with their log-probabilities (`None`: no logprobs).
    pub logprobs: Option<usize>,
    /// OpenAI's `logit_bias`: added to a token's logit before anything else, sorted by
    /// token id, one entry per token, each bias in [-100, 100] ([`LogitBias::new`]).
    pub logit_bias: LogitBias,
    /// vLLM's `allowed_token_ids`: the only tokens sampling may choose (`None`: all).
    pub allowed_tokens: Option<AllowedTokens>,
    /// vLLM's `bad_words`, as token sequences: the last token of each is not sampled where
    /// the output ends with the others ([`super::bad_word_bans`]).
    pub bad_words: Vec<Vec<u32>>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logprobs: None,
            logit_bias: LogitBias::default(),
            allowed_tokens: None,
            bad_words: Vec::new(),
        }
    }
}

/// The most a `logit_bias` entry may add or take away (OpenAI's range). A bias is finite, so
/// it steers sampling but never overrides a constraint: a token the mask rules out stays out,
/// and a token the mask alone allows is taken whatever its bias, as a forced span is.
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Biases added to chosen tokens' logits (OpenAI's `logit_bias`), sorted by token id with one
/// entry per token, every bias finite and within [`MAX_LOGIT_BIAS`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogitBias(Vec<(u32, f32)>);

/// Why a `logit_bias` map is rejected.
#[derive(Debug, Error, PartialEq)]
pub enum LogitBiasError {
    /// A token id at or past the vocabulary's end.
    #[error("`logit_bias` names token {token}, outside the vocabulary (ids 0 to {})", vocab - 1)]
    OutOfVocabulary {
        /// The token id given.
        token: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
    /// A bias that is not a finite number within the range.
    #[error("`logit_bias` for token {token} must be between -100 and 100, got {bias}")]
    OutOfRange {
        /// The token the bias is for.
        token: u32,
        /// The bias given.
        bias: f64,
    },
}

impl LogitBias {
    /// Checks `entries` against a vocabulary of `vocab` tokens and sorts them. A token named
    /// twice keeps its last bias (as a JSON object's repeated key does).
    pub fn new(entries: impl IntoIterator<Item = (u32, f64)>, vocab: usize) -> Result<Self, LogitBiasError> {
        let mut biases = Vec::new();
        for (token, bias) in entries {
            if token as usize >= vocab {
                return Err(LogitBiasError::OutOfVocabulary { token, vocab });
            }
            if !(bias.is_finite() && bias.abs() <= MAX_LOGIT_BIAS as f64) {
                return Err(LogitBiasError::OutOfRange { token, bias });
            }
            biases.push((token, bias as f32));
        }
        // A stable sort keeps repeated tokens in order, so the last of each run wins.
        biases.sort_by_key(|&(token, _)| token);
        let mut unique: Vec<(u32, f32)> = Vec::with_capacity(biases.len());
        for (token, bias) in biases {
            match unique.last_mut() {
                Some(last) if last.0 == token => last.1 = bias,
                _ => unique.push((token, bias)),
            }
        }
        Ok(Self(unique))
    }

    /// The biases, sorted by token id.
    pub fn entries(&self) -> &[(u32, f32)] {
        &self.0
    }

    /// Whether no token is biased.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds each bias to its token's logit (ids past the row's end are skipped).
    pub(super) fn apply(&self, logits: &mut [f32]) {
        for &(token, bias) in &self.0 {
            if let Some(l) = logits.get_mut(token as usize) {
                *l += bias;
            }
        }
    }
}

/// vLLM's `allowed_token_ids`: the tokens sampling may choose from, sorted and unique, at
/// least one, all within the vocabulary ([`AllowedTokens::new`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AllowedTokens(Vec<u32>);

/// Why an `allowed_token_ids` list is rejected.
#[derive(Debug, Error, PartialEq)]
pub enum AllowedTokensError {
    /// The list is empty: nothing could be sampled.
    #[error("`allowed_token_ids` must name at least one token")]
    Empty,
    /// A token id at or past the vocabulary's end.
    #[error("`allowed_token_ids` names token {token}, outside the vocabulary (ids 0 to {})", vocab - 1)]
    OutOfVocabulary {
        /// The token id given.
        token: u32,
        /// The model's vocabulary size.
        vocab: usize,
    },
}

impl AllowedTokens {
    /// Checks `ids` against a vocabulary of `vocab` tokens; repeats are dropped.
    pub fn new(ids: impl IntoIterator<Item = u32>, vocab: usize) -> Result<Self, AllowedTokensError> {
        let mut ids: Vec<u32> = ids.into_iter().collect();
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(AllowedTokensError::OutOfVocabulary { token, vocab });
        }
        if ids.is_empty() {
            return Err(AllowedTokensError::Empty);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(Self(ids))
    }

    /// The allowed ids, sorted.
    pub fn ids(&self) -> &[u32] {
        &self.0
    }

    /// Rules out every other token, unless none of these has a finite logit (then nothing
    /// changes: see the module docs).
    pub(super) fn narrow(&self, logits: &mut [f32]) {
        if !self.0.iter().any(|&t| logits.get(t as usize).is_some_and(|l| l.is_finite())) {
            return;
        }
        let mut next = self.0.iter().copied().peekable();
        for (i, l) in logits.iter_mut().enumerate() {
            if next.peek() == Some(&(i as u32)) {
                next.next();
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

/// Why a set of sampling parameters is rejected.
#[derive(Debug, Error, PartialEq)]
pub enum ParamError {
    /// A parameter is out of its range; names the parameter and the range.
    #[error("`{name}` must be {range}, got {value}")]
    OutOfRange {
        /// The parameter's API name.
        name: &'static str,
        /// The allowed range, in words.
        range: &'static str,
        /// The value given.
        value: f64,
    },
}

/// The most alternatives a request may ask for (OpenAI allows 20).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl SamplingParams {
    /// Checks every parameter's range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let check = |ok: bool, name, range, value: f64| {
            if ok { Ok(()) } else { Err(ParamError::OutOfRange { name, range, value }) }
        };
        let t = self.temperature;
        check(t.is_finite() && (0.0..=2.0).contains(&t), "temperature", "between 0 and 2", t as f64)?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p as f64)?;
        check((0.0..=1.0).contains(&self.min_p), "min_p", "in [0, 1]", self.min_p as f64)?;
        let p = self.presence_penalty;
        check((-2.0..=2.0).contains(&p), "presence_penalty", "between -2 and 2", p as f64)?;
        let f = self.frequency_penalty;
        check((-2.0..=2.0).contains(&f), "frequency_penalty", "between -2 and 2", f as f64)?;
        let r = self.repetition_penalty;
        check(r.is_finite() && r > 0.0 && r <= 10.0, "repetition_penalty", "in (0, 10]", r as f64)?;
        if let Some(n) = self.logprobs {
            check(n <= MAX_TOP_LOGPROBS, "top_logprobs", "between 0 and 20", n as f64)?;
        }
        Ok(())
    }

    pub(super) fn is_greedy(&self) -> bool {
        self.temperature < 1e-5 || self.top_k == 1
    }
}
