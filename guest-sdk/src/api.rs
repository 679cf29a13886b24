//! The traits a plugin author implements, and the values they exchange with the host.
//!
//! These mirror the WIT contract (`wit/0.1.0/constraint.wit`) in plain Rust, so that plugin
//! logic can be written and unit-tested natively; the [`crate::export_plugin!`] macro binds
//! them to the component's exports when building for `wasm32-wasip2`.

use std::sync::Arc;

use crate::bitset::Mask;
use crate::error::{ConstraintError, Warning};
use crate::table::TokenTable;

/// What a commit did: the forced span that follows (already advanced over) and whether the
/// sequence must stop.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitResult {
    /// Tokens certain to follow, canonical for the tokenizer.
    pub forced: Vec<u32>,
    /// The constraint is complete and admits nothing more.
    pub stop: bool,
}

/// A plugin: the entry point of a constraint component. One value per instance, made with
/// `Default` by the export macro.
pub trait Plugin: Send + Sync + 'static {
    /// The constraint kinds this plugin serves.
    fn kinds(&self) -> Vec<String>;

    /// Compiles `source` of `kind` with `options` (a JSON object string, `{}` when none)
    /// against the tokenizer's table.
    fn compile(
        &self,
        kind: &str,
        source: &str,
        options: &str,
        table: &Arc<TokenTable>,
    ) -> Result<Arc<dyn CompiledConstraint>, ConstraintError>;
}

/// A compiled constraint: immutable and shared by all its matchers.
pub trait CompiledConstraint: Send + Sync + 'static {
    /// The parts of the source that are only approximated.
    fn warnings(&self) -> Vec<Warning> {
        Vec::new()
    }

    /// A matcher at the start of the constrained output.
    fn new_matcher(&self) -> Box<dyn Matcher>;
}

/// The state of one sequence. See the contract for the exact semantics of each call.
pub trait Matcher: Send + 'static {
    /// The tokens allowed next.
    fn compute_mask(&mut self) -> Result<Mask, ConstraintError>;
    /// Advances over `tokens` (all or none) and returns the forced span that follows.
    fn commit(&mut self, tokens: &[u32]) -> Result<CommitResult, ConstraintError>;
    /// Undoes the last `n` tokens advanced over, forced ones included.
    fn rollback(&mut self, n: u32) -> Result<(), ConstraintError>;
    /// How many of `tokens`, from the first, would be accepted in turn.
    fn validate_draft(&self, tokens: &[u32]) -> u32;
    /// An independent copy.
    fn fork(&self) -> Box<dyn Matcher>;
    /// Whether the output so far is a complete match.
    fn is_accepting(&self) -> bool;
    /// Whether the sequence has ended.
    fn is_stopped(&self) -> bool;
    /// The state key; equal keys must promise equal futures (see the contract).
    fn state_key(&self) -> u64;
}
