//! Strings: length bounds counted in characters, escapes, the pattern and format automata,
//! and the text of an item tracked for `uniqueItems`.

use std::num::NonZeroU64;

use regex_automata::dfa::Automaton;
use regex_automata::util::primitives::StateID;

use super::SchemaRecognizer;
use super::frame::{Chars, Frame, advance_chars, decoded_bytes};
use super::state::Config;
use super::unique::{hash_text, item_written, record_text, text_bytes};
use crate::graph::{Node, NodeId};

impl SchemaRecognizer {
    /// Feeds `b` to a string (`top`, a [`Frame::Str`]): escapes and UTF-8, length bounds, the
    /// pattern automata, and the text of a tracked item.
    pub(crate) fn step_string(&self, mut stack: Config, top: Frame, b: u8, out: &mut Vec<Config>) {
        let Frame::Str { node, len, chars, dfa, text } = top else { return };
        let g = &self.graph;
        let Node::String(s) = g.node(node) else { return };
        let free = chars.esc == 0 && chars.utf8 == 0;
        if free && b == b'"' {
            if len >= s.min_len && self.patterns_accept(node, dfa) && record_text(&mut stack, text) {
                out.push(stack);
            }
            return;
        }
        // A character is counted at its first byte (a plain byte, a UTF-8 lead byte, or
        // the backslash of an escape).
        let len = if free { len + 1 } else { len };
        if len > s.max_len {
            return;
        }
        let Some(next_chars) = advance_chars(chars, b) else { return };
        let text = text.map(|h| hash_text(h, text_bytes(chars, next_chars, b).as_slice()));
        // A tracked item that this character fills to its `maxLength` can only close:
        // a repeat is refused here, where another character can be written instead.
        if let Some(h) = text
            && len == s.max_len
            && next_chars.is_plain()
            && item_written(&stack, h.get())
        {
            return;
        }
        // Feed the decoded bytes to the pattern automata.
        let mut dfa = dfa;
        if !s.patterns.is_empty() {
            // Under a pattern, `\u` escapes are not written (their digits would decide
            // too late whether the pattern survives), nor `\/` (`/` needs no escape,
            // and without it a `/` the pattern requires is forced), and `\` only when
            // some simple escape keeps every pattern alive.
            if chars.esc == 1 && (b == b'u' || b == b'/') {
                return;
            }
            if free && b == b'\\' && !self.some_escape_survives(&s.patterns, dfa) {
                return;
            }
            let decoded = decoded_bytes(chars, next_chars, b);
            for (k, &p) in s.patterns.iter().enumerate().take(2) {
                let d = &g.dfas[p as usize];
                let mut st = StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO);
                for &db in decoded.as_slice() {
                    st = d.next_state(st, db);
                    if !g.live(p, st.as_u32()) {
                        return;
                    }
                }
                dfa[k] = st.as_u32();
                // Under `maxLength`, the pattern must be completable in the room left,
                // counted in characters (`len` already counts the one begun).
                if s.max_len != u32::MAX
                    && g.char_distance(p, st.as_u32()).is_none_or(|d| len.saturating_add(d) > s.max_len)
                {
                    return;
                }
            }
            // Two automata must still be able to match the same text.
            if let [a, b] = s.patterns[..]
                && !g.pair_live([a, b], dfa)
            {
                return;
            }
        }
        let len = if s.min_len > 0 || s.max_len < u32::MAX { len } else { 0 };
        stack.push(Frame::Str { node, len, chars: next_chars, dfa, text });
        out.push(stack);
    }

    /// The frame of string `node` after its opening quote; `text`: the hash to track its text
    /// with, for an item under an exact `uniqueItems`.
    pub(crate) fn string_start(&self, node: NodeId, text: Option<NonZeroU64>) -> Frame {
        let mut dfa = [0u32; 2];
        if let Node::String(s) = self.graph.node(node) {
            for (k, &p) in s.patterns.iter().enumerate().take(2) {
                dfa[k] = self.dfa_start(p);
            }
        }
        Frame::Str { node, len: 0, chars: Chars::default(), dfa, text }
    }

    /// Whether one of the simple escapes written under a pattern (`\"`, `\\`, `\b`, `\f`,
    /// `\n`, `\r`, `\t`) keeps every pattern alive from `dfa`.
    pub(crate) fn some_escape_survives(&self, patterns: &[u32], dfa: [u32; 2]) -> bool {
        [b'"', b'\\', 0x08, 0x0C, b'\n', b'\r', b'\t'].iter().any(|&byte| {
            let mut next = dfa;
            let each = patterns.iter().enumerate().take(2).all(|(k, &p)| {
                let d = &self.graph.dfas[p as usize];
                let st = d.next_state(StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO), byte);
                next[k] = st.as_u32();
                self.graph.live(p, st.as_u32())
            });
            each && (patterns.len() < 2 || self.graph.pair_live([patterns[0], patterns[1]], next))
        })
    }

    /// The anchored start state of pattern automaton `p`.
    pub(crate) fn dfa_start(&self, p: u32) -> u32 {
        let d = &self.graph.dfas[p as usize];
        d.start_state(&regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes))
            .map(|s| s.as_u32())
            .unwrap_or(0)
    }

    pub(crate) fn patterns_accept(&self, node: NodeId, dfa: [u32; 2]) -> bool {
        let Node::String(s) = self.graph.node(node) else { return false };
        s.patterns.iter().enumerate().take(2).all(|(k, &p)| {
            let d = &self.graph.dfas[p as usize];
            let st = StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO);
            d.is_match_state(d.next_eoi_state(st))
        })
    }
}
