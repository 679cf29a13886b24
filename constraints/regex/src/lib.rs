//! The built-in `regex` plugin: the output must match a regular expression, whole.
//!
//! The pattern (Rust `regex` syntax, which covers the ECMA-262 subset used by JSON Schema
//! `pattern` and vLLM's `guided_regex`) is compiled into a dense DFA over bytes, anchored at the
//! start and, through a trailing `\z`, at the end. The DFA is the [`Recognizer`]: its state id
//! is the whole state, so it is also the state key, and the SDK's trie walk turns it into token
//! masks. Size limits make patterns whose DFA would explode (`(a|b)*a(a|b){20}`) a clear
//! `too-large` error instead of a hang. A pattern that matches no text at all (`[^\s\S]`,
//! `[a&&b]`) is an `invalid-source` error at compile time: served, it could only end the
//! generation at a dead end.
//!
//! Options: none are defined yet; anything but `{}` is an `invalid-options` error.

use std::collections::HashSet;
use std::sync::Arc;

use dspark_guest::{
    CompiledConstraint, ConstraintError, ErrorCode, Plugin, Recognizer, RecognizerConstraint, TokenTable, key,
};
use regex_automata::dfa::{Automaton, StartKind, dense};
use regex_automata::util::primitives::StateID;
use regex_automata::util::start;
use regex_automata::{Anchored, MatchKind};

/// Patterns longer than this are refused.
pub const MAX_PATTERN_BYTES: usize = 64 * 1024;
/// The most memory a compiled DFA may take.
pub const MAX_DFA_BYTES: usize = 32 * 1024 * 1024;

/// A regex as a byte recogniser.
pub struct RegexRecognizer {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
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
        let anchored = format!("(?:{pattern})\\z");
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .start_kind(StartKind::Anchored)
                    .match_kind(MatchKind::All)
                    .dfa_size_limit(Some(MAX_DFA_BYTES))
                    .determinize_size_limit(Some(MAX_DFA_BYTES)),
            )
            .build(&anchored)
            .map_err(|e| {
                // The top-level message is generic ("error building NFA"); the cause says what.
                let text = dspark_guest::error_chain(&e);
                let code = if text.contains("exceeded") || text.contains("limit") {
                    ErrorCode::TooLarge
                } else {
                    ErrorCode::InvalidSource
                };
                ConstraintError::new(code, format!("cannot compile the regex: {text}"))
            })?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| ConstraintError::new(ErrorCode::Unsupported, format!("the regex has no start state: {e}")))?;
        let recognizer = Self { dfa, start };
        if !recognizer.matches_some_text() {
            return Err(ConstraintError::new(
                ErrorCode::InvalidSource,
                "the regex matches no text at all, so no output could satisfy it",
            ));
        }
        Ok(recognizer)
    }

    /// Whether any text matches: a walk from the start state over one byte of each of the
    /// DFA's byte classes (bytes of a class lead to the same state), looking for a state that
    /// the end of the text accepts. Each state is visited once, so this is bounded by the
    /// DFA's size, which the size limits bound.
    fn matches_some_text(&self) -> bool {
        let bytes: Vec<u8> = self.dfa.byte_classes().representatives(..).filter_map(|unit| unit.as_u8()).collect();
        let mut seen = HashSet::from([self.start]);
        let mut pending = vec![self.start];
        while let Some(state) = pending.pop() {
            if self.is_accepting(&state) {
                return true;
            }
            for &byte in &bytes {
                if let Some(next) = self.advance(&state, byte)
                    && seen.insert(next)
                {
                    pending.push(next);
                }
            }
        }
        false
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
        (!self.dfa.is_dead_state(next) && !self.dfa.is_quit_state(next)).then_some(next)
    }

    #[inline]
    fn is_accepting(&self, state: &StateID) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(*state))
    }

    fn state_key(&self, state: &StateID) -> u64 {
        key::mix(state.as_u64(), 0x0072_6567_6578)
    }
}

/// The plugin: serves kind `regex`.
#[derive(Default)]
pub struct RegexPlugin;

impl Plugin for RegexPlugin {
    fn kinds(&self) -> Vec<String> {
        vec!["regex".into()]
    }

    fn compile(
        &self,
        kind: &str,
        source: &str,
        options: &str,
        table: &Arc<TokenTable>,
    ) -> Result<Arc<dyn CompiledConstraint>, ConstraintError> {
        dspark_guest::check_kind(kind, &["regex"])?;
        dspark_guest::no_options(options)?;
        Ok(RecognizerConstraint::new(RegexRecognizer::new(source)?, table, Vec::new()))
    }
}

dspark_guest::export_plugin!(RegexPlugin);

#[cfg(test)]
mod tests {
    use super::*;
    use dspark_guest::testing::walk_text;

    fn compile(pattern: &str) -> (Arc<TokenTable>, Arc<dyn CompiledConstraint>) {
        let table = Arc::new(TokenTable::byte_level_for_tests(&["ab", "abc", "12", "-0", "00"]));
        let c = RegexPlugin.compile("regex", pattern, "{}", &table).unwrap();
        (table, c)
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
