//! The engine: requests in, tokens and text out, one [`LlmEngine::step`] at a time.
//!
//! A step asks the [`Scheduler`] for a plan, runs one forward pass over the flattened batch,
//! and for every sequence whose last token was computed: asks its constraint for a mask,
//! samples, checks EOS / stop tokens / stop strings / length, and commits the token to the
//! constraint. A constraint may answer with a forced span (DSpark's fast-forward): those
//! tokens are appended without sampling and fed to the model as one multi-token chunk in the
//! next step. A step may also feed a draft of the tokens likely to come next: the
//! constraint's guess of the token after the span (DSpark's path tree remembers what was
//! taken from the same state before) and tokens found by prompt lookup (what followed the
//! sequence's last few tokens where they occurred before, [`super::draft`]). The draft rides
//! along as more rows of the sequence; sampling runs row by row, and while it draws the
//! drafted tokens, the tokens after them are sampled in the same step (`LlmEngine::draft`).
//! On a CPU a drafted row costs compute the whole batch waits for, so drafts ride only in
//! steps that sample few sequences, except prompt lookup's for a sequence whose last sampled
//! tokens it kept predicting ([`EngineConfig::confident_lookup_hits`]).
//! Cancellation removes a sequence and frees its blocks immediately.
//!
//! A request may ask for its prompt tokens to be scored ([`GenerationRequest::prompt_logprobs`]:
//! vLLM's `prompt_logprobs`, and what OpenAI's `echo` with `logprobs` returns, which
//! lm-evaluation-harness scores answers with). Its prompt chunks then get a logits row per
//! prompt position; each row scores the token after it against the model's raw distribution
//! ([`super::sampler::score`]), and the scores come with the sequence's first update. Such a
//! prompt takes no cached prefix, since those rows would not be computed; a preempted one is
//! recomputed without scoring its positions twice. With `max_tokens` 0 nothing is sampled:
//! the request ends with [`FinishReason::Length`] once its prompt is scored.
//!
//! The engine is synchronous and single-threaded by design (the model's kernels are
//! parallel); the server drives it from a dedicated thread.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};

use super::backend::{Backend, ForwardBatch, KvShape};
use super::blocks::BlockManager;
use super::config::{EngineConfig, EngineStats};
use super::constraint::{ConstraintStep, Guess, Mask, SequenceConstraint};
use super::detokenize::OutputText;
use super::draft::{MAX_LOOKBACK, PromptLookup};
use super::model::Model;
use super::request::{FinishReason, GenerationRequest, RequestError, SequenceUpdate, StopReason, TokenOutput};
use super::sampler::{Rng, SamplingParams, Scored, TokenHistory, bad_word_bans, sample, score};
use super::scheduler::{ScheduledSeq, Scheduler, SchedulerConfig, SeqId};
use crate::tokenizer::ModelTokenizer;

pub(super) struct RequestState {
    pub(super) sampling: SamplingParams,
    pub(super) rng: Rng,
    pub(super) history: TokenHistory,
    pub(super) max_tokens: usize,
    pub(super) stop_token_ids: Vec<u32>,
    pub(super) ignore_eos: bool,
    pub(super) min_tokens: usize,
    /// The tokens that would end the sequence (EOS unless ignored, `stop_token_ids`), kept
    /// from sampling while fewer than `min_tokens` are generated; empty when `min_tokens` is 0.
    pub(super) ending_tokens: Vec<u32>,
    pub(super) skip_special_tokens: bool,
    /// The `stop_token_ids` entry that ended the output.
    pub(super) stopped_by_token: Option<u32>,
    pub(super) constraint: Option<Box<dyn SequenceConstraint>>,
    pub(super) text: OutputText,
    pub(super) generated: usize,
    /// The most tokens prompt lookup drafts for this sequence next: one more than its last
    /// draft had drawn, so a sequence whose drafts keep missing pays one row per step and
    /// one whose drafts are drawn whole gets longer ones.
    pub(super) lookup_len: usize,
    /// Sampled tokens in a row that prompt lookup proposed
    /// ([`EngineConfig::confident_lookup_hits`]).
    pub(super) lookup_hits: usize,
    /// What prompt lookup proposed for the token this step samples, where the step feeds
    /// no lookup draft for it: `Some(None)` when it proposed nothing; `None` when not
    /// checked.
    pub(super) shadow_lookup: Option<Option<u32>>,
    /// Output produced before the first step (the constraint's initial span).
    pub(super) pending: Vec<TokenOutput>,
    /// Set when the request ended before any step.
    pub(super) finished_early: Option<FinishReason>,
    /// Alternatives per scored prompt token, when the prompt is scored.
    pub(super) prompt_logprobs: Option<usize>,
    /// Prompt positions scored so far (the first is position 1); kept across preemptions.
    pub(super) prompt_scored: usize,
    /// Scores not yet delivered.
    pub(super) prompt_scores: Vec<Scored>,
    pub(super) prompt_len: usize,
}

impl RequestState {
    /// Whether prompt positions remain to be scored.
    fn scoring_prompt(&self) -> bool {
        self.prompt_logprobs.is_some() && self.prompt_scored + 1 < self.prompt_len
    }
}

/// The engine of one model.
pub struct LlmEngine<B: Backend> {
    pub(super) model: Arc<Model<B>>,
    pub(super) tokenizer: Arc<ModelTokenizer>,
    pub(super) cache: B::KvCache,
    pub(super) scheduler: Scheduler,
    pub(super) requests: HashMap<SeqId, RequestState>,
    pub(super) next_id: SeqId,
    pub(super) max_model_len: usize,
    pub(super) block_size: usize,
    pub(super) overlap_masks: bool,
    pub(super) masked_logits: bool,
    pub(super) guesses: bool,
    pub(super) prompt_lookup: Option<PromptLookup>,
    pub(super) lookup_max_seqs: usize,
    pub(super) confident_lookup_hits: Option<usize>,
    /// [`Self::check_lookup_silently`]'s proposal, kept to spare an allocation per step.
    pub(super) lookup_scratch: Vec<u32>,
    pub(super) guess_max_seqs: usize,
    pub(super) mask_threads: usize,
    pub(super) stats: EngineStats,
}

/// The tokens a step speculates after a sequence's scheduled ones ([`LlmEngine::draft`]):
/// the constraint's guess, if any, first, then the prompt-lookup tokens.
struct Draft {
    items: Vec<Guess>,
    /// How many of `items` (at the front) are the constraint's guess: 0 or 1.
    guessed: usize,
    /// The masks after the first items, where the constraint knows them
    /// ([`SequenceConstraint::masks_after`]).
    masks_after: Vec<Option<Mask>>,
}

impl Draft {
    /// Rows it adds to its sequence's step: each item's token and its span.
    fn rows(&self) -> usize {
        self.items.iter().map(|g| 1 + g.forced.len()).sum()
    }
}

/// Whose mask applies to a logits row ([`EngineConfig::masked_logits`]).
pub(super) enum RowMask {
    /// No mask is known: every logit is computed.
    Unknown,
    /// A sampled row: the mask its sequence's worker computes during the pass.
    Sampled(SeqId),
    /// A row after a drafted token, whose mask the constraint already knew.
    Known(Option<Mask>),
}

impl<B: Backend> LlmEngine<B> {
    /// An engine over a loaded model. Fails when the limits cannot be met (e.g. a KV cache
    /// smaller than one sequence of `max_model_len`).
    pub fn new(model: Arc<Model<B>>, tokenizer: Arc<ModelTokenizer>, config: &EngineConfig) -> anyhow::Result<Self> {
        let mc = model.config().clone();
        let max_model_len = config.max_model_len.unwrap_or(mc.context_length);
        if max_model_len == 0 || config.block_size == 0 || config.max_num_seqs == 0 {
            bail!("max_model_len, block_size and max_num_seqs must be positive");
        }
        if max_model_len > mc.context_length {
            bail!("max_model_len {max_model_len} exceeds the model's context length {}", mc.context_length);
        }
        if config.max_num_batched_tokens == 0 {
            bail!("max_num_batched_tokens must be positive");
        }
        let shape = |num_blocks| KvShape {
            layers: mc.layers,
            num_blocks,
            block_size: config.block_size,
            kv_heads: mc.kv_heads,
            head_dim: mc.head_dim,
            dtype: config.kv_cache_dtype,
        };
        let bytes_per_token = shape(0).bytes_per_slot();
        let tokens = match config.kv_cache_tokens {
            Some(t) => t,
            None => (config.max_num_seqs * max_model_len)
                .min(config.kv_cache_max_bytes / bytes_per_token.max(1))
                .max(max_model_len),
        };
        let num_blocks = tokens.div_ceil(config.block_size);
        if num_blocks * config.block_size < max_model_len {
            bail!(
                "the KV cache holds {} tokens, fewer than max_model_len {max_model_len}; raise the cache size or lower max_model_len",
                num_blocks * config.block_size
            );
        }
        let cache = model
            .backend()
            .kv_cache(shape(num_blocks))
            .with_context(|| format!("cannot allocate a KV cache of {num_blocks} blocks"))?;
        let scheduler = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: config.max_num_seqs,
                max_num_batched_tokens: config.max_num_batched_tokens,
                extra_rows_beside_plain: config.extra_rows_beside_plain,
            },
            BlockManager::new(num_blocks, config.block_size, config.prefix_caching),
        );
        Ok(Self {
            model,
            tokenizer,
            cache,
            scheduler,
            requests: HashMap::new(),
            next_id: 0,
            max_model_len,
            block_size: config.block_size,
            overlap_masks: config.overlap_masks,
            masked_logits: config.masked_logits,
            guesses: config.guesses,
            prompt_lookup: config.prompt_lookup,
            lookup_max_seqs: config.lookup_max_seqs,
            confident_lookup_hits: config.confident_lookup_hits,
            lookup_scratch: Vec::new(),
            guess_max_seqs: config.guess_max_seqs,
            mask_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            stats: EngineStats::default(),
        })
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model<B>> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Arc<ModelTokenizer> {
        &self.tokenizer
    }

    /// The longest sequence accepted.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// The scheduler (queue lengths, cache usage, prefix-cache counters).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Whether any request is unfinished.
    pub fn has_work(&self) -> bool {
        !self.requests.is_empty()
    }

    /// Queues a request and returns its id.
    pub fn add_request(&mut self, request: GenerationRequest) -> Result<SeqId, RequestError> {
        let GenerationRequest {
            prompt,
            sampling,
            max_tokens,
            stop,
            include_stop_str_in_output,
            stop_token_ids,
            ignore_eos,
            min_tokens,
            skip_special_tokens,
            mut constraint,
            prompt_logprobs,
        } = request;
        sampling.validate()?;
        if prompt.is_empty() {
            return Err(RequestError::EmptyPrompt);
        }
        if prompt.len() >= self.max_model_len {
            return Err(RequestError::PromptTooLong { prompt_tokens: prompt.len(), max_model_len: self.max_model_len });
        }
        // Nothing to generate: the prompt is only scored.
        let score_only = max_tokens == Some(0);
        if score_only && prompt_logprobs.is_none() {
            return Err(RequestError::ZeroMaxTokens);
        }
        if let Some(max_tokens) = max_tokens
            && min_tokens > max_tokens
        {
            return Err(RequestError::MinAboveMax { min_tokens, max_tokens });
        }
        let mut ending_tokens = Vec::new();
        if min_tokens > 0 {
            if !ignore_eos {
                ending_tokens.extend_from_slice(&self.tokenizer.eos);
            }
            ending_tokens.extend_from_slice(&stop_token_ids);
        }
        let room = self.max_model_len - prompt.len();
        let max_tokens = max_tokens.map_or(room, |m| m.min(room));
        let mut state = RequestState {
            rng: sampling.seed.map_or_else(Rng::from_entropy, Rng::new),
            history: TokenHistory::new(&prompt),
            sampling,
            max_tokens,
            stop_token_ids,
            ignore_eos,
            min_tokens,
            ending_tokens,
            skip_special_tokens,
            stopped_by_token: None,
            constraint: None,
            text: OutputText::new(stop, include_stop_str_in_output),
            generated: 0,
            lookup_len: self.prompt_lookup.map_or(0, |l| l.max_draft),
            lookup_hits: 0,
            shadow_lookup: None,
            pending: Vec::new(),
            finished_early: score_only.then_some(FinishReason::Length),
            prompt_logprobs,
            prompt_scored: 0,
            prompt_scores: Vec::new(),
            prompt_len: prompt.len(),
        };
        let mut tokens = prompt;
        let prompt_len = tokens.len();
        let plain = constraint.is_none();
        if let Some(c) = constraint.as_mut().filter(|_| !score_only) {
            let first = c.start().map_err(|e| RequestError::Constraint(format!("{e:#}")))?;
            let mut out = Vec::new();
            state.finished_early = self.absorb_forced(&mut state, &first, &mut out);
            // A request ending here is fed only its prompt, if that is to be scored.
            if state.finished_early.is_none() || !state.scoring_prompt() {
                tokens.extend(out.iter().map(|t| t.token));
            }
            state.pending = out;
        }
        state.constraint = constraint;
        let scoring = state.scoring_prompt();
        let id = self.next_id;
        self.next_id += 1;
        self.requests.insert(id, state);
        self.scheduler.add(id, tokens, prompt_len, plain);
        self.scheduler.set_scores_prompt(id, scoring);
        Ok(id)
    }

    /// Cancels a request: its blocks are freed now. Returns whether it existed.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        self.scheduler.finish(id);
        self.requests.remove(&id).is_some()
    }

    /// Runs one step. Returns an update for every sequence that produced output or ended.
    pub fn step(&mut self) -> anyhow::Result<Vec<SequenceUpdate>> {
        let mut updates = self.finish_early_requests();
        let plan = self.scheduler.schedule();
        self.stats.preemptions += plan.preempted.len() as u64;
        self.stats.cut_chunks += plan.cut_chunks as u64;
        if plan.scheduled.is_empty() {
            return Ok(updates);
        }
        let mut batch = ForwardBatch::default();
        // Whose mask applies to each logits row: a sampled row's sequence, or for the rows
        // after a draft's tokens the masks the constraint already knows.
        let mut masked_rows: Vec<RowMask> = Vec::new();
        let mut drafts: HashMap<SeqId, Draft> = HashMap::new();
        // For each logits row, in order: the prompt position it scores, if it is a scored
        // prompt row (with the sequence), else `None` (a sampled or drafted row).
        let mut scored_rows: Vec<Option<(SeqId, usize)>> = Vec::new();
        // A request that ended before its first step is fed only to score its prompt.
        let samples = |s: &ScheduledSeq, requests: &HashMap<SeqId, RequestState>| {
            s.sample && requests.get(&s.id).is_none_or(|r| r.finished_early.is_none())
        };
        let sampled: Vec<SeqId> = plan.scheduled.iter().filter(|s| samples(s, &self.requests)).map(|s| s.id).collect();
        let sampling = sampled.len();
        let (guessing, looking_up) = (sampling <= self.guess_max_seqs, sampling <= self.lookup_max_seqs);
        // What constrained sequences may still draft beside an unconstrained neighbour.
        let mut extra_rows_left = plan.extra_rows_left;
        for s in &plan.scheduled {
            let sample = samples(s, &self.requests);
            let plain = self.scheduler.get(s.id).is_some_and(|seq| seq.plain);
            let max_rows = if plain { usize::MAX } else { extra_rows_left };
            let confident = sample && self.confident(s.id);
            let drafting = sample && (guessing || confident);
            let with_lookup = looking_up || confident;
            let draft = if drafting { self.draft(s.id, guessing, with_lookup, max_rows) } else { None };
            // Where lookup was not asked for a draft, ask it silently, so its hits still count;
            // where it was, its drafted tokens are counted when sampled (and it proposed none).
            if sample && !(drafting && with_lookup) {
                self.check_lookup_silently(s.id);
            }
            if let Some(d) = draft.as_ref().filter(|_| !plain) {
                extra_rows_left -= d.rows();
            }
            let Some(seq) = self.scheduler.get(s.id) else { continue };
            let tokens = &seq.tokens[s.start..s.start + s.len];
            // Scored prompt rows first: the row at position p scores token p + 1.
            if let Some(state) = self.requests.get_mut(&s.id).filter(|r| r.scoring_prompt()) {
                if s.start > state.prompt_scored {
                    // A row to score was never fed (the scheduler gives scored prompts no
                    // cached prefix, so this is a bug): end the request rather than wait for
                    // the row forever.
                    let missed = state.prompt_scored + 1;
                    state.prompt_scored = state.prompt_len;
                    state.finished_early =
                        Some(FinishReason::Error(format!("prompt position {missed} was not scored")));
                } else {
                    let end = (s.start + s.len).min(state.prompt_len - 1);
                    for p in state.prompt_scored..end {
                        batch.logits_rows.push(batch.len() + p - s.start);
                        masked_rows.push(RowMask::Unknown);
                        scored_rows.push(Some((s.id, p + 1)));
                    }
                }
            }
            if let Some(draft) = draft {
                // Logits of the last scheduled row (to sample) and of the last row of each
                // drafted token with its span (the token after it).
                let mut rows = tokens.to_vec();
                let mut logits_rows = vec![batch.len() + rows.len() - 1];
                for item in &draft.items {
                    rows.push(item.token);
                    rows.extend(&item.forced);
                    logits_rows.push(batch.len() + rows.len() - 1);
                }
                batch.push_sequence(&rows, s.start, seq.block_table(), self.block_size, false);
                masked_rows.push(RowMask::Sampled(s.id));
                let known = draft.masks_after.iter().take(logits_rows.len() - 1);
                masked_rows.extend(known.map(|m| RowMask::Known(m.clone())));
                masked_rows.resize_with(batch.logits_rows.len() + logits_rows.len(), || RowMask::Unknown);
                batch.logits_rows.extend(logits_rows);
                self.stats.speculated_tokens += draft.items.len() as u64;
                drafts.insert(s.id, draft);
            } else {
                batch.push_sequence(tokens, s.start, seq.block_table(), self.block_size, sample);
                if sample {
                    masked_rows.push(RowMask::Sampled(s.id));
                }
            }
            scored_rows.resize(batch.logits_rows.len(), None);
            let prompt_part = seq.prompt_len.saturating_sub(s.start).min(s.len);
            self.stats.prompt_tokens_computed += prompt_part as u64;
        }
        let started = Instant::now();
        let (logits, mut masks) = self.forward_with_masks(&batch, &sampled, &masked_rows);
        let mut logits = logits?;
        self.stats.steps += 1;
        self.stats.step_rows += batch.len() as u64;
        self.stats.step_ns += started.elapsed().as_nanos() as u64;
        self.scheduler.complete(&plan);
        let vocab = self.model.config().vocab_size;
        let mut sampled_rows = Vec::with_capacity(sampled.len());
        for (row, scored) in logits.chunks_exact_mut(vocab).zip(scored_rows.iter().chain(std::iter::repeat(&None))) {
            match *scored {
                Some((id, position)) => self.score_prompt_row(id, position, row),
                None => sampled_rows.push(row),
            }
        }
        let mut rows = sampled_rows.into_iter();
        for &id in &sampled {
            let Some(row) = rows.next() else { break };
            let update = match drafts.remove(&id) {
                Some(draft) => {
                    let after: Vec<&mut [f32]> = rows.by_ref().take(draft.items.len()).collect();
                    if after.len() < draft.items.len() {
                        break;
                    }
                    self.advance_drafted(id, row, after, masks.remove(&id), draft)
                }
                None => self.advance(id, row, masks.remove(&id)),
            };
            updates.extend(update);
        }
        Ok(updates)
    }

    /// Scores prompt token `position` of sequence `id` with `logits`, the row before it, once
    /// (a recomputed row after a preemption is not scored again); the last position ends the
    /// scoring.
    fn score_prompt_row(&mut self, id: SeqId, position: usize, logits: &[f32]) {
        let (Some(state), Some(seq)) = (self.requests.get_mut(&id), self.scheduler.get(id)) else { return };
        let (Some(top), Some(&token)) = (state.prompt_logprobs, seq.tokens.get(position)) else { return };
        if position != state.prompt_scored + 1 {
            return;
        }
        state.prompt_scores.push(score(logits, token, top));
        state.prompt_scored = position;
        if !state.scoring_prompt() {
            self.scheduler.set_scores_prompt(id, false);
        }
    }

    /// The tokens to speculate after sequence `id`'s scheduled tokens, each with the forced
    /// span expected after it: first its constraint's guess (DSpark only: the token most
    /// recently and repeatedly taken from the same constraint state, e.g. the `":"` a model
    /// writes after a key name, which the plugin holds back because it could merge with what
    /// follows), then what prompt lookup finds after the sequence's tokens (and the guess):
    /// as many as the sequence has room for and cache slots can be had for without
    /// preempting anyone, and at most `max_rows`. Prompt lookup only `with_lookup`.
    ///
    /// The draft is fed as more rows of the sequence's chunk, with the logits of the row
    /// before it and of each drafted token's last row. Sampling at the row before is
    /// unchanged; when it draws the first drafted token, that token's K/V and the logits
    /// after it are already computed and the next token is sampled in the same step (a step
    /// saved), and so on down the draft; the rows after the first miss are dropped and their
    /// cache slots are overwritten later. Outputs are the same either way: a row's results
    /// do not depend on the other rows of its batch.
    fn draft(&mut self, id: SeqId, with_guess: bool, with_lookup: bool, max_rows: usize) -> Option<Draft> {
        let lookup = self.prompt_lookup.filter(|_| with_lookup);
        let guesses = self.guesses && with_guess;
        if !guesses && lookup.is_none() {
            return None;
        }
        let state = self.requests.get_mut(&id)?;
        let seq = self.scheduler.get(id)?;
        if state.finished_early.is_some() {
            return None;
        }
        let mut draft = Vec::new();
        // Rows beyond the token sampled at the scheduled row, within max_tokens and
        // max_model_len.
        let room = state
            .max_tokens
            .saturating_sub(state.generated + 1)
            .min(self.max_model_len.saturating_sub(seq.tokens.len() + 1))
            .min(max_rows);
        let mut rows = 0;
        if guesses
            && let Some(guess) = state.constraint.as_mut().and_then(|c| c.guess())
            && guess.forced.len() < room
        {
            rows += 1 + guess.forced.len();
            draft.push(guess);
        }
        let guessed = draft.len();
        if let Some(lookup) = lookup
            && rows < room
        {
            let mut found = Vec::new();
            let limit = (room - rows).min(state.lookup_len);
            if draft.is_empty() {
                lookup.propose(&seq.tokens, limit, &mut found);
            } else {
                // The searched window of the sequence, then the guess and its span.
                let mut context = seq.tokens[seq.tokens.len().saturating_sub(MAX_LOOKBACK)..].to_vec();
                for g in &draft {
                    context.push(g.token);
                    context.extend(&g.forced);
                }
                lookup.propose(&context, limit, &mut found);
            }
            rows += found.len();
            draft.extend(found.into_iter().map(|token| Guess { token, forced: Vec::new() }));
        }
        if rows == 0 || !self.scheduler.reserve_slots(id, rows) {
            return None;
        }
        let masks_after = match state.constraint.as_mut() {
            Some(c) if self.masked_logits && self.overlap_masks => c.masks_after(&draft),
            _ => Vec::new(),
        };
        Some(Draft { items: draft, guessed, masks_after })
    }

    /// [`Self::advance`] for a sequence fed with a draft (see [`Self::draft`]): samples from
    /// `logits`; while that draws the drafted token and the constraint answers with the
    /// forced span expected after it, the K/V of both are kept and the next token is sampled
    /// from the logits after them (`after`, one row per drafted token) in the same step.
    /// Where only the token matches, its K/V are kept and the span is fed in the next step as
    /// usual.
    fn advance_drafted(
        &mut self,
        id: SeqId,
        logits: &mut [f32],
        after: Vec<&mut [f32]>,
        mask: Option<anyhow::Result<Option<Mask>>>,
        draft: Draft,
    ) -> Option<SequenceUpdate> {
        let mut state = self.requests.remove(&id)?;
        let mut tokens = std::mem::take(&mut state.pending);
        let mut first = tokens.len();
        let mut finish = self.advance_state(id, &mut state, logits, mask, &mut tokens);
        let mut drawn: usize = 0;
        Self::score_shadow_lookup(&mut state, tokens.get(first).map(|t| t.token));
        for ((i, item), logits) in draft.items.iter().enumerate().zip(after) {
            if finish.is_some() {
                break;
            }
            let hit = tokens.get(first).map(|t| t.token) == Some(item.token);
            if i >= draft.guessed {
                // A lookup token that sampling reached: it counts toward confidence.
                state.lookup_hits = if hit { state.lookup_hits + 1 } else { 0 };
            }
            if !hit {
                break;
            }
            self.stats.speculated_accepted += 1;
            drawn += 1;
            let span: Vec<u32> = tokens[first + 1..].iter().map(|t| t.token).collect();
            if span != item.forced {
                self.scheduler.mark_computed(id, 1);
                break;
            }
            self.scheduler.mark_computed(id, 1 + span.len());
            first = tokens.len();
            finish = self.advance_state(id, &mut state, logits, None, &mut tokens);
        }
        // Only lookup's own tokens set the length of its next draft, not the guess's.
        if let Some(lookup) = self.prompt_lookup
            && draft.items.len() > draft.guessed
        {
            state.lookup_len = (drawn.saturating_sub(draft.guessed) + 1).min(lookup.max_draft);
        }
        Some(self.conclude(id, state, tokens, finish))
    }

    /// Ends the requests that ended before their first step, once their prompt is scored
    /// where that was asked for.
    fn finish_early_requests(&mut self) -> Vec<SequenceUpdate> {
        let ended: Vec<SeqId> = self
            .requests
            .iter()
            .filter(|(_, s)| s.finished_early.is_some() && !s.scoring_prompt())
            .map(|(&id, _)| id)
            .collect();
        ended
            .into_iter()
            .filter_map(|id| {
                let mut state = self.requests.remove(&id)?;
                self.scheduler.finish(id);
                Some(SequenceUpdate {
                    id,
                    tokens: std::mem::take(&mut state.pending),
                    text: state.text.delta(true),
                    stop_reason: state.stop_reason(state.finished_early.as_ref()),
                    finish: state.finished_early,
                    prompt_logprobs: std::mem::take(&mut state.prompt_scores),
                })
            })
            .collect()
    }

    /// Samples the next token of `id` from `logits` and applies everything that follows.
    fn advance(
        &mut self,
        id: SeqId,
        logits: &mut [f32],
        mask: Option<anyhow::Result<Option<Mask>>>,
    ) -> Option<SequenceUpdate> {
        let mut state = self.requests.remove(&id)?;
        let mut tokens = std::mem::take(&mut state.pending);
        let first = tokens.len();
        let finish = self.advance_state(id, &mut state, logits, mask, &mut tokens);
        Self::score_shadow_lookup(&mut state, tokens.get(first).map(|t| t.token));
        Some(self.conclude(id, state, tokens, finish))
    }

    /// Whether sequence `id` drafts by prompt lookup whatever the batch
    /// ([`EngineConfig::confident_lookup_hits`]).
    fn confident(&self, id: SeqId) -> bool {
        let (Some(hits), Some(_)) = (self.confident_lookup_hits, self.prompt_lookup) else { return false };
        self.requests.get(&id).is_some_and(|r| r.lookup_hits >= hits)
    }

    /// Records what prompt lookup would propose for the token sequence `id` samples this
    /// step, without drafting it, so [`Self::score_shadow_lookup`] can count a hit or a miss.
    fn check_lookup_silently(&mut self, id: SeqId) {
        let (Some(lookup), Some(_)) = (self.prompt_lookup, self.confident_lookup_hits) else { return };
        let (Some(state), Some(seq)) = (self.requests.get_mut(&id), self.scheduler.get(id)) else { return };
        self.lookup_scratch.clear();
        lookup.propose(&seq.tokens, 1, &mut self.lookup_scratch);
        state.shadow_lookup = Some(self.lookup_scratch.first().copied());
    }

    /// Counts the silently checked proposal (if one was made this step) against `sampled`,
    /// the token sampling drew (`None`: none was drawn).
    fn score_shadow_lookup(state: &mut RequestState, sampled: Option<u32>) {
        if let Some(proposed) = state.shadow_lookup.take() {
            let hit = proposed.is_some() && proposed == sampled;
            state.lookup_hits = if hit { state.lookup_hits + 1 } else { 0 };
        }
    }

    /// The update of a sequence after its step: the new text; the sequence ends (its blocks
    /// freed) or goes back to the running requests.
    fn conclude(
        &mut self,
        id: SeqId,
        mut state: RequestState,
        tokens: Vec<TokenOutput>,
        finish: Option<FinishReason>,
    ) -> SequenceUpdate {
        let text = state.text.delta(finish.is_some());
        let stop_reason = state.stop_reason(finish.as_ref());
        let prompt_logprobs = std::mem::take(&mut state.prompt_scores);
        if finish.is_some() {
            self.scheduler.finish(id);
        } else {
            self.requests.insert(id, state);
        }
        SequenceUpdate { id, tokens, text, finish, stop_reason, prompt_logprobs }
    }

    fn advance_state(
        &mut self,
        id: SeqId,
        state: &mut RequestState,
        logits: &mut [f32],
        precomputed: Option<anyhow::Result<Option<Mask>>>,
        out: &mut Vec<TokenOutput>,
    ) -> Option<FinishReason> {
        let mask = match precomputed {
            Some(mask) => Some(mask),
            None => state.constraint.as_mut().map(|c| {
                let started = Instant::now();
                let mask = c.mask();
                self.stats.masks += 1;
                self.stats.mask_wait_ns += started.elapsed().as_nanos() as u64;
                mask
            }),
        };
        let mask = match mask {
            Some(Ok(mask)) => mask,
            Some(Err(e)) => return Some(FinishReason::Error(format!("constraint mask failed: {e:#}"))),
            None => None,
        };
        let ending: &[u32] = if state.generated < state.min_tokens { &state.ending_tokens } else { &[] };
        let mut with_bad_words = Vec::new();
        let banned = if state.sampling.bad_words.is_empty() {
            ending
        } else {
            with_bad_words.extend_from_slice(ending);
            let output =
                self.scheduler.get(id).map_or(&[][..], |seq| &seq.tokens[seq.prompt_len.min(seq.tokens.len())..]);
            bad_word_bans(&state.sampling.bad_words, output, &mut with_bad_words);
            &with_bad_words
        };
        let sampled = match sample(logits, &state.sampling, &state.history, mask.as_deref(), banned, &mut state.rng) {
            Ok(s) => s,
            Err(e) => return Some(FinishReason::Error(e.to_string())),
        };
        self.stats.sampled_tokens += 1;
        let token = sampled.token;
        state.history.push_output(token);
        state.generated += 1;
        out.push(TokenOutput { token, forced: false, logprob: sampled.logprob, top_logprobs: sampled.top });
        let table = self.tokenizer.tokenizer.table();
        let is_eos = !state.ignore_eos && self.tokenizer.eos.contains(&token);
        if is_eos {
            return Some(FinishReason::Stop);
        }
        if state.stop_token_ids.contains(&token) {
            state.stopped_by_token = Some(token);
            return Some(FinishReason::Stop);
        }
        self.scheduler.append(id, &[token]);
        if !(state.skip_special_tokens && table.is_special(token)) && push_text(state, table.token_bytes(token)) {
            return Some(FinishReason::Stop);
        }
        if let Some(constraint) = state.constraint.as_mut() {
            let step = match constraint.commit(token) {
                Ok(step) => step,
                Err(e) => return Some(FinishReason::Error(format!("constraint commit failed: {e:#}"))),
            };
            let start = out.len();
            let finish = self.absorb_forced(state, &step, out);
            let forced: Vec<u32> = out[start..].iter().map(|t| t.token).collect();
            self.scheduler.append(id, &forced);
            if finish.is_some() {
                return finish;
            }
        }
        if state.generated >= state.max_tokens {
            return Some(FinishReason::Length);
        }
        None
    }

    /// Appends a constraint's forced span to `out` (cut at `max_tokens`) and says whether the
    /// sequence ends with it.
    fn absorb_forced(
        &mut self,
        state: &mut RequestState,
        step: &ConstraintStep,
        out: &mut Vec<TokenOutput>,
    ) -> Option<FinishReason> {
        let table = self.tokenizer.tokenizer.table();
        for &token in &step.forced {
            if state.generated >= state.max_tokens {
                return Some(FinishReason::Length);
            }
            state.history.push_output(token);
            state.generated += 1;
            self.stats.forced_tokens += 1;
            out.push(TokenOutput { token, forced: true, logprob: None, top_logprobs: Vec::new() });
            if !(state.skip_special_tokens && table.is_special(token)) && push_text(state, table.token_bytes(token)) {
                return Some(FinishReason::Stop);
            }
        }
        if step.stop {
            return Some(FinishReason::Stop);
        }
        if state.generated >= state.max_tokens {
            return Some(FinishReason::Length);
        }
        None
    }
}

impl RequestState {
    /// vLLM's `stop_reason` for an output ending with `finish`.
    fn stop_reason(&self, finish: Option<&FinishReason>) -> Option<StopReason> {
        if finish != Some(&FinishReason::Stop) {
            return None;
        }
        match (self.stopped_by_token, self.text.matched_stop()) {
            (Some(token), _) => Some(StopReason::Token(token)),
            (None, Some(text)) => Some(StopReason::Text(text.to_string())),
            (None, None) => None,
        }
    }
}

/// Appends a generated token's bytes to the sequence's text; says whether a stop string
/// ended it. Stop strings count only from the token after the first `min_tokens` (vLLM's
/// rule).
fn push_text(state: &mut RequestState, bytes: &[u8]) -> bool {
    if state.generated > state.min_tokens {
        state.text.push(bytes)
    } else {
        state.text.push_unwatched(bytes);
        false
    }
}
