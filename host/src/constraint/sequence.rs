//! One sequence's constraint: its own matcher in a pooled instance, driven in DSpark or
//! classic mode ([`super::ConstraintMode`]), as the engine's [`SequenceConstraint`].

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::path_tree::{Mask, StateSource, TreeWalker};
use super::pool::{CompiledKey, PluginPool, Pooled};
use super::{ConstraintMode, ConstraintObserver};
use crate::engine::{ConstraintStep, Guess, SequenceConstraint};
use crate::plugin::{MatcherHandle, PluginError, PluginInstance, TokenMask};

/// One sequence's own matcher in a pooled instance, created at its first use.
struct WasmSource {
    pooled: Pooled,
    key: CompiledKey,
    matcher: Option<MatcherHandle>,
    vocab: usize,
    observer: Arc<dyn ConstraintObserver>,
    /// A call failed: the instance may be restarted and is not returned to the pool.
    failed: bool,
}

impl WasmSource {
    /// Runs one call on the sequence's matcher, made on first use. A failure marks the
    /// instance as not worth returning to the pool.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut PluginInstance, &MatcherHandle) -> Result<T, PluginError>,
    ) -> Result<T, PluginError> {
        let matcher = match self.matcher.take() {
            Some(m) => Ok(m),
            None => match self.pooled.compiled.get(&self.key) {
                Some(compiled) => self.pooled.instance.new_matcher(compiled),
                None => Err(PluginError::InvalidOutput {
                    plugin: self.pooled.instance.plugin().name().to_string(),
                    call: "new-matcher",
                    message: "the compiled constraint was dropped".into(),
                }),
            },
        };
        let result = matcher.and_then(|m| {
            let result = f(&mut self.pooled.instance, &m);
            self.matcher = Some(m);
            result
        });
        self.failed |= result.is_err();
        result
    }
}

impl StateSource for WasmSource {
    fn commit(&mut self, tokens: &[u32]) -> anyhow::Result<(Vec<u32>, bool)> {
        let outcome = self.call(|i, m| i.commit(m, tokens))?;
        Ok((outcome.forced, outcome.stop))
    }

    fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
        let started = Instant::now();
        let mask = self.call(|i, m| i.compute_mask(m))?;
        self.observer.mask_computed(started.elapsed());
        let width = self.vocab.max(self.pooled.instance.vocab_size());
        Ok(match mask {
            TokenMask::All => None,
            other => Some(other.to_bitset(width).into()),
        })
    }

    fn state_key(&mut self) -> anyhow::Result<u64> {
        Ok(self.call(|i, m| i.state_key(m))?)
    }
}

/// How the sequence's constraint is driven.
enum Mode {
    /// DSpark: masks and edges from the shared path tree, the plugin only on a miss; forced
    /// spans go to the engine as fast-forward chunks.
    Tree(TreeWalker),
    /// The classic path of other servers: one plugin mask per step, and a forced span's
    /// tokens sampled one step each under a mask that allows only the next one (the plugin
    /// has already moved past them: the contract's semantics).
    Classic { pending: VecDeque<u32>, pending_stop: bool },
}

/// A plugin constraint driving one sequence (built by [`super::ConstraintRuntime::build`]).
/// Dropping it gives its instance back to the pool, unless a call failed.
pub struct PluginConstraint {
    pool: Arc<PluginPool>,
    source: Option<WasmSource>,
    mode: Mode,
}

impl PluginConstraint {
    /// The constraint of `key`, compiled in `pooled`. The classic mode starts the matcher
    /// now (it asks the plugin at every step); on failure the instance goes back to the pool.
    pub(super) fn new(
        pool: Arc<PluginPool>,
        pooled: Pooled,
        key: CompiledKey,
        vocab: usize,
        mode: ConstraintMode,
        observer: Arc<dyn ConstraintObserver>,
    ) -> Result<Self, PluginError> {
        let mode = match mode {
            ConstraintMode::DSpark => Mode::Tree(TreeWalker::new(pool.tree(&key))),
            ConstraintMode::Classic => Mode::Classic { pending: VecDeque::new(), pending_stop: false },
        };
        let mut source = WasmSource { pooled, key, matcher: None, vocab, observer, failed: false };
        if let Mode::Classic { .. } = mode
            && let Err(e) = source.call(|_, _| Ok(()))
        {
            pool.give_back(source.pooled);
            return Err(e);
        }
        Ok(Self { pool, source: Some(source), mode })
    }
}

/// Classic mode: a forced span waits in `pending` to be sampled one token per step.
fn defer(pending: &mut VecDeque<u32>, pending_stop: &mut bool, forced: Vec<u32>, stop: bool) -> ConstraintStep {
    pending.extend(forced);
    *pending_stop = stop;
    ConstraintStep { forced: Vec::new(), stop: pending.is_empty() && stop }
}

fn released() -> anyhow::Error {
    anyhow::anyhow!("the constraint was released")
}

/// A mask allowing `token` alone.
fn only(token: u32, vocab: usize) -> Mask {
    let mut bits = vec![0u32; vocab.div_ceil(32).max(token as usize / 32 + 1)];
    bits[token as usize / 32] |= 1 << (token % 32);
    bits.into()
}

impl SequenceConstraint for PluginConstraint {
    fn start(&mut self) -> anyhow::Result<ConstraintStep> {
        let source = self.source.as_mut().ok_or_else(released)?;
        match &mut self.mode {
            Mode::Tree(walker) => {
                walker.start(source).map(|e| ConstraintStep { forced: e.forced.to_vec(), stop: e.stop })
            }
            Mode::Classic { pending, pending_stop } => {
                source.commit(&[]).map(|(forced, stop)| defer(pending, pending_stop, forced, stop))
            }
        }
    }

    fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
        let source = self.source.as_mut().ok_or_else(released)?;
        match &mut self.mode {
            Mode::Tree(walker) => walker.mask(source),
            Mode::Classic { pending, .. } => match pending.front() {
                Some(&next) => Ok(Some(only(next, source.vocab))),
                None => source.mask(),
            },
        }
    }

    fn commit(&mut self, token: u32) -> anyhow::Result<ConstraintStep> {
        let source = self.source.as_mut().ok_or_else(released)?;
        match &mut self.mode {
            Mode::Tree(walker) => {
                walker.commit(source, token).map(|e| ConstraintStep { forced: e.forced.to_vec(), stop: e.stop })
            }
            Mode::Classic { pending, pending_stop } => match pending.pop_front() {
                Some(next) if next == token => {
                    Ok(ConstraintStep { forced: Vec::new(), stop: pending.is_empty() && *pending_stop })
                }
                Some(next) => Err(anyhow::anyhow!("token {token} was sampled where the constraint forces {next}")),
                None => source.commit(&[token]).map(|(forced, stop)| defer(pending, pending_stop, forced, stop)),
            },
        }
    }

    fn guess(&mut self) -> Option<Guess> {
        match &self.mode {
            Mode::Tree(walker) => walker.guess().map(|(token, forced)| Guess { token, forced: forced.to_vec() }),
            Mode::Classic { .. } => None,
        }
    }

    fn masks_after(&mut self, draft: &[Guess]) -> Vec<Option<Mask>> {
        match &self.mode {
            Mode::Tree(walker) => walker.masks_after(draft.iter().map(|g| (g.token, g.forced.as_slice()))),
            Mode::Classic { .. } => Vec::new(),
        }
    }
}

impl Drop for PluginConstraint {
    fn drop(&mut self) {
        let Some(source) = self.source.take() else { return };
        let WasmSource { mut pooled, matcher, failed, observer, .. } = source;
        if let Mode::Tree(walker) = &self.mode {
            observer.walked(walker.stats());
        }
        if failed {
            // A stale or failed instance is not worth keeping.
            return;
        }
        if let Some(m) = matcher
            && pooled.instance.drop_matcher(m).is_err()
        {
            return;
        }
        self.pool.give_back(pooled);
    }
}
