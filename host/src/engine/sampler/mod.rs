//! Sampling one token from a row of logits.
//!
//! The order of operations is vLLM's v1 sampler's and llama.cpp's: `logit_bias` added to the
//! raw logits, then penalties, then the constraint mask
//! (disallowed tokens get `-inf`), then vLLM's `allowed_token_ids` and the banned tokens (those
//! a request may not end with yet, `min_tokens`, and those completing one of its `bad_words`),
//! then — for log-probabilities — a log-softmax of those
//! processed logits, then temperature, top-k, min-p and top-p, and a draw from a per-request
//! random stream. `temperature == 0` is greedy (ties go to the lowest id).
//!
//! `allowed_token_ids` and the banned tokens narrow what the constraint allows; where a
//! narrowing would leave no token, it is not applied and the constraint alone decides (vLLM
//! would sample from a row of `-inf` there). So a constraint's end or its only possible token
//! is taken in the classic path exactly as DSpark takes it without sampling (a forced span or
//! the constraint's stop), and both paths give the same output.
//!
//! Penalties follow the OpenAI and vLLM definitions: `presence_penalty` subtracts a constant
//! from every token generated so far, `frequency_penalty` subtracts it once per occurrence,
//! `repetition_penalty` (> 1 discourages) divides positive logits and multiplies negative ones
//! for every token of the prompt and of the output.
//!
//! Masks use the plugins' bitset layout: bit `i % 32` of word `i / 32` allows token `i`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use thiserror::Error;

use super::backend::cpu::expf::exp_in_place;

mod params;

pub use params::{
    AllowedTokens, AllowedTokensError, LogitBias, LogitBiasError, MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS, ParamError,
    SamplingParams,
};

/// Appends to `banned` the tokens that would complete one of `bad_words` (token sequences)
/// after `output`: a one-token word always, a longer one where `output` ends with all of it
/// but its last token (vLLM's rule; a word the model spells with other tokens is not caught).
pub fn bad_word_bans(bad_words: &[Vec<u32>], output: &[u32], banned: &mut Vec<u32>) {
    for word in bad_words {
        if let Some((&last, before)) = word.split_last()
            && output.ends_with(before)
        {
            banned.push(last);
        }
    }
}

/// Rules out `banned` (the tokens a request may not end with before `min_tokens`, and those
/// completing a bad word), unless that would leave no token (then nothing changes: see the
/// module docs).
fn ban(logits: &mut [f32], banned: &[u32]) {
    if banned.is_empty() {
        return;
    }
    let saved: Vec<(usize, f32)> =
        banned.iter().filter_map(|&t| logits.get(t as usize).map(|&l| (t as usize, l))).collect();
    for &(t, _) in &saved {
        logits[t] = f32::NEG_INFINITY;
    }
    if argmax(logits).is_none() {
        for (t, l) in saved {
            logits[t] = l;
        }
    }
}

/// A per-request random stream (xoshiro256**, seeded through SplitMix64): the same seed gives
/// the same tokens whatever else is in the batch.
#[derive(Clone, Debug)]
pub struct Rng {
    state: [u64; 4],
}

impl Rng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self { state: [next(), next(), next(), next()] }
    }

    /// A stream from a fresh seed (time and a process-wide counter).
    pub fn from_entropy() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Self::new(nanos ^ COUNTER.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.state;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Counts of the tokens a sequence has seen, for the penalties.
#[derive(Clone, Debug, Default)]
pub struct TokenHistory {
    prompt: HashMap<u32, u32>,
    output: HashMap<u32, u32>,
}

impl TokenHistory {
    /// A history holding `prompt`.
    pub fn new(prompt: &[u32]) -> Self {
        let mut prompt_counts = HashMap::new();
        for &t in prompt {
            *prompt_counts.entry(t).or_insert(0) += 1;
        }
        Self { prompt: prompt_counts, output: HashMap::new() }
    }

    /// Records a generated (sampled or forced) token.
    pub fn push_output(&mut self, token: u32) {
        *self.output.entry(token).or_insert(0) += 1;
    }
}

/// One sampled token with its log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The token.
    pub token: u32,
    /// Its log-probability (when logprobs were asked for).
    pub logprob: Option<f32>,
    /// The most likely alternatives, best first (when logprobs were asked for).
    pub top: Vec<(u32, f32)>,
}

/// A given token's log-probability under the model's own distribution (vLLM's
/// `prompt_logprobs`, OpenAI's `echo` with `logprobs`: a prompt token given the tokens before
/// it).
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// The token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// 1 + the number of tokens more likely than it (vLLM's `rank`).
    pub rank: usize,
    /// The most likely tokens, best first (ties by lower id), each with its log-probability.
    pub top: Vec<(u32, f32)>,
}

/// Scores `token` against `logits`, a row of raw model output: no penalty, bias, mask or
/// temperature applies (vLLM's default, raw log-probabilities). `top` alternatives are
/// listed; a log-probability of the token equals its entry among them bit for bit.
pub fn score(logits: &[f32], token: u32, top: usize) -> Scored {
    let log_z = log_sum_exp(logits);
    let own = logits.get(token as usize).copied().unwrap_or(f32::NEG_INFINITY);
    let rank = 1 + logits.iter().filter(|&&l| l > own).count();
    let mut best: Vec<(u32, f32)> =
        top_k_indices(logits, top).into_iter().map(|i| (i as u32, logits[i] - log_z)).collect();
    best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    Scored { token, logprob: own - log_z, rank, top: best }
}

/// Why no token could be sampled.
#[derive(Debug, Error, PartialEq)]
pub enum SampleError {
    /// The mask allows no token with a finite logit.
    #[error("the constraint allows no token at this point")]
    NothingAllowed,
}

/// Whether `mask` allows `token`.
pub fn mask_allows(mask: &[u32], token: usize) -> bool {
    mask.get(token / 32).is_some_and(|w| w >> (token % 32) & 1 == 1)
}

/// Samples from `logits` (modified in place by penalties and the mask). `banned` are the
/// tokens that would end the request before its `min_tokens` and those completing a bad word
/// ([`bad_word_bans`]).
pub fn sample(
    logits: &mut [f32],
    params: &SamplingParams,
    history: &TokenHistory,
    mask: Option<&[u32]>,
    banned: &[u32],
    rng: &mut Rng,
) -> Result<Sampled, SampleError> {
    params.logit_bias.apply(logits);
    apply_penalties(logits, params, history);
    if let Some(mask) = mask {
        apply_mask(logits, mask);
    }
    if let Some(allowed) = &params.allowed_tokens {
        allowed.narrow(logits);
    }
    ban(logits, banned);
    let best = argmax(logits).ok_or(SampleError::NothingAllowed)?;
    let token = if params.is_greedy() { best } else { draw(logits, params, rng, best) };
    let (logprob, top) = match params.logprobs {
        Some(n) => {
            let log_z = log_sum_exp(logits);
            let mut top: Vec<(u32, f32)> =
                top_k_indices(logits, n).into_iter().map(|i| (i as u32, logits[i] - log_z)).collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            (Some(logits[token] - log_z), top)
        }
        None => (None, Vec::new()),
    };
    Ok(Sampled { token: token as u32, logprob, top })
}

fn apply_penalties(logits: &mut [f32], params: &SamplingParams, history: &TokenHistory) {
    if params.repetition_penalty != 1.0 {
        let r = params.repetition_penalty;
        for &t in history.prompt.keys().chain(history.output.keys().filter(|t| !history.prompt.contains_key(t))) {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = if *l > 0.0 { *l / r } else { *l * r };
            }
        }
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        for (&t, &count) in &history.output {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= params.presence_penalty + params.frequency_penalty * count as f32;
            }
        }
    }
}

/// Sets every logit `mask` rules out to `-inf`, a 32-token word at a time: a constraint's
/// masks are mostly whole words of zeros (a JSON value allows a few hundred of 49,152 tokens)
/// or of ones. Tokens past the mask's end are ruled out.
fn apply_mask(logits: &mut [f32], mask: &[u32]) {
    for (w, chunk) in logits.chunks_mut(32).enumerate() {
        match mask.get(w).copied().unwrap_or(0) {
            u32::MAX => {}
            0 => chunk.fill(f32::NEG_INFINITY),
            word => {
                for (bit, l) in chunk.iter_mut().enumerate() {
                    if word >> bit & 1 == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// Index of the largest finite logit; ties go to the lowest index. `NaN` is never taken.
///
/// Two passes the compiler vectorises: the largest value in 16 lanes (`if l > m { l } else
/// { m }`, which ignores `NaN` as the one-pass scan's `l > best` did), then the first index
/// holding it. The sampler runs on the engine thread between forward passes, once per sampled
/// sequence: the one-pass scan's branch per logit took about 50 µs of a 49,152-token row
/// (`cargo bench -p dspark-host --bench sampler`).
fn argmax(logits: &[f32]) -> Option<usize> {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m { l } else { *m };
        }
    }
    let max = lanes.iter().chain(tail).fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m });
    if max == f32::NEG_INFINITY {
        return None;
    }
    let chunk = logits.chunks(LANES).position(|c| c.iter().fold(false, |found, &l| found | (l == max)))?;
    let at = logits[chunk * LANES..].iter().position(|&l| l == max)?;
    Some(chunk * LANES + at)
}

/// The sum of `weights` in f64, in 8 interleaved partial sums (a fixed order, so the same
/// weights always give the same total): one chain of dependent adds took about 65 µs for a
/// 49,152-token row.
fn total_weight(weights: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let chunks = weights.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&p| p as f64).sum();
    for chunk in chunks {
        for (sum, &p) in lanes.iter_mut().zip(chunk) {
            *sum += p as f64;
        }
    }
    ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7])) + tail
}

/// `ln(sum(exp(logits)))`: each `exp(l - max)` in f32 vectors ([`exp_in_place`], what
/// `f32::exp` gives) summed in f64 ([`total_weight`]). Scoring a prompt computes this for every
/// prompt row; a scalar f64 `exp` per logit took about a tenth of such a request's time
/// (`perf`, 256-token prompts on SmolLM2). A term below `exp(-80)` (a `-inf` logit's among
/// them) is taken as `exp(-80)`, which changes no sum that holds the best logit's 1.
fn log_sum_exp(logits: &[f32]) -> f32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return max;
    }
    let mut terms: Vec<f32> = logits.iter().map(|&l| (l - max).max(-80.0)).collect();
    exp_in_place(&mut terms);
    max + total_weight(&terms).ln() as f32
}

/// Indices of the `k` largest finite logits (ties by lower index), best first: one pass
/// keeping the best `k` seen, since `k` is at most [`MAX_TOP_LOGPROBS`] and a logit beats the
/// `k`-th best rarely once a few hundred are seen. (Collecting every finite index and
/// selecting among them cost about as much as the row's softmax.)
fn top_k_indices(logits: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    if k == 0 {
        return best;
    }
    for (i, &l) in logits.iter().enumerate() {
        // `NaN` and `-inf` are never taken; a logit equal to the k-th best loses (lower
        // index first).
        let finite = l > f32::NEG_INFINITY;
        let beats_kth = best.len() < k || l > logits[best[k - 1]];
        if !finite || !beats_kth {
            continue;
        }
        let at = best.partition_point(|&b| logits[b] >= l);
        best.insert(at, i);
        best.truncate(k);
    }
    best
}

/// Temperature, top-k, min-p, top-p, then a draw. `best` is the argmax (always kept).
///
/// Every token's weight `exp((l - max) / T)` is computed in f32 vectors (`exp` exactly
/// `f32::exp`, [`exp_in_place`]) and summed in f64 ([`total_weight`]); tokens below 1e-12 of the best (they
/// cannot matter) and below `min_p` weigh 0. The candidates are then walked heaviest first
/// (ties: lowest id), but only as far as the nucleus and the draw reach ([`SortedPrefix`]),
/// and first among the candidates of at least 1e-4 of the best ([`HEAD`]): in a language
/// model's row those are a few dozen, and the draw lands among them almost always; when it
/// does not, the same walk runs over every candidate. Computing `exp` in f64 and sorting
/// every candidate took about 2.7 ms per sampled token of a 49,152-token row, more than a
/// forward pass (`cargo bench -p dspark-host --bench sampler`). The token drawn is a fixed
/// function of the logits, the parameters and the random stream.
fn draw(logits: &[f32], params: &SamplingParams, rng: &mut Rng, best: usize) -> usize {
    let weights = weights(logits, params, logits[best]);
    let total = total_weight(&weights);
    let u = rng.next_f64();
    // The candidates of at least `at_least`, 16 weights tested at a time.
    let candidates = |at_least: f32| -> Vec<(usize, f64)> {
        let mut kept = Vec::new();
        for (c, chunk) in weights.chunks(16).enumerate() {
            if chunk.iter().fold(false, |any, &p| any | (p > 0.0 && p >= at_least)) {
                let heavy = chunk.iter().enumerate().filter(|&(_, &p)| p > 0.0 && p >= at_least);
                kept.extend(heavy.map(|(j, &p)| (c * 16 + j, p as f64)));
            }
        }
        kept
    };
    if let Some(token) = walk(&mut candidates(HEAD), false, total, params, u) {
        return token;
    }
    walk(&mut candidates(0.0), true, total, params, u).unwrap_or(best)
}

/// Every token's weight relative to the best one's (`max`, its logit): `exp((l - max) / T)`,
/// 0 below 1e-12 (it cannot matter to a draw) or below `min_p`.
fn weights(logits: &[f32], params: &SamplingParams, max: f32) -> Vec<f32> {
    let inv_t = 1.0 / params.temperature;
    let min_p = if params.min_p > 0.0 { params.min_p as f64 } else { 0.0 };
    let floor = if min_p > 0.0 { (min_p.ln() as f32).max(-27.6) } else { -27.6 };
    // In f32 vectors: `z` is rounded to f32 for the vector `exp` anyway. A token below the
    // floor (a masked one is `-inf`) gets `z = -80`, inside the vector `exp`'s range (from
    // |z| >= 88 it calls libm, a call per masked token), and weighs `exp(-80)`, under 1e-34:
    // far below anything `exp(floor)` (at least 1e-12) gives, so it is told apart and zeroed.
    let mut weights: Vec<f32> = logits
        .iter()
        .map(|&l| {
            let z = (l - max) * inv_t;
            if z >= floor { z } else { -80.0 }
        })
        .collect();
    exp_in_place(&mut weights);
    weights.iter_mut().for_each(|p| {
        if *p < 1e-30 || (*p as f64) < min_p {
            *p = 0.0;
        }
    });
    weights
}

/// The weight (relative to the best token's 1) from which a candidate is in the head
/// [`draw`] walks first.
const HEAD: f32 = 1e-4;

/// Top-k, top-p and the draw at `u` over `candidates`, walked heaviest first; `total` is the
/// weight of every candidate. When `complete` is false, `candidates` are only those above a
/// weight every other candidate is below, and `None` means the answer lies beyond them.
fn walk(
    candidates: &mut [(usize, f64)],
    complete: bool,
    mut total: f64,
    params: &SamplingParams,
    u: f64,
) -> Option<usize> {
    let mut candidates = candidates;
    let truncated = params.top_k > 0;
    if truncated {
        if params.top_k < candidates.len() {
            candidates.select_nth_unstable_by(params.top_k - 1, heavier_first);
            candidates = &mut candidates[..params.top_k];
        } else if !complete {
            return None;
        }
    }
    let mut walk = SortedPrefix::new(candidates);
    if truncated {
        // The top k, summed heaviest first (an order that does not depend on the selection).
        let k = walk.len();
        total = walk.sorted(k).iter().map(|c| c.1).sum();
    }
    let mut keep = walk.len();
    if params.top_p < 1.0 {
        // The nucleus: the heaviest candidates whose share of the mass reaches top_p.
        let mut cumulative = 0.0;
        let mut i = 0;
        loop {
            let Some((_, p)) = walk.get(i) else {
                if !complete {
                    return None;
                }
                break;
            };
            cumulative += p / total;
            i += 1;
            if cumulative >= params.top_p as f64 {
                break;
            }
        }
        keep = i;
        total = walk.sorted(keep).iter().map(|c| c.1).sum();
    }
    let mut target = u * total;
    for i in 0..keep {
        let (token, p) = walk.get(i)?;
        if target < p {
            return Some(token);
        }
        target -= p;
    }
    if !complete && !truncated && params.top_p >= 1.0 {
        // Nothing cut the head short, so the target lies in the lighter candidates left out.
        return None;
    }
    // Rounding left the target past the last weight: the lightest kept candidate.
    keep.checked_sub(1).and_then(|last| walk.get(last)).map(|c| c.0)
}

/// Heaviest first, ties to the lowest id: the order candidates are walked in.
fn heavier_first(a: &(usize, f64), b: &(usize, f64)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Candidates sorted heaviest first on demand: [`SortedPrefix::get`] sorts only as far as it
/// is asked, selecting the heaviest of the rest a growing run at a time, so a draw that ends
/// within the first few dozen candidates (the usual case) never sorts the thousands behind.
struct SortedPrefix<'a> {
    items: &'a mut [(usize, f64)],
    /// `items[..sorted]` are the heaviest, in order.
    sorted: usize,
}

impl<'a> SortedPrefix<'a> {
    /// The first run selected and sorted.
    const FIRST_RUN: usize = 64;

    fn new(items: &'a mut [(usize, f64)]) -> Self {
        Self { items, sorted: 0 }
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    /// The `n` heaviest, in order.
    fn sorted(&mut self, n: usize) -> &[(usize, f64)] {
        self.sort_to(n);
        &self.items[..n.min(self.items.len())]
    }

    /// The `i`-th heaviest.
    fn get(&mut self, i: usize) -> Option<(usize, f64)> {
        self.sort_to(i + 1);
        self.items.get(i).copied()
    }

    fn sort_to(&mut self, n: usize) {
        let len = self.items.len();
        while self.sorted < n.min(len) {
            let end = (self.sorted.max(Self::FIRST_RUN / 4) * 4).max(n).min(len);
            let rest = &mut self.items[self.sorted..];
            if end < len {
                rest.select_nth_unstable_by(end - self.sorted - 1, heavier_first);
            }
            self.items[self.sorted..end].sort_unstable_by(heavier_first);
            self.sorted = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams { temperature, ..Default::default() }
    }

    #[test]
    fn greedy_takes_the_lowest_best_id() {
        let mut logits = vec![1.0, 3.0, 3.0, 2.0];
        let s = sample(&mut logits, &params(0.0), &TokenHistory::default(), None, &[], &mut Rng::new(1)).unwrap();
        assert_eq!(s.token, 1);
    }

    #[test]
    fn the_mask_is_applied_before_sampling() {
        let mask = [0b1001u32];
        for seed in 0..50 {
            let mut logits = vec![0.0, 10.0, 10.0, 0.5];
            let s = sample(&mut logits, &params(1.0), &TokenHistory::default(), Some(&mask), &[], &mut Rng::new(seed))
                .unwrap();
            assert!(s.token == 0 || s.token == 3, "{s:?}");
        }
        let mut logits = vec![0.0; 4];
        let none = [0u32];
        assert_eq!(
            sample(&mut logits, &params(0.0), &TokenHistory::default(), Some(&none), &[], &mut Rng::new(0)),
            Err(SampleError::NothingAllowed)
        );
    }

    #[test]
    fn seeds_reproduce_and_differ() {
        let draw_all = |seed| {
            let mut rng = Rng::new(seed);
            (0..32)
                .map(|_| {
                    let mut logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
                    sample(&mut logits, &params(1.0), &TokenHistory::default(), None, &[], &mut rng).unwrap().token
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(draw_all(7), draw_all(7));
        assert_ne!(draw_all(7), draw_all(8));
    }

    #[test]
    fn top_k_top_p_and_min_p_truncate() {
        let p = SamplingParams { top_k: 2, ..params(1.0) };
        for seed in 0..100 {
            let mut logits = vec![5.0, 4.9, 1.0, 4.8];
            let s = sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(seed)).unwrap();
            assert!(s.token == 0 || s.token == 1);
        }
        // Probabilities ~ [0.66, 0.24, 0.09, ...]: top_p 0.5 keeps only the first.
        let p = SamplingParams { top_p: 0.5, ..params(1.0) };
        for seed in 0..100 {
            let mut logits = vec![3.0, 2.0, 1.0, 0.0];
            assert_eq!(
                sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(seed)).unwrap().token,
                0
            );
        }
        let p = SamplingParams { min_p: 0.5, ..params(1.0) };
        for seed in 0..100 {
            let mut logits = vec![3.0, 2.9, 1.0, 0.0];
            let t = sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(seed)).unwrap().token;
            assert!(t <= 1);
        }
    }

    #[test]
    fn penalties_follow_openai_and_vllm() {
        let mut history = TokenHistory::new(&[0]);
        history.push_output(1);
        history.push_output(1);
        let p =
            SamplingParams { presence_penalty: 0.5, frequency_penalty: 0.25, repetition_penalty: 2.0, ..params(0.0) };
        let mut logits = vec![4.0, 4.0, -1.0, 0.0];
        apply_penalties(&mut logits, &p, &history);
        assert_eq!(logits, vec![2.0, 2.0 - 0.5 - 0.5, -1.0, 0.0]);
    }

    #[test]
    fn logit_bias_is_added_first_and_steers_greedy_and_logprobs() {
        let bias = |entries: &[(u32, f64)]| LogitBias::new(entries.iter().copied(), 4).unwrap();
        // +100 on the least likely token makes greedy take it; its logprob is the biased one.
        let p = SamplingParams { logit_bias: bias(&[(2, 100.0)]), logprobs: Some(1), ..params(0.0) };
        let mut logits = vec![4.0, 3.0, -1.0, 0.0];
        let s = sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(0)).unwrap();
        assert_eq!(s.token, 2);
        assert_eq!(logits[2], 99.0);
        assert!(s.logprob.unwrap() > -1e-6, "{s:?}");
        // -100 on the best token hands greedy the runner-up, whatever the seed of a draw.
        let p = SamplingParams { logit_bias: bias(&[(0, -100.0)]), ..params(1.0) };
        for seed in 0..50 {
            let mut logits = vec![4.0, 3.0, -1.0, 0.0];
            let s = sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(seed)).unwrap();
            assert_ne!(s.token, 0, "seed {seed}");
        }
        // The bias comes before the repetition penalty: (1 - 2) * 2 = -2, where the other
        // order would give 1 / 2 - 2 = -1.5.
        let p = SamplingParams { logit_bias: bias(&[(0, -2.0)]), repetition_penalty: 2.0, ..params(0.0) };
        let mut logits = vec![1.0, -1.75, -3.0, -3.0];
        let s = sample(&mut logits, &p, &TokenHistory::new(&[0]), None, &[], &mut Rng::new(0)).unwrap();
        assert_eq!(logits[0], -2.0);
        assert_eq!(s.token, 1);
        // A finite bias never reopens a masked token, nor closes the only allowed one.
        let p = SamplingParams { logit_bias: bias(&[(0, 100.0), (3, -100.0)]), ..params(0.0) };
        let mut logits = vec![4.0, 3.0, -1.0, 0.0];
        let s = sample(&mut logits, &p, &TokenHistory::default(), Some(&[0b1000]), &[], &mut Rng::new(0)).unwrap();
        assert_eq!(s.token, 3);
    }

    #[test]
    fn logit_bias_maps_are_checked_sorted_and_deduplicated() {
        let b = LogitBias::new([(3, 1.0), (1, -5.0), (3, 2.5)], 4).unwrap();
        assert_eq!(b.entries(), &[(1, -5.0), (3, 2.5)]);
        assert_eq!(
            LogitBias::new([(4, 1.0)], 4).unwrap_err().to_string(),
            "`logit_bias` names token 4, outside the vocabulary (ids 0 to 3)"
        );
        assert_eq!(
            LogitBias::new([(2, 100.5)], 4).unwrap_err().to_string(),
            "`logit_bias` for token 2 must be between -100 and 100, got 100.5"
        );
        assert!(LogitBias::new([(2, f64::NAN)], 4).is_err());
        assert!(LogitBias::new([(0, -100.0), (1, 100.0)], 4).is_ok());
    }

    #[test]
    fn allowed_tokens_narrow_sampling_and_yield_to_the_mask() {
        let allowed = |ids: &[u32]| Some(AllowedTokens::new(ids.iter().copied(), 6).unwrap());
        let greedy = |p: &SamplingParams, mask: Option<&[u32]>| {
            let mut logits = vec![5.0, 4.0, 3.0, 2.0, 1.0, 0.0];
            let s = sample(&mut logits, p, &TokenHistory::default(), mask, &[], &mut Rng::new(0)).unwrap();
            (s.token, logits)
        };
        let p = SamplingParams { allowed_tokens: allowed(&[4, 2]), ..params(0.0) };
        let (token, logits) = greedy(&p, None);
        assert_eq!(token, 2);
        let ninf = f32::NEG_INFINITY;
        assert_eq!(logits, vec![ninf, ninf, 3.0, ninf, 1.0, ninf]);
        // With a mask: the intersection.
        assert_eq!(greedy(&p, Some(&[0b01_0011])).0, 4);
        // An empty intersection leaves the mask alone to decide.
        assert_eq!(greedy(&p, Some(&[0b00_1010])).0, 1);
        // Sampling at temperature 1 never leaves the set.
        let p = SamplingParams { allowed_tokens: allowed(&[1, 5]), ..params(1.0) };
        for seed in 0..200 {
            let mut logits = vec![5.0, 1.0, 3.0, 2.0, 1.0, 0.0];
            let t = sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(seed)).unwrap().token;
            assert!(t == 1 || t == 5, "{t}");
        }
    }

    #[test]
    fn allowed_token_lists_are_checked_sorted_and_deduplicated() {
        assert_eq!(AllowedTokens::new([3, 1, 3], 4).unwrap().ids(), &[1, 3]);
        assert_eq!(
            AllowedTokens::new([], 4).unwrap_err().to_string(),
            "`allowed_token_ids` must name at least one token"
        );
        assert_eq!(
            AllowedTokens::new([1, 4], 4).unwrap_err().to_string(),
            "`allowed_token_ids` names token 4, outside the vocabulary (ids 0 to 3)"
        );
    }

    #[test]
    fn bad_words_ban_the_token_that_would_complete_them() {
        let words = vec![vec![7], vec![1, 2, 3], vec![5, 3]];
        let bans = |output: &[u32]| {
            let mut banned = Vec::new();
            bad_word_bans(&words, output, &mut banned);
            banned
        };
        assert_eq!(bans(&[]), vec![7]);
        assert_eq!(bans(&[9, 1, 2]), vec![7, 3]);
        assert_eq!(bans(&[1, 2, 5]), vec![7, 3]);
        assert_eq!(bans(&[2, 1]), vec![7]);
    }

    #[test]
    fn banned_tokens_are_never_drawn_unless_nothing_else_is_allowed() {
        let run = |mask: Option<&[u32]>, temperature: f32, seed: u64| {
            let mut logits = vec![1.0, 6.0, 2.0, 5.0];
            sample(&mut logits, &params(temperature), &TokenHistory::default(), mask, &[1, 3], &mut Rng::new(seed))
                .unwrap()
                .token
        };
        assert_eq!(run(None, 0.0, 0), 2);
        for seed in 0..200 {
            let t = run(None, 1.0, seed);
            assert!(t == 0 || t == 2, "{t}");
        }
        // The mask allows banned tokens only: they stay (the constraint decides).
        assert_eq!(run(Some(&[0b1010]), 0.0, 0), 1);
        assert_eq!(run(Some(&[0b1000]), 0.0, 0), 3);
        assert_eq!(run(Some(&[0b1100]), 0.0, 0), 2);
    }

    #[test]
    fn logprobs_are_normalised_and_ordered() {
        let p = SamplingParams { logprobs: Some(2), ..params(0.0) };
        let mut logits = vec![0.0, 2.0f32.ln(), 0.0];
        let s = sample(&mut logits, &p, &TokenHistory::default(), None, &[], &mut Rng::new(0)).unwrap();
        assert_eq!(s.token, 1);
        assert!((s.logprob.unwrap() - 0.5f32.ln()).abs() < 1e-6);
        assert_eq!(s.top.len(), 2);
        assert_eq!(s.top[0].0, 1);
        assert_eq!(s.top[1].0, 0);
        assert!((s.top[1].1 - 0.25f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn a_given_token_is_scored_with_its_rank_and_the_best_alternatives() {
        // Probabilities 1/8, 1/2, 1/4, 1/8.
        let logits = vec![0.0, 4.0f32.ln(), 2.0f32.ln(), 0.0];
        let s = score(&logits, 2, 2);
        assert_eq!((s.token, s.rank), (2, 2));
        assert!((s.logprob - 0.25f32.ln()).abs() < 1e-6, "{}", s.logprob);
        assert_eq!(s.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(s.top[1].1, s.logprob, "the token's own entry is the same number");
        // Ties rank alike; the best tied alternatives come by id.
        let tied = score(&logits, 3, 4);
        assert_eq!(tied.rank, 3);
        assert_eq!(tied.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2, 0, 3]);
        let best = score(&logits, 1, 0);
        assert_eq!((best.rank, best.top.len()), (1, 0));
        assert!((best.logprob - 0.5f32.ln()).abs() < 1e-6);
    }

    #[test]
    fn top_k_and_log_sum_exp_equal_their_definitions() {
        for (r, row) in rows().iter().enumerate() {
            let mut by_sort: Vec<usize> = (0..row.len()).filter(|&i| row[i] > f32::NEG_INFINITY).collect();
            by_sort.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            for k in [0, 1, 2, 5, 20] {
                let want: Vec<usize> = by_sort.iter().copied().take(k).collect();
                assert_eq!(top_k_indices(row, k), want, "row {r}, k {k}");
            }
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exact = max as f64 + row.iter().map(|&l| ((l - max) as f64).exp()).sum::<f64>().ln();
            let got = log_sum_exp(row) as f64;
            assert!((got - exact).abs() <= 1e-6 * exact.abs().max(1.0), "row {r}: {got} against {exact}");
        }
    }

    /// Rows of logits of several shapes: peaked like a language model's, flat, with ties,
    /// with `-inf` (masked) stretches, and short.
    fn rows() -> Vec<Vec<f32>> {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32
        };
        let mut rows = Vec::new();
        for n in [1usize, 5, 31, 33, 100, 1000, 5000] {
            let flat: Vec<f32> = (0..n).map(|_| next() * 2.0 - 1.0).collect();
            let mut peaked: Vec<f32> = flat.iter().map(|v| v * 3.0).collect();
            for i in (0..n).step_by(97) {
                peaked[i] = 12.0 + next() * 4.0;
            }
            let ties: Vec<f32> = (0..n).map(|i| (i % 4) as f32).collect();
            let mut masked = peaked.clone();
            for (i, l) in masked.iter_mut().enumerate() {
                if i % 3 != 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
            rows.extend([flat, peaked, ties, masked]);
        }
        rows
    }

    /// The draw as a plain reading of its definition: every candidate sorted, then top-k,
    /// top-p and the walk, with the totals [`draw`] uses.
    fn draw_by_full_sort(logits: &[f32], params: &SamplingParams, rng: &mut Rng, best: usize) -> usize {
        let weights = weights(logits, params, logits[best]);
        let mut total = total_weight(&weights);
        let mut candidates: Vec<(usize, f64)> =
            weights.iter().enumerate().filter(|&(_, &p)| p > 0.0).map(|(i, &p)| (i, p as f64)).collect();
        candidates.sort_by(heavier_first);
        if params.top_k > 0 {
            candidates.truncate(params.top_k);
            total = candidates.iter().map(|c| c.1).sum();
        }
        if params.top_p < 1.0 {
            let mut cumulative = 0.0;
            let mut keep = candidates.len();
            for (i, &(_, p)) in candidates.iter().enumerate() {
                cumulative += p / total;
                if cumulative >= params.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            candidates.truncate(keep);
            total = candidates.iter().map(|c| c.1).sum();
        }
        let mut target = rng.next_f64() * total;
        for &(token, p) in &candidates {
            if target < p {
                return token;
            }
            target -= p;
        }
        candidates.last().map_or(best, |c| c.0)
    }

    #[test]
    fn the_partial_walk_draws_what_a_full_sort_draws() {
        let settings = [
            params(1.0),
            params(0.7),
            SamplingParams { top_p: 0.9, ..params(0.8) },
            SamplingParams { top_p: 0.3, ..params(1.3) },
            SamplingParams { top_k: 5, ..params(1.0) },
            SamplingParams { top_k: 200, top_p: 0.95, ..params(0.9) },
            SamplingParams { min_p: 0.05, ..params(1.0) },
            SamplingParams { min_p: 0.2, top_p: 0.8, top_k: 40, ..params(0.6) },
        ];
        let mut draws = 0;
        for row in rows() {
            let best = argmax(&row).unwrap();
            for p in &settings {
                for seed in 0..40 {
                    let got = draw(&row, p, &mut Rng::new(seed), best);
                    let want = draw_by_full_sort(&row, p, &mut Rng::new(seed), best);
                    assert_eq!(got, want, "{} logits, {p:?}, seed {seed}", row.len());
                    draws += 1;
                }
            }
        }
        assert_eq!(draws, 7 * 4 * 8 * 40);
    }

    #[test]
    fn weights_are_the_scaled_exp_and_zero_below_the_floor_or_min_p() {
        let logits = [5.0f32, 4.0, f32::NEG_INFINITY, -30.0, 5.0 - 27.0 * 0.5, -100.0, 3.0];
        for p in [params(0.5), SamplingParams { min_p: 0.2, ..params(1.0) }] {
            let got = weights(&logits, &p, 5.0);
            for (&l, &w) in logits.iter().zip(&got) {
                let z = (l - 5.0) / p.temperature;
                let floor = if p.min_p > 0.0 { (p.min_p as f64).ln() as f32 } else { -27.6 };
                let want = if z >= floor && (z.exp() as f64) >= p.min_p as f64 { z.exp() } else { 0.0 };
                assert_eq!(w.to_bits(), want.to_bits(), "logit {l}, {p:?}");
            }
        }
    }

    #[test]
    fn argmax_and_the_mask_equal_their_one_token_at_a_time_definitions() {
        let plain_argmax = |logits: &[f32]| {
            let mut best: Option<(usize, f32)> = None;
            for (i, &l) in logits.iter().enumerate() {
                if l > f32::NEG_INFINITY && best.is_none_or(|(_, b)| l > b) {
                    best = Some((i, l));
                }
            }
            best.map(|(i, _)| i)
        };
        let mut rows = rows();
        rows.push(vec![f32::NAN, 1.0, f32::NAN, 1.0]);
        rows.push(vec![f32::NEG_INFINITY; 40]);
        rows.push(vec![f32::NAN; 3]);
        rows.push(vec![f32::INFINITY, 2.0, f32::INFINITY]);
        for row in &rows {
            assert_eq!(argmax(row), plain_argmax(row), "{row:?}");
            // Masks of whole, empty and partial words, shorter than the row or not.
            for mask in [vec![u32::MAX; 2], vec![0x8000_0001, 0, u32::MAX], vec![0xAAAA_5555; 200], vec![]] {
                let mut got = row.clone();
                apply_mask(&mut got, &mask);
                let want: Vec<f32> = row
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| if mask_allows(&mask, i) { l } else { f32::NEG_INFINITY })
                    .collect();
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "mask {mask:x?}"
                );
            }
        }
    }

    #[test]
    fn ranges_are_checked_with_the_parameter_name() {
        let bad = SamplingParams { top_p: 0.0, ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().to_string(), "`top_p` must be in (0, 1], got 0");
        assert!(SamplingParams::default().validate().is_ok());
    }
}
