//! Anchored DFAs for patterns: the one builder every plugin uses (json-schema's `pattern` and
//! formats, the regex plugin, the grammar plugin's terminals), with one size cap.
//!
//! A constraint walks text from its first byte, so its automata are anchored at the start and
//! match at the end of the text (`\z`), with every match kind kept (`MatchKind::All`), so a
//! state says whether the text so far is a match and whether it can still become one. The
//! build is bounded by [`MAX_DFA_BYTES`] for the NFA, the automaton and its determinisation: a
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
//!
//! // After `n`, `(yes|no^)` can never match: the state is not dead, but not live either.
//! let built = dfa::anchored("(yes|no^)").unwrap();
//! let live = dfa::live_states(&built.dfa, built.start).unwrap();
//! let after_n = built.dfa.next_state(built.start, b'n');
//! assert!(!built.dfa.is_dead_state(after_n) && !live.is_live(after_n));
//! assert!(live.is_live(built.dfa.next_state(built.start, b'y')));
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
        // The NFA is bounded too: nested counted repetitions (`\d{4}{4}{4}...`) multiply its
        // size long before determinisation starts.
        .thompson(regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(MAX_DFA_BYTES)))
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

/// The states of an automaton from which some text still leads to a match. regex-automata
/// marks only its one dead state; a state can be as hopeless without being that state (after
/// `n` in `(yes|no^)`, no text can ever match), and a recogniser that enters one is at a dead
/// end. Built by [`live_states`].
pub struct LiveStates {
    stride2: usize,
    live: Vec<bool>,
}

impl LiveStates {
    /// Whether some text leads from `state` to a match.
    pub fn is_live(&self, state: StateID) -> bool {
        self.live.get(state.as_usize() >> self.stride2).copied().unwrap_or(false)
    }
}

/// The most states [`live_states`] explores.
pub const MAX_LIVE_STATES: usize = 100_000;

/// Which states reachable from `start` can still reach a match: the states reachable by one
/// byte of each byte class, then backwards from those where the text may end. `None` when
/// more than [`MAX_LIVE_STATES`] are reachable.
pub fn live_states(dfa: &dense::DFA<Vec<u32>>, start: StateID) -> Option<LiveStates> {
    let bytes: Vec<u8> = dfa.byte_classes().representatives(..).filter_map(|unit| unit.as_u8()).collect();
    let mut index = std::collections::HashMap::from([(start, 0usize)]);
    let mut order = vec![start];
    let mut preds: Vec<Vec<usize>> = vec![Vec::new()];
    let mut i = 0;
    while i < order.len() {
        for &byte in &bytes {
            let next = dfa.next_state(order[i], byte);
            if dfa.is_dead_state(next) || dfa.is_quit_state(next) {
                continue;
            }
            let j = match index.get(&next) {
                Some(&j) => j,
                None => {
                    if order.len() >= MAX_LIVE_STATES {
                        return None;
                    }
                    order.push(next);
                    preds.push(Vec::new());
                    index.insert(next, order.len() - 1);
                    order.len() - 1
                }
            };
            preds[j].push(i);
        }
        i += 1;
    }
    let mut live_by_order = vec![false; order.len()];
    let mut pending: Vec<usize> =
        (0..order.len()).filter(|&k| dfa.is_match_state(dfa.next_eoi_state(order[k]))).collect();
    for &k in &pending {
        live_by_order[k] = true;
    }
    while let Some(k) = pending.pop() {
        for &p in &preds[k] {
            if !live_by_order[p] {
                live_by_order[p] = true;
                pending.push(p);
            }
        }
    }
    let stride2 = dfa.stride2();
    let slots = order.iter().map(|s| (s.as_usize() >> stride2) + 1).max().unwrap_or(0);
    let mut live = vec![false; slots];
    for (k, state) in order.iter().enumerate() {
        live[state.as_usize() >> stride2] = live_by_order[k];
    }
    Some(LiveStates { stride2, live })
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
