//! The continuous-batching scheduler.
//!
//! Every sequence is a token list (prompt, then generated and forced tokens) of which the
//! first `num_computed` have K/V in the cache. Each step feeds every scheduled sequence its
//! next uncomputed tokens, up to a per-step token budget (`max_num_batched_tokens`):
//!
//! - a decoding sequence has one pending token (the last sampled one);
//! - a sequence that received a fast-forward span has `1 + span` pending tokens: a
//!   multi-token chunk, computed in one step;
//! - a sequence in prefill has the rest of its prompt pending and gets as much as the budget
//!   leaves (chunked prefill).
//!
//! Running sequences come first (those past their prompt before those still prefilling, each
//! in arrival order), then waiting ones are admitted first-come first-served while
//! `max_num_seqs`, the budget and free blocks allow. A newly admitted sequence first takes
//! whatever full blocks of its prefix are cached. When blocks run out for a running sequence,
//! the latest-arrived running sequence is preempted: its blocks are freed and it goes back to
//! the front of the queue with its tokens, to be recomputed (vLLM's recompute preemption).
//! A sequence is logits-ready ("sample") when a step computes up to its last token.
//!
//! **Scored prompts.** A sequence whose prompt tokens are scored (vLLM's `prompt_logprobs`,
//! OpenAI's `echo` with `logprobs`: [`Scheduler::set_scores_prompt`]) needs the logits of
//! every prompt row, so it takes no cached prefix (those rows would not be computed), and
//! its prompt chunks share [`MAX_PROMPT_LOGITS_ROWS`] rows per step: each logits row is a
//! vocabulary of floats (128 rows of a 152k vocabulary are 78 MB), where a plain prefill
//! chunk keeps only its last row's.
//!
//! **Unconstrained neighbours.** A constrained sequence's fast-forward chunk adds rows to a
//! step, and on a CPU every row costs compute that the whole batch waits for (two cores:
//! about a third of a decode step per extra row with one sequence running, about a row's
//! share once the step is compute-bound). So while an unconstrained ("plain") sequence is
//! decoding, the constrained ones get at most `extra_rows_beside_plain` rows beyond their
//! first per step, in total, and a chunk that does not fit is fed over several steps (still
//! without sampling its forced tokens). With no plain sequence decoding, chunks take what
//! the token budget allows: constrained neighbours gain from each other's chunks. The rows
//! left ([`SchedulerOutput::extra_rows_left`]) also bound the engine's drafts for
//! constrained sequences. vLLM has no chunks, so its neighbours see one row per sequence;
//! with the default of 0 ours see the same.

use std::collections::{HashMap, VecDeque};

use super::blocks::{BlockId, BlockManager, PrefixStats};

/// A sequence's id, unique within an engine.
pub type SeqId = u64;

/// The most prompt rows of scored prompts fed per step (see the module docs).
pub const MAX_PROMPT_LOGITS_ROWS: usize = 128;

/// Limits of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens fed to the model per step.
    pub max_num_batched_tokens: usize,
    /// While a plain (unconstrained) sequence is decoding, the most rows beyond one per
    /// sequence that constrained sequences past their prompt get per step, in total (see the
    /// module docs); `usize::MAX`: no limit.
    pub extra_rows_beside_plain: usize,
}

/// One sequence's state.
#[derive(Debug)]
pub struct Sequence {
    /// Prompt followed by generated tokens.
    pub tokens: Vec<u32>,
    /// Tokens of the prompt.
    pub prompt_len: usize,
    /// Leading tokens whose K/V are in the cache.
    pub num_computed: usize,
    /// Times this sequence was preempted.
    pub preemptions: u32,
    /// Unconstrained: its steps are one row each, and it is the neighbour that
    /// [`SchedulerConfig::extra_rows_beside_plain`] protects.
    pub plain: bool,
    /// Its prompt rows' logits are wanted ([`Scheduler::set_scores_prompt`]).
    pub scores_prompt: bool,
    /// Tokens it had computed when last preempted: recomputing them is prefill, not a chunk.
    resume_at: usize,
    block_table: Vec<BlockId>,
    hashed_blocks: usize,
    last_hash: u64,
    arrival: u64,
}

impl Sequence {
    /// The cache blocks holding this sequence, in position order.
    pub fn block_table(&self) -> &[BlockId] {
        &self.block_table
    }

    /// Past its prompt and anything it recomputes after a preemption: what it is fed now
    /// is its last sampled token, with a fast-forward span if one came.
    fn decoding(&self) -> bool {
        self.num_computed >= self.prompt_len.max(self.resume_at)
    }
}

/// One sequence's part of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The sequence.
    pub id: SeqId,
    /// First token fed (= its position).
    pub start: usize,
    /// Tokens fed.
    pub len: usize,
    /// Whether this step reaches the sequence's last token, so its logits are sampled.
    pub sample: bool,
}

/// The plan of one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Sequences fed this step, in batch order.
    pub scheduled: Vec<ScheduledSeq>,
    /// Sequences preempted to make room (they will be recomputed).
    pub preempted: Vec<SeqId>,
    /// Rows beyond one per sequence that constrained sequences may still take this step
    /// (drafts), under [`SchedulerConfig::extra_rows_beside_plain`]; `usize::MAX` when no
    /// plain sequence is decoding.
    pub extra_rows_left: usize,
    /// Constrained sequences whose chunk this step cut to the extra rows allowed.
    pub cut_chunks: usize,
}

impl SchedulerOutput {
    /// Tokens fed this step.
    pub fn num_tokens(&self) -> usize {
        self.scheduled.iter().map(|s| s.len).sum()
    }
}

/// Queues, sequences and the block manager.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    blocks: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    next_arrival: u64,
}

impl Scheduler {
    /// A scheduler over `blocks`.
    pub fn new(config: SchedulerConfig, blocks: BlockManager) -> Self {
        Self { config, blocks, seqs: HashMap::new(), waiting: VecDeque::new(), running: Vec::new(), next_arrival: 0 }
    }

    /// Queues a sequence whose first `prompt_len` tokens are the prompt; `plain` when it is
    /// unconstrained. The caller checks lengths against the model's limits.
    pub fn add(&mut self, id: SeqId, tokens: Vec<u32>, prompt_len: usize, plain: bool) {
        self.next_arrival += 1;
        let seq = Sequence {
            tokens,
            prompt_len,
            num_computed: 0,
            preemptions: 0,
            plain,
            scores_prompt: false,
            resume_at: 0,
            block_table: Vec::new(),
            hashed_blocks: 0,
            last_hash: 0,
            arrival: self.next_arrival,
        };
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
    }

    /// A sequence's state.
    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// Whether the sequence's prompt rows need their logits (scored prompts, see the module
    /// docs): no cached prefix is taken for it while it does, and its prompt chunks are
    /// limited to [`MAX_PROMPT_LOGITS_ROWS`] rows per step.
    pub fn set_scores_prompt(&mut self, id: SeqId, on: bool) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.scores_prompt = on;
        }
    }

    /// Appends generated tokens (sampled or forced) to a sequence.
    pub fn append(&mut self, id: SeqId, tokens: &[u32]) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.tokens.extend_from_slice(tokens);
        }
    }

    /// Removes a finished or cancelled sequence and frees its blocks at once.
    pub fn finish(&mut self, id: SeqId) -> Option<Sequence> {
        let mut seq = self.seqs.remove(&id)?;
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&w| w != id);
        Self::free_blocks(&mut self.blocks, &mut seq);
        Some(seq)
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Sequences waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Whether any sequence is running or waiting.
    pub fn has_work(&self) -> bool {
        !self.seqs.is_empty()
    }

    /// Fraction of the KV cache in use.
    pub fn cache_usage(&self) -> f64 {
        self.blocks.usage()
    }

    /// Prefix-cache counters.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.blocks.prefix_stats()
    }

    fn free_blocks(blocks: &mut BlockManager, seq: &mut Sequence) {
        // The tail first: the LRU then evicts a sequence's last blocks before its prefix.
        for &b in seq.block_table.iter().rev() {
            blocks.release(b);
        }
        seq.block_table.clear();
        seq.hashed_blocks = 0;
        seq.last_hash = 0;
        seq.num_computed = 0;
    }

    fn blocks_needed(&self, seq: &Sequence, tokens: usize) -> usize {
        tokens.div_ceil(self.blocks.block_size()).saturating_sub(seq.block_table.len())
    }

    fn grow(&mut self, id: SeqId, tokens: usize) {
        let need = self.seqs.get(&id).map_or(0, |s| self.blocks_needed(s, tokens));
        for _ in 0..need {
            // The caller checked availability.
            if let (Some(b), Some(seq)) = (self.blocks.allocate(), self.seqs.get_mut(&id)) {
                seq.block_table.push(b);
            }
        }
    }

    fn preempt(&mut self, id: SeqId) {
        if let Some(seq) = self.seqs.get_mut(&id) {
            seq.resume_at = seq.resume_at.max(seq.num_computed);
            Self::free_blocks(&mut self.blocks, seq);
            seq.preemptions += 1;
        }
        self.running.retain(|&r| r != id);
        // Back to the queue in arrival order among the preempted.
        let arrival = self.seqs.get(&id).map_or(0, |s| s.arrival);
        let at = self
            .waiting
            .iter()
            .position(|w| self.seqs.get(w).is_none_or(|s| s.arrival > arrival))
            .unwrap_or(self.waiting.len());
        self.waiting.insert(at, id);
    }

    /// Plans the next step. See the module docs for the policy.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.config.max_num_batched_tokens;
        let mut order = self.running.clone();
        order.sort_by_key(|id| self.seqs.get(id).map(|s| (s.num_computed < s.prompt_len, s.arrival)));
        let plain_decoding = order.iter().filter_map(|id| self.seqs.get(id)).any(|s| s.plain && s.decoding());
        let mut extra_left = plain_decoding.then_some(self.config.extra_rows_beside_plain);
        let mut prompt_rows_left = MAX_PROMPT_LOGITS_ROWS;
        let mut i = 0;
        while i < order.len() && budget > 0 {
            let id = order[i];
            let Some(seq) = self.seqs.get(&id) else {
                i += 1;
                continue;
            };
            let mut n = (seq.tokens.len() - seq.num_computed).min(budget);
            if let Some(left) = extra_left.as_mut()
                && !seq.plain
                && seq.decoding()
                && n > 1
            {
                let whole = n;
                n = n.min(left.saturating_add(1));
                *left -= n - 1;
                out.cut_chunks += usize::from(n < whole);
            }
            let scoring = seq.scores_prompt && seq.num_computed < seq.prompt_len;
            if scoring {
                n = n.min(prompt_rows_left);
            }
            if n == 0 {
                i += 1;
                continue;
            }
            let end = seq.num_computed + n;
            let need = self.blocks_needed(seq, end);
            let mut preempted_self = false;
            while need > self.blocks.num_available() {
                if order.len() > i + 1 {
                    let victim = order.pop().unwrap_or(id);
                    self.preempt(victim);
                    out.preempted.push(victim);
                } else {
                    self.preempt(id);
                    out.preempted.push(id);
                    order.remove(i);
                    preempted_self = true;
                    break;
                }
            }
            if preempted_self {
                continue;
            }
            self.grow(id, end);
            let Some(seq) = self.seqs.get(&id) else { continue };
            out.scheduled.push(ScheduledSeq { id, start: seq.num_computed, len: n, sample: end == seq.tokens.len() });
            budget -= n;
            if scoring {
                prompt_rows_left -= n;
            }
            i += 1;
        }
        if out.preempted.is_empty() {
            self.admit(&mut out, budget, prompt_rows_left);
        }
        out.extra_rows_left = extra_left.unwrap_or(usize::MAX);
        out
    }

    fn admit(&mut self, out: &mut SchedulerOutput, mut budget: usize, mut prompt_rows_left: usize) {
        let block_size = self.blocks.block_size();
        while budget > 0 && self.running.len() < self.config.max_num_seqs {
            let Some(&id) = self.waiting.front() else { break };
            let Some(seq) = self.seqs.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            if seq.block_table.is_empty() && !seq.scores_prompt {
                // Reuse cached full blocks, but always compute the last token: its logits
                // are needed and its block must not be shared.
                let max_blocks = (seq.tokens.len() - 1) / block_size;
                let (found, last_hash) = self.blocks.lookup_prefix(&seq.tokens, max_blocks);
                seq.num_computed = found.len() * block_size;
                seq.hashed_blocks = found.len();
                seq.last_hash = last_hash;
                seq.block_table = found;
            }
            let scoring = seq.scores_prompt && seq.num_computed < seq.prompt_len;
            let n =
                (seq.tokens.len() - seq.num_computed).min(if scoring { budget.min(prompt_rows_left) } else { budget });
            if n == 0 {
                // The step's scored prompt rows are taken: admitted in a later step, in order.
                break;
            }
            let end = seq.num_computed + n;
            let need = end.div_ceil(block_size).saturating_sub(seq.block_table.len());
            if need > self.blocks.num_available() {
                // Not now: give the shared blocks back rather than sit on them.
                Self::free_blocks(&mut self.blocks, seq);
                break;
            }
            self.waiting.pop_front();
            self.running.push(id);
            self.grow(id, end);
            let Some(seq) = self.seqs.get(&id) else { continue };
            out.scheduled.push(ScheduledSeq { id, start: seq.num_computed, len: n, sample: end == seq.tokens.len() });
            budget -= n;
            if scoring {
                prompt_rows_left -= n;
            }
        }
    }

    /// Records that a step ran: the fed tokens are computed, and newly full blocks are
    /// registered for prefix sharing.
    pub fn complete(&mut self, output: &SchedulerOutput) {
        for s in &output.scheduled {
            let Some(seq) = self.seqs.get_mut(&s.id) else { continue };
            seq.num_computed = (s.start + s.len).min(seq.tokens.len());
            Self::register_full_blocks(&mut self.blocks, seq);
        }
    }

    /// Makes sure the sequence has cache slots for `n` tokens past its last (speculated
    /// tokens, see [`super::LlmEngine`]), taking free blocks if it needs them; never
    /// preempts. Returns whether the slots are there.
    pub fn reserve_slots(&mut self, id: SeqId, n: usize) -> bool {
        let Some(seq) = self.seqs.get(&id) else { return false };
        let total = seq.tokens.len() + n;
        if self.blocks_needed(seq, total) > self.blocks.num_available() {
            return false;
        }
        self.grow(id, total);
        true
    }

    /// Marks the sequence's next `n` tokens computed: their K/V were written by a step that
    /// fed them before they were appended (an accepted speculated token). Full blocks are
    /// registered for prefix sharing only now that their tokens are known.
    pub fn mark_computed(&mut self, id: SeqId, n: usize) {
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        seq.num_computed = (seq.num_computed + n).min(seq.tokens.len());
        Self::register_full_blocks(&mut self.blocks, seq);
    }

    fn register_full_blocks(blocks: &mut BlockManager, seq: &mut Sequence) {
        let block_size = blocks.block_size();
        while (seq.hashed_blocks + 1) * block_size <= seq.num_computed {
            let k = seq.hashed_blocks;
            let tokens = &seq.tokens[k * block_size..(k + 1) * block_size];
            seq.last_hash = blocks.register_full(seq.block_table[k], seq.last_hash, tokens);
            seq.hashed_blocks += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scheduler(num_blocks: usize, block_size: usize, max_num_seqs: usize, budget: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig { max_num_seqs, max_num_batched_tokens: budget, extra_rows_beside_plain: usize::MAX },
            BlockManager::new(num_blocks, block_size, true),
        )
    }

    #[test]
    fn prefill_is_chunked_by_the_budget_and_decodes_go_first() {
        let mut s = scheduler(64, 4, 8, 10);
        s.add(1, (0..25).collect(), 25, false);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 1, start: 0, len: 10, sample: false }]);
        s.complete(&plan);
        s.add(2, vec![100, 101, 102], 3, false);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 1, start: 10, len: 10, sample: false }]);
        s.complete(&plan);
        let plan = s.schedule();
        assert_eq!(
            plan.scheduled,
            vec![
                ScheduledSeq { id: 1, start: 20, len: 5, sample: true },
                ScheduledSeq { id: 2, start: 0, len: 3, sample: true },
            ]
        );
        s.complete(&plan);
        // Both decode now; a forced span makes sequence 2 a 4-token chunk.
        s.append(1, &[7]);
        s.append(2, &[8, 9, 10, 11]);
        let plan = s.schedule();
        assert_eq!(
            plan.scheduled,
            vec![
                ScheduledSeq { id: 1, start: 25, len: 1, sample: true },
                ScheduledSeq { id: 2, start: 3, len: 4, sample: true }
            ]
        );
    }

    #[test]
    fn max_num_seqs_limits_admission() {
        let mut s = scheduler(64, 4, 2, 100);
        for id in 0..3 {
            s.add(id, vec![1, 2, 3], 3, false);
        }
        let plan = s.schedule();
        assert_eq!(plan.scheduled.len(), 2);
        assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
        s.complete(&plan);
        s.finish(0);
        s.append(1, &[4]);
        let plan = s.schedule();
        assert_eq!(plan.scheduled.iter().map(|p| p.id).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn running_out_of_blocks_preempts_the_latest_and_recomputes_it() {
        // 4 blocks of 2 slots: two sequences of 3 tokens take 2 blocks each.
        let mut s = scheduler(4, 2, 4, 100);
        s.add(1, vec![1, 2, 3], 3, false);
        s.add(2, vec![4, 5, 6], 3, false);
        let plan = s.schedule();
        assert_eq!(plan.scheduled.len(), 2);
        s.complete(&plan);
        s.append(1, &[7]);
        s.append(2, &[8]);
        let plan = s.schedule();
        s.complete(&plan);
        // Both need a third block for position 4; only sequence 1 gets one.
        s.append(1, &[9]);
        s.append(2, &[10]);
        let plan = s.schedule();
        assert_eq!(plan.preempted, vec![2]);
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 1, start: 4, len: 1, sample: true }]);
        s.complete(&plan);
        assert_eq!(s.get(2).unwrap().num_computed, 0);
        assert_eq!(s.get(2).unwrap().tokens, vec![4, 5, 6, 8, 10]);
        // When sequence 1 ends, 2 is recomputed: its first block survived in the prefix cache
        // (its tail block was evicted for sequence 1), the rest is computed again.
        s.finish(1);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 2, start: 2, len: 3, sample: true }]);
    }

    #[test]
    fn cached_prefixes_are_shared_but_the_last_token_is_computed() {
        let mut s = scheduler(16, 2, 4, 100);
        s.add(1, vec![1, 2, 3, 4, 5], 5, false);
        let plan = s.schedule();
        s.complete(&plan);
        s.finish(1);
        s.add(2, vec![1, 2, 3, 4, 9, 9], 6, false);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 2, start: 4, len: 2, sample: true }]);
        s.complete(&plan);
        s.add(3, vec![1, 2, 3, 4], 4, false);
        let plan = s.schedule();
        // Two full blocks match, but the last token must be computed: only one is shared.
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 3, start: 2, len: 2, sample: true }]);
        assert_eq!(s.prefix_stats().hit_blocks, 3);
    }

    #[test]
    fn scored_prompts_take_no_cached_prefix_and_share_the_prompt_rows_cap() {
        let mut s = scheduler(1024, 2, 4, 1000);
        s.add(1, vec![1, 2, 3, 4, 5], 5, false);
        let plan = s.schedule();
        s.complete(&plan);
        s.finish(1);
        // The same prompt, scored: every row is computed although two blocks are cached.
        s.add(2, vec![1, 2, 3, 4, 5], 5, false);
        s.set_scores_prompt(2, true);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 2, start: 0, len: 5, sample: true }]);
        s.complete(&plan);
        // Two long scored prompts and a plain one: the scored ones share the cap, in order,
        // and the plain one is not held to it.
        let long = |first: u32| -> Vec<u32> { (first..first + 200).collect() };
        s.add(3, long(1000), 200, false);
        s.set_scores_prompt(3, true);
        s.add(4, long(2000), 200, false);
        s.set_scores_prompt(4, true);
        s.add(5, long(3000), 200, false);
        // Sequence 4 waits for the next step, and 5 behind it (first come, first served).
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 3, start: 0, len: MAX_PROMPT_LOGITS_ROWS, sample: false }]);
        s.complete(&plan);
        let (rest, left) = (200 - MAX_PROMPT_LOGITS_ROWS, 2 * MAX_PROMPT_LOGITS_ROWS - 200);
        let plan = s.schedule();
        assert_eq!(
            plan.scheduled,
            vec![
                ScheduledSeq { id: 3, start: MAX_PROMPT_LOGITS_ROWS, len: rest, sample: true },
                ScheduledSeq { id: 4, start: 0, len: left, sample: false },
                ScheduledSeq { id: 5, start: 0, len: 200, sample: true },
            ]
        );
        s.complete(&plan);
        // Once its prompt is scored, a sequence is an ordinary one again.
        s.set_scores_prompt(4, false);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 4, start: left, len: 200 - left, sample: true }]);
    }

    #[test]
    fn finishing_frees_blocks_at_once() {
        let mut s = scheduler(4, 2, 4, 100);
        s.add(1, vec![1, 2, 3, 4, 5, 6, 7], 7, false);
        let plan = s.schedule();
        s.complete(&plan);
        assert_eq!(s.cache_usage(), 1.0);
        s.finish(1);
        assert_eq!(s.cache_usage(), 0.0);
        assert!(!s.has_work());
    }

    #[test]
    fn a_speculated_slot_is_reserved_without_preempting_and_counted_once_kept() {
        // 3 blocks of 2 slots: sequence 1 fills two, sequence 2 the third.
        let mut s = scheduler(3, 2, 4, 100);
        s.add(1, vec![1, 2, 3, 4], 4, false);
        s.add(2, vec![5, 6], 2, false);
        let plan = s.schedule();
        s.complete(&plan);
        // Position 4 of sequence 1 needs a fourth block: none is free, nothing is preempted.
        assert!(!s.reserve_slots(1, 1));
        assert_eq!(s.num_running(), 2);
        s.finish(2);
        assert!(!s.reserve_slots(1, 3), "two more blocks are not there");
        assert!(s.reserve_slots(1, 1));
        assert_eq!(s.get(1).unwrap().block_table().len(), 3);
        // The step fed the guess at position 4; sampling drew it: it is appended and already
        // computed, so the next step starts after it.
        s.append(1, &[9]);
        s.mark_computed(1, 1);
        assert_eq!(s.get(1).unwrap().num_computed, 5);
        s.append(1, &[10]);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![ScheduledSeq { id: 1, start: 5, len: 1, sample: true }]);
    }

    #[test]
    fn chunks_beside_a_plain_decode_get_only_the_extra_rows_allowed() {
        let sched = |extra| {
            let mut s = Scheduler::new(
                SchedulerConfig { max_num_seqs: 8, max_num_batched_tokens: 64, extra_rows_beside_plain: extra },
                BlockManager::new(64, 4, false),
            );
            // 1: plain; 2 and 3: constrained; all past their prompts after one step.
            s.add(1, vec![1, 2, 3], 3, true);
            s.add(2, vec![4, 5, 6], 3, false);
            s.add(3, vec![7, 8], 2, false);
            let plan = s.schedule();
            s.complete(&plan);
            s
        };
        let row = |id, start, len, sample| ScheduledSeq { id, start, len, sample };

        // No extra rows: sequence 2's span of 4 (5 pending tokens) goes one row a step, and
        // it samples after the last; the plain sequence decodes as usual.
        let mut s = sched(0);
        s.append(2, &[40, 41, 42, 43, 44]);
        for step in 0..5 {
            s.append(1, &[10 + step as u32]);
            s.append(3, &[20 + step as u32]);
            let plan = s.schedule();
            assert_eq!(
                plan.scheduled,
                vec![row(1, 3 + step, 1, true), row(2, 3 + step, 1, step == 4), row(3, 2 + step, 1, true)],
                "step {step}"
            );
            assert_eq!(plan.extra_rows_left, 0);
            assert_eq!(plan.cut_chunks, usize::from(step < 4));
            s.complete(&plan);
        }

        // Three extra rows in all: sequence 2 takes them, sequence 3's span waits its turn.
        let mut s = sched(3);
        s.append(1, &[10]);
        s.append(2, &[40, 41, 42, 43, 44]);
        s.append(3, &[50, 51, 52]);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![row(1, 3, 1, true), row(2, 3, 4, false), row(3, 2, 1, false)]);
        assert_eq!((plan.extra_rows_left, plan.cut_chunks), (0, 2));
        s.complete(&plan);

        // Without a plain sequence decoding, chunks are whole again.
        s.finish(1);
        let plan = s.schedule();
        assert_eq!(plan.scheduled, vec![row(2, 7, 1, true), row(3, 3, 2, true)]);
        assert_eq!((plan.extra_rows_left, plan.cut_chunks), (usize::MAX, 0));
    }

    #[test]
    fn recomputing_after_a_preemption_is_not_held_to_the_extra_rows() {
        let mut s = Scheduler::new(
            SchedulerConfig { max_num_seqs: 8, max_num_batched_tokens: 4, extra_rows_beside_plain: 0 },
            BlockManager::new(64, 4, false),
        );
        let row = |id, start, len, sample| ScheduledSeq { id, start, len, sample };
        let step = |s: &mut Scheduler, expected: Vec<ScheduledSeq>| {
            let plan = s.schedule();
            assert_eq!(plan.scheduled, expected);
            s.complete(&plan);
            s.append(1, &[99]);
        };
        s.add(1, vec![1, 2, 3], 3, true);
        s.add(2, vec![4, 5, 6], 3, false);
        step(&mut s, vec![row(1, 0, 3, true), row(2, 0, 1, false)]);
        step(&mut s, vec![row(1, 3, 1, true), row(2, 1, 2, true)]);
        // A sampled token and a span of 2: one row a step beside the plain decode.
        s.append(2, &[7, 8, 9]);
        step(&mut s, vec![row(1, 4, 1, true), row(2, 3, 1, false)]);
        step(&mut s, vec![row(1, 5, 1, true), row(2, 4, 1, false)]);
        step(&mut s, vec![row(1, 6, 1, true), row(2, 5, 1, true)]);
        s.preempt(2);
        s.append(2, &[10]);
        // Back in, its 6 computed tokens are recomputed as prefill, as the budget allows
        // (3 of 4 beside the plain decode), not one row a step; then it decodes.
        step(&mut s, vec![row(1, 7, 1, true), row(2, 0, 3, false)]);
        step(&mut s, vec![row(1, 8, 1, true), row(2, 3, 3, false)]);
        step(&mut s, vec![row(1, 9, 1, true), row(2, 6, 1, true)]);
    }
}
