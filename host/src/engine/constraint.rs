//! What the engine asks of an output constraint: the [`SequenceConstraint`] trait and the
//! types it answers with.
//!
//! The engine knows nothing of plugins: [`crate::constraint`] implements this trait with a
//! plugin matcher (through DSpark's path tree or the classic way), and tests implement it
//! directly. A mask is a bitset in the sampler's layout: bit `i % 32` of word `i / 32`
//! allows token `i`.

use std::sync::Arc;

/// A token mask in the sampler's layout: bit `i % 32` of word `i / 32` allows token `i`.
pub type Mask = Arc<[u32]>;

/// A constraint on one sequence's output (a plugin matcher, through the path tree or not).
pub trait SequenceConstraint: Send {
    /// The forced span at the start of the output.
    fn start(&mut self) -> anyhow::Result<ConstraintStep>;
    /// The tokens allowed next, as a bitset (bit `i % 32` of word `i / 32`); `None` allows
    /// every token. With [`super::EngineConfig::overlap_masks`] this runs on a worker thread while
    /// the forward pass runs, so it must not depend on the logits.
    fn mask(&mut self) -> anyhow::Result<Option<Mask>>;
    /// Records a sampled token and returns what follows it.
    fn commit(&mut self, token: u32) -> anyhow::Result<ConstraintStep>;
    /// A token likely to be sampled next, worth computing ahead (DSpark's path tree knows
    /// which token sequences took from this state before). Only a hint: it is fed to the
    /// model speculatively and kept only if sampling draws it. `None` by default.
    fn guess(&mut self) -> Option<Guess> {
        None
    }
    /// The masks of the states after `draft`'s tokens (each with its expected forced span),
    /// as far as they are known without asking the plugin (DSpark's path tree): entry `i` is
    /// the mask sampling will apply after token `i` if it is drawn with that span (`None`:
    /// every token). Shorter than `draft` where a state is not known; empty by default. The
    /// engine computes only the logits those masks allow in the drafted rows.
    fn masks_after(&mut self, draft: &[Guess]) -> Vec<Option<Mask>> {
        let _ = draft;
        Vec::new()
    }
}

/// A constraint's guess of the next token ([`SequenceConstraint::guess`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Guess {
    /// The token.
    pub token: u32,
    /// The forced span the constraint answered after it the last time: fed along with it.
    pub forced: Vec<u32>,
}

/// What a constraint says after a token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConstraintStep {
    /// Tokens that must follow (fast-forward span).
    pub forced: Vec<u32>,
    /// The output is complete: the next token could only be EOS.
    pub stop: bool,
}
