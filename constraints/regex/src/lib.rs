//! The built-in `regex` plugin: the output must match a regular expression, whole.
//!
//! The pattern (Rust `regex` syntax, which covers the ECMA-262 subset used by JSON Schema
//! `pattern` and vLLM's `guided_regex`) is compiled into a dense DFA over bytes, anchored at the
//! start and, through a trailing `\z`, at the end. The DFA is the [`Recognizer`]: its state id
//! is the whole state, so it is also the state key, and the SDK's trie walk turns it into token
//! masks. The SDK's size cap ([`dspark_guest::dfa::MAX_DFA_BYTES`]) makes patterns whose DFA
//! would explode (`(a|b)*a(a|b){20}`) a clear `too-large` error instead of a hang. A pattern that matches no text at all (`[^\s\S]`,
//! `[a&&b]`) is an `invalid-source` error at compile time: served, it could only end the
//! generation at a dead end.
//!
//! Options: none are defined yet; anything but `{}` is an `invalid-options` error.

use dspark_guest::dfa::DfaError;
use dspark_guest::{ConstraintError, ErrorCode, Recognizer, key};
use regex_automata::dfa::{Automaton, dense};
use regex_automata::util::primitives::StateID;

/// Patterns longer than this are refused.
pub const MAX_PATTERN_BYTES: usize = 64 * 1024;

/// A regex as a byte recogniser.
pub struct RegexRecognizer {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
    /// The states from which a match is still reachable: `advance` never leaves them.
    live: dspark_guest::dfa::LiveStates,
}

impl RegexRecognizer {
    /// Compiles `pattern` so that it must match the whole output.
    pub fn new(pattern: &str) -> Result<Self, ConstraintError> {
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(ConstraintError::new(
                ErrorCode::TooLarge,
                format!("the pattern is {} bytes; the limit is {MAX_PATTERN_BYTES}", pattern.len()),
            ));
        }
        // Parse the pattern alone first, so a syntax error points into the user's text rather
        // than into the anchored wrapper below.
        regex_automata::util::syntax::parse(pattern)
            .map_err(|e| ConstraintError::new(ErrorCode::InvalidSource, format!("invalid regex: {e}")))?;
        let built = dspark_guest::dfa::anchored(pattern).map_err(|e| match e {
            DfaError::TooLarge(m) => {
                ConstraintError::new(ErrorCode::TooLarge, format!("cannot compile the regex: {m}"))
            }
            DfaError::Syntax(m) => {
                ConstraintError::new(ErrorCode::InvalidSource, format!("cannot compile the regex: {m}"))
            }
        })?;
        let (dfa, start) = (built.dfa, built.start);
        let live = dspark_guest::dfa::live_states(&dfa, start).ok_or_else(|| {
            ConstraintError::new(ErrorCode::TooLarge, "cannot compile the regex: its automaton has too many states")
        })?;
        let recognizer = Self { dfa, start, live };
        if !recognizer.live.is_live(start) {
            return Err(ConstraintError::new(
                ErrorCode::InvalidSource,
                "the regex matches no text at all, so no output could satisfy it",
            ));
        }
        Ok(recognizer)
    }

    /// Whether `text` matches the regex whole (for tests).
    pub fn matches(&self, text: &[u8]) -> bool {
        let mut s = self.start;
        for &b in text {
            match self.advance(&s, b) {
                Some(n) => s = n,
                None => return false,
            }
        }
        self.is_accepting(&s)
    }
}

impl Recognizer for RegexRecognizer {
    type State = StateID;

    fn start(&self) -> StateID {
        self.start
    }

    #[inline]
    fn advance(&self, state: &StateID, byte: u8) -> Option<StateID> {
        let next = self.dfa.next_state(*state, byte);
        // Not only regex-automata's dead state: any state from which no match is reachable.
        self.live.is_live(next).then_some(next)
    }

    #[inline]
    fn is_accepting(&self, state: &StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(*state))
    }

    fn state_key(&self, state: &StateID) -> u64 {
        key::mix(state.as_u64(), 0x0072_6567_6578)
    }
}

dspark_guest::recognizer_plugin!(RegexPlugin, "regex", RegexRecognizer::new);

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dspark_guest::testing::walk_text;
    use dspark_guest::{CompiledConstraint, Plugin, TokenTable};

    use super::*;

    fn compile(pattern: &str) -> (Arc<TokenTable>, Arc<dyn CompiledConstraint>) {
        let table = Arc::new(TokenTable::byte_level_for_tests(&["ab", "abc", "12", "-0", "00"]));
        let c = RegexPlugin.compile("regex", pattern, "{}", &table).unwrap();
        (table, c)
    }

    /// Found by the fuzzer: nested counted repetitions multiply the NFA past any budget; the
    /// build stops at the size limit instead of running for minutes.
    #[test]
    fn nested_counted_repetitions_are_too_large_not_slow() {
        let pattern = format!("\\d{{3}}-\\d{{4}}{}", "{4}".repeat(14));
        let e = RegexRecognizer::new(&pattern).err().expect("refused");
        assert_eq!(e.code, ErrorCode::TooLarge, "{}", e.message);
    }

    /// Found by the fuzzer: `no^` can never match, so after `n` nothing could follow; the
    /// recogniser must not take `n` at all.
    #[test]
    fn a_branch_that_can_never_match_is_no_way_in() {
        let (_, c) = compile("(yes|no^)");
        let mask = c.new_matcher().compute_mask().unwrap();
        assert!(mask.allows(b'y' as u32) && !mask.allows(b'n' as u32));
        for pattern in ["(yes|no^)", "a(b|c$d)e", "(x(?-u:\\b)y|x)"] {
            dspark_guest::testing::assert_no_dead_ends(&RegexRecognizer::new(pattern).unwrap(), 8);
        }
    }

    #[test]
    fn whole_match_semantics() {
        let r = RegexRecognizer::new(r"[a-c]+\d{2}").unwrap();
        assert!(r.matches(b"abc12"));
        assert!(!r.matches(b"abc1"));
        assert!(!r.matches(b"xabc12"));
        assert!(!r.matches(b"abc123"));
        let alt = RegexRecognizer::new("a|ab").unwrap();
        assert!(alt.matches(b"a") && alt.matches(b"ab") && !alt.matches(b"abb"));
    }

    #[test]
    fn walks_accept_matches_and_reject_the_rest() {
        let (table, c) = compile(r"\d{4}-\d{2}-\d{2}");
        let w = walk_text(&mut *c.new_matcher(), &table, b"2024-01-00");
        assert!(w.accepted(), "{w:?}");
        assert!(!w.mask_commit_mismatch);
        let w = walk_text(&mut *c.new_matcher(), &table, b"2024-1-00");
        assert_eq!(w.rejected_at, Some(6), "\"2024-1\" is a valid prefix; the token \"-0\" is not");
        let w = walk_text(&mut *c.new_matcher(), &table, b"2024-01");
        assert!(w.rejected_at.is_none() && !w.accepting);
    }

    #[test]
    fn literal_tails_are_forced() {
        let (table, c) = compile(r"(yes|no)!!!");
        let mut m = c.new_matcher();
        let r = m.commit(&[b'y' as u32]).unwrap();
        // "es!!!" is forced and ends the match: nothing held back, and the sequence stops.
        assert_eq!(r.forced, table.tokenize(b"es!!!"));
        assert!(r.stop);
    }

    #[test]
    fn errors_are_values() {
        let table = Arc::new(TokenTable::byte_level_for_tests(&[]));
        let e = RegexPlugin.compile("regex", "(", "{}", &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::InvalidSource);
        let e = RegexPlugin.compile("regex", "a", r#"{"x":1}"#, &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        let e = RegexPlugin.compile("json", "a", "{}", &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::InvalidKind);
        let e = RegexPlugin.compile("regex", "(a|b)*a(a|b){40}", "{}", &table).err().unwrap();
        assert_eq!(e.code, ErrorCode::TooLarge, "{e}");
    }

    #[test]
    fn patterns_that_match_nothing_are_compile_errors() {
        for pattern in [r"[^\s\S]", "[a&&b]", r"x*[^\s\S]y", r"(?:a|b)[^\x00-\x{10FFFF}]"] {
            let e = RegexRecognizer::new(pattern).err().unwrap_or_else(|| panic!("{pattern} matches nothing"));
            assert_eq!(e.code, ErrorCode::InvalidSource, "{pattern}: {e}");
            assert!(e.message.contains("matches no text"), "{pattern}: {e}");
        }
        // The empty text is a text; a match only after a long walk still counts.
        assert!(RegexRecognizer::new("").unwrap().matches(b""));
        assert!(RegexRecognizer::new(r"(?:[^\s\S]|a{200})b").unwrap().matches(&[&[b'a'; 200][..], b"b"].concat()));
    }
}
