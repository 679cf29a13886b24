//! Anchored DFAs for patterns: the one builder every plugin uses (json-schema's `pattern` and
//! formats, the regex plugin, the grammar plugin's terminals), with one size cap.
//!
//! A constraint walks text from its first byte, so its automata are anchored at the start and
//! match at the end of the text (`\z`), with every match kind kept (`MatchKind::All`), so a
//! state says whether the text so far is a match and whether it can still become one. The
//! build is bounded by [`MAX_DFA_BYTES`] for the automaton and for its determinisation: a
//! hostile pattern (`(a|b)*a(a|b){20}`) is refused with [`DfaError::TooLarge`] instead of
//! exhausting the plugin's memory.
//!
//! ```
//! use dspark_guest::dfa::{self, Automaton};
//!
//! let built = dfa::anchored("[0-9]+(\\.[0-9]+)?").unwrap();
//! let mut state = built.start;
//! for &b in b"3.14" {
//!     state = built.dfa.next_state(state, b);
//! }
//! assert!(built.dfa.is_match_state(built.dfa.next_eoi_state(state)));
//! assert!(dfa::matches_some_text(&built.dfa, built.start));
//! assert!(matches!(dfa::anchored("(unclosed"), Err(dfa::DfaError::Syntax(_))));
//! ```

pub use regex_automata::dfa::Automaton;
use regex_automata::dfa::{StartKind, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::{Anchored, MatchKind};

/// The largest automaton, and the most memory its determinisation may use, per pattern.
pub const MAX_DFA_BYTES: usize = 8 << 20;

/// A pattern's automaton and its start state.
pub struct AnchoredDfa {
    /// The automaton, anchored at the start, matching at the end of the text.
    pub dfa: dense::DFA<Vec<u32>>,
    /// The anchored start state.
    pub start: StateID,
}

/// Why a pattern has no automaton.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DfaError {
    /// The pattern does not parse, or uses what a DFA cannot express (look-around,
    /// back-references); the message says what.
    Syntax(String),
    /// The automaton would exceed [`MAX_DFA_BYTES`].
    TooLarge(String),
}

impl std::fmt::Display for DfaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DfaError::Syntax(m) | DfaError::TooLarge(m) => f.write_str(m),
        }
    }
}

/// The anchored automaton of `pattern` (Rust `regex` syntax) matching the whole text:
/// `(?:pattern)\z` from an anchored start.
pub fn anchored(pattern: &str) -> Result<AnchoredDfa, DfaError> {
    let dfa = dense::Builder::new()
        .configure(
            dense::Config::new()
                .start_kind(StartKind::Anchored)
                .match_kind(MatchKind::All)
                .dfa_size_limit(Some(MAX_DFA_BYTES))
                .determinize_size_limit(Some(MAX_DFA_BYTES)),
        )
        .build(&format!("(?:{pattern})\\z"))
        .map_err(|e| {
            // The top-level message is generic ("error building NFA"); the cause says what.
            let text = crate::error_chain(&e);
            if text.contains("exceeded") || text.contains("limit") {
                DfaError::TooLarge(text)
            } else {
                DfaError::Syntax(text)
            }
        })?;
    let start = dfa
        .start_state(&regex_automata::util::start::Config::new().anchored(Anchored::Yes))
        .map_err(|e| DfaError::Syntax(format!("the pattern has no start state: {e}")))?;
    Ok(AnchoredDfa { dfa, start })
}

/// Whether any text takes `dfa` from `start` to a match: a search over the states reachable
/// by one byte of each of the automaton's byte classes. A pattern that matches nothing
/// (`[^\s\S]`) is a constraint that could only end at a dead end, which plugins refuse at
/// compile time.
pub fn matches_some_text(dfa: &dense::DFA<Vec<u32>>, start: StateID) -> bool {
    let bytes: Vec<u8> = dfa.byte_classes().representatives(..).filter_map(|unit| unit.as_u8()).collect();
    let mut seen = std::collections::HashSet::from([start]);
    let mut pending = vec![start];
    while let Some(state) = pending.pop() {
        if dfa.is_match_state(dfa.next_eoi_state(state)) {
            return true;
        }
        for &byte in &bytes {
            let next = dfa.next_state(state, byte);
            if !dfa.is_dead_state(next) && !dfa.is_quit_state(next) && seen.insert(next) {
                pending.push(next);
            }
        }
    }
    false
}
