//! DSpark's overlap: the masks of the sequences a step samples are computed on worker
//! threads while the backend runs the forward pass, since a constraint's mask does not depend
//! on the logits. The output projection waits for them only when it computes each row under
//! its mask ([`super::EngineConfig::masked_logits`]); an unconstrained row never waits. With
//! overlap off (the classic path) each mask is computed at sampling, synchronously.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use super::backend::{Backend, ForwardBatch};
use super::constraint::{Mask, SequenceConstraint};
use super::llm_engine::{LlmEngine, RowMask};
use super::scheduler::SeqId;

/// A constraint's answer to "which tokens next".
pub(super) type MaskResult = anyhow::Result<Option<Mask>>;

/// A mask computed ahead of sampling, with the constraint that computed it.
type Precomputed = (SeqId, Box<dyn SequenceConstraint>, MaskResult);

impl<B: Backend> LlmEngine<B> {
    /// Runs the forward pass; with overlap on, the masks of the sequences about to be sampled
    /// are computed meanwhile on worker threads (a constraint's mask does not depend on the
    /// logits). The time spent waiting for masks before the output projection is counted.
    /// With [`EngineConfig::masked_logits`] the projection then computes each row of
    /// `masked_rows` (the sequence whose mask applies to each logits row) under that mask.
    pub(super) fn forward_with_masks(
        &mut self,
        batch: &ForwardBatch,
        sampled: &[SeqId],
        masked_rows: &[RowMask],
    ) -> (anyhow::Result<Vec<f32>>, HashMap<SeqId, MaskResult>) {
        let mut jobs: Vec<(SeqId, Box<dyn SequenceConstraint>)> = Vec::new();
        if self.overlap_masks {
            for &id in sampled {
                if let Some(c) = self.requests.get_mut(&id).and_then(|r| r.constraint.take()) {
                    jobs.push((id, c));
                }
            }
        }
        if jobs.is_empty() {
            return (self.model.forward(batch, &mut self.cache), HashMap::new());
        }
        let job_ids: Vec<SeqId> = jobs.iter().map(|(id, _)| *id).collect();
        let per_thread = jobs.len().div_ceil(self.mask_threads.max(1));
        let masked_logits = self.masked_logits;
        let (model, cache) = (&self.model, &mut self.cache);
        let (logits, (done, waited)) = std::thread::scope(|scope| {
            let mut workers = Vec::new();
            while !jobs.is_empty() {
                let chunk: Vec<_> = jobs.drain(..per_thread.min(jobs.len())).collect();
                workers.push(scope.spawn(move || chunk.into_iter().map(compute_mask).collect::<Vec<Precomputed>>()));
            }
            model.forward_masked(batch, cache, move || {
                let waiting = Instant::now();
                // `compute_mask` catches panics, so a worker only fails to join if it could
                // not run at all; its sequences then end with an error (their constraints
                // are gone).
                let done: Vec<Precomputed> = workers.into_iter().filter_map(|w| w.join().ok()).flatten().collect();
                let waited = waiting.elapsed();
                let row_masks = if masked_logits {
                    let of = |id: SeqId| done.iter().find(|d| d.0 == id).and_then(|d| d.2.as_ref().ok()?.clone());
                    masked_rows
                        .iter()
                        .map(|row| match row {
                            RowMask::Unknown => None,
                            RowMask::Sampled(id) => of(*id),
                            RowMask::Known(mask) => mask.clone(),
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                ((done, waited), row_masks)
            })
        });
        self.count_mask_wait(waited, done.len());
        if masked_logits {
            for row in masked_rows {
                if let RowMask::Known(Some(mask)) = row {
                    self.count_masked_row(mask);
                }
            }
        }
        let mut masks = HashMap::new();
        for (id, constraint, mask) in done {
            if let Some(r) = self.requests.get_mut(&id) {
                r.constraint = Some(constraint);
                if masked_logits && let Ok(Some(mask)) = &mask {
                    self.count_masked_row(mask);
                }
                masks.insert(id, mask);
            }
        }
        for id in job_ids {
            masks.entry(id).or_insert_with(|| Err(anyhow::anyhow!("the mask worker thread failed")));
        }
        (logits, masks)
    }

    /// Counts a logits row computed under `mask` ([`EngineStats::masked_logits_rows`]).
    pub(super) fn count_masked_row(&mut self, mask: &[u32]) {
        let vocab = self.model.config().vocab_size;
        self.stats.masked_logits_rows += 1;
        self.stats.masked_logits_vocab += vocab as u64;
        self.stats.masked_logits_allowed += allowed_tokens(mask, vocab);
    }

    pub(super) fn count_mask_wait(&mut self, waited: Duration, masks: usize) {
        self.stats.masks += masks as u64;
        self.stats.mask_wait_ns += waited.as_nanos() as u64;
    }
}

/// Tokens below `vocab` that `mask` allows.
fn allowed_tokens(mask: &[u32], vocab: usize) -> u64 {
    let full = vocab / 32;
    let mut allowed: u64 = mask.iter().take(full).map(|w| u64::from(w.count_ones())).sum();
    if let Some(last) = mask.get(full).filter(|_| !vocab.is_multiple_of(32)) {
        allowed += u64::from((last & ((1u32 << (vocab % 32)) - 1)).count_ones());
    }
    allowed
}

/// Computes one constraint's mask, turning a panic into an error.
fn compute_mask((id, mut constraint): (SeqId, Box<dyn SequenceConstraint>)) -> Precomputed {
    let mask = std::panic::catch_unwind(AssertUnwindSafe(|| constraint.mask()))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the constraint panicked computing a mask")));
    (id, constraint, mask)
}
