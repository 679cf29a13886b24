//! The traits a plugin author implements, and the values they exchange with the host.
//!
//! These mirror the WIT contract (`wit/0.1.0/constraint.wit`) in plain Rust, so that plugin
//! logic can be written and unit-tested natively; the [`crate::export_plugin!`] macro binds
//! them to the component's exports when building for `wasm32-wasip2`.

use std::fmt;
use std::sync::Arc;

use crate::bitset::TokenSet;
use crate::table::TokenTable;

/// Why a call failed; mirrors the contract's `error-code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The kind is not one this plugin serves.
    InvalidKind,
    /// The constraint source does not parse or is not valid for the kind.
    InvalidSource,
    /// The options string is not valid.
    InvalidOptions,
    /// The source is valid but uses something this plugin cannot enforce.
    Unsupported,
    /// The source or its compiled form exceeds a size limit.
    TooLarge,
    /// A committed token is not allowed in the current state.
    RejectedToken,
    /// The call does not make sense in the current state.
    InvalidState,
    /// A plugin bug, reported as a value instead of a trap.
    Internal,
}

/// An error value returned to the host: never a trap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// A message for the user, saying what is wrong and, where possible, what to do.
    pub message: String,
    /// A JSON pointer, `line:column` or byte offset into the source, where known.
    pub location: Option<String>,
}

impl ConstraintError {
    /// An error with a code and message and no location.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), location: None }
    }

    /// Adds the location in the source the error applies to.
    pub fn at(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)?;
        if let Some(loc) = &self.location {
            write!(f, " (at {loc})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConstraintError {}

/// An error's message followed by its causes (`outer: cause: root cause`). Library errors
/// often say only what failed at the top ("error building NFA") and why further down.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// Checks that `kind` is one of the kinds a plugin serves, with the error every plugin gives.
pub fn check_kind(kind: &str, served: &[&str]) -> Result<(), ConstraintError> {
    if served.contains(&kind) {
        return Ok(());
    }
    let list: Vec<String> = served.iter().map(|k| format!("`{k}`")).collect();
    Err(ConstraintError::new(
        ErrorCode::InvalidKind,
        format!("unknown kind `{kind}`; this plugin serves {}", list.join(", ")),
    ))
}

/// Checks the options of a plugin that defines none: empty, or an empty JSON object.
pub fn no_options(options: &str) -> Result<(), ConstraintError> {
    let compact: String = options.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.is_empty() || compact == "{}" {
        return Ok(());
    }
    Err(ConstraintError::new(ErrorCode::InvalidOptions, format!("this plugin takes no options; got {options}")))
}

/// A part of the source that the compiled constraint can only approximate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// A JSON pointer, `line:column` or byte offset into the source.
    pub location: String,
    /// What is approximated and how.
    pub message: String,
}

/// The allowed tokens of one step, in the contract's four forms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mask {
    /// Every token.
    All,
    /// Exactly these ids.
    Allow(Vec<u32>),
    /// The union of half-open ranges `[start, end)`.
    Ranges(Vec<(u32, u32)>),
    /// One bit per token, least significant bit first, `ceil(vocab / 32)` words.
    Bitset(Vec<u32>),
}

impl Mask {
    /// Whether `token` is allowed by this mask.
    pub fn allows(&self, token: u32) -> bool {
        match self {
            Mask::All => true,
            Mask::Allow(ids) => ids.contains(&token),
            Mask::Ranges(r) => r.iter().any(|&(s, e)| s <= token && token < e),
            Mask::Bitset(words) => words.get((token / 32) as usize).is_some_and(|w| w >> (token % 32) & 1 == 1),
        }
    }

    /// Expands the mask into a [`TokenSet`] over `vocab_size` tokens.
    pub fn to_set(&self, vocab_size: usize) -> TokenSet {
        let mut set = TokenSet::new(vocab_size);
        match self {
            Mask::All => set.fill(),
            Mask::Allow(ids) => ids.iter().for_each(|&t| set.insert(t)),
            Mask::Ranges(r) => r.iter().for_each(|&(s, e)| (s..e).for_each(|t| set.insert(t))),
            Mask::Bitset(words) => set.words_mut().copy_from_slice(words),
        }
        set
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_kind_names_the_served_kinds() {
        assert!(check_kind("a", &["a", "b"]).is_ok());
        let e = check_kind("c", &["a", "b"]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidKind);
        assert_eq!(e.message, "unknown kind `c`; this plugin serves `a`, `b`");
    }

    #[test]
    fn no_options_accepts_only_nothing() {
        assert!(no_options("").is_ok() && no_options(" { } ").is_ok());
        let e = no_options(r#"{"x": 1}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert_eq!(e.message, r#"this plugin takes no options; got {"x": 1}"#);
    }
}
