//! Content-token classes of strings and keys: which escape-free tokens a string state allows
//! depends only on its pattern automata, their states and the room left ([`ClassKey`]), so
//! the set is computed once per class by a walk of the token trie and cached.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dspark_guest::{Steps, TokenSet, key};
use regex_automata::dfa::Automaton;
use regex_automata::util::primitives::StateID;

use super::frame::{Chars, advance_chars};
use crate::graph::Graph;

/// The state of a content-class walk: string escapes/UTF-8, automaton states, characters.
#[derive(Clone, Copy, Hash)]
pub(crate) struct ClassWalk {
    pub(crate) chars: Chars,
    pub(crate) dfa: [u32; 4],
    pub(crate) count: u32,
}

/// The content-class walk as a byte machine for a [`StateTable`]: escape-free string content
/// that keeps the automata of `key` alive (all of them, or for a key any) in the room left.
pub(crate) struct ClassSteps<'a> {
    pub(crate) graph: &'a Graph,
    pub(crate) key: ClassKey,
    /// Whether the character count can decide anything in this walk (see `content_class`).
    pub(crate) counted: bool,
}

impl Steps for ClassSteps<'_> {
    type State = ClassWalk;

    fn step(&self, w: &ClassWalk, b: u8) -> Option<ClassWalk> {
        let (g, key) = (self.graph, &self.key);
        let n = key.n as usize;
        if (w.chars.is_plain() && b == b'"') || b == b'\\' {
            return None;
        }
        // Where the count decides nothing it is kept at 0, so that states repeat.
        let count = if self.counted { w.count + w.chars.is_plain() as u32 } else { 0 };
        if count > key.left {
            return None;
        }
        let chars = advance_chars(w.chars, b)?;
        let mut next = ClassWalk { chars, dfa: w.dfa, count };
        let mut any_live = n == 0;
        for k in 0..n {
            let p = key.patterns[k].0;
            let st = g.dfas[p as usize].next_state(StateID::new(w.dfa[k] as usize).unwrap_or(StateID::ZERO), b);
            next.dfa[k] = st.as_u32();
            // The room left counts characters, like `maxLength`.
            let ok = match g.char_distance(p, st.as_u32()) {
                None => false,
                Some(d) => key.left == u32::MAX || count.saturating_add(d) <= key.left,
            };
            if !key.any && !ok {
                return None;
            }
            any_live |= ok;
        }
        (!key.any || any_live).then_some(next)
    }

    fn key(&self, w: &ClassWalk) -> u64 {
        key::of(w)
    }
}

/// What decides which escape-free content tokens a string or key state allows: the pattern
/// automata and their states, whether all patterns must stay alive (a string) or any (a key
/// with `additionalProperties: false`), and the characters of room left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClassKey {
    /// (automaton, state) pairs; `n` of them are used.
    pub patterns: [(u32, u32); 4],
    /// How many of `patterns` are used.
    pub n: u8,
    /// Any pattern alive suffices (keys) rather than all (strings).
    pub any: bool,
    /// Characters of room left (`u32::MAX`: unbounded).
    pub left: u32,
}

/// Content-token classes by [`ClassKey`]. Bounded; cleared when full.
pub type PatternClassCache = Mutex<HashMap<ClassKey, Arc<TokenSet>>>;
