//! How a document is laid out between its tokens: compact, separators, indentation, or free
//! whitespace through an automaton ([`Layout`]).

use regex_automata::dfa::Automaton;
use regex_automata::util::primitives::StateID;

use super::frame::Frame;
use super::state::Config;

/// The most container levels an indented layout writes (deeper nesting is refused).
pub const MAX_INDENT_DEPTH: usize = 32;

/// How a document is laid out between its tokens (the plugin's whitespace options).
#[derive(Debug)]
pub struct Layout {
    /// Free whitespace between tokens: an automaton over whitespace bytes that matches the
    /// empty string (every gap may also be empty).
    pub ws: Option<regex_automata::dfa::dense::DFA<Vec<u32>>>,
    /// Written right after `:` (from `separators`).
    pub key_after: Vec<u8>,
    /// Written right after `,` (from `separators`).
    pub item_after: Vec<u8>,
    /// Pretty-printing: a newline and this many spaces per level.
    pub indent: Option<u8>,
    /// Every fixed text: `key_after`, then per depth d `item_after + newline + indent·d`,
    /// then per depth d `newline + indent·d`.
    pub(crate) pads: Vec<Vec<u8>>,
}

impl Default for Layout {
    /// Compact: no whitespace at all.
    fn default() -> Self {
        Self::new(None, Vec::new(), Vec::new(), None)
    }
}

impl Layout {
    /// A layout from its parts (see the plugin's options).
    pub fn new(
        ws: Option<regex_automata::dfa::dense::DFA<Vec<u32>>>,
        key_after: Vec<u8>,
        item_after: Vec<u8>,
        indent: Option<u8>,
    ) -> Self {
        let mut pads = vec![key_after.clone()];
        let levels = if indent.is_some() { MAX_INDENT_DEPTH + 1 } else { 1 };
        let line = |d: usize| -> Vec<u8> {
            let mut v = vec![b'\n'];
            v.extend(std::iter::repeat_n(b' ', d * indent.unwrap_or(0) as usize));
            v
        };
        for d in 0..levels {
            let mut v = item_after.clone();
            if indent.is_some() {
                v.extend(line(d));
            }
            pads.push(v);
        }
        for d in 0..levels {
            pads.push(if indent.is_some() { line(d) } else { Vec::new() });
        }
        Self { ws, key_after, item_after, indent, pads }
    }

    pub(crate) fn levels(&self) -> usize {
        if self.indent.is_some() { MAX_INDENT_DEPTH + 1 } else { 1 }
    }

    /// The pad after `,` at depth `d`, if that depth is laid out.
    pub(crate) fn after_comma(&self, d: usize) -> Option<u16> {
        let d = if self.indent.is_some() { d } else { 0 };
        (d < self.levels()).then_some((1 + d) as u16)
    }

    /// The pad `newline + indent·d`.
    pub(crate) fn line(&self, d: usize) -> Option<u16> {
        (d < self.levels()).then_some((1 + self.levels() + d) as u16)
    }

    pub(crate) fn ws_start(&self) -> Option<u32> {
        let dfa = self.ws.as_ref()?;
        dfa.start_state(&regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes))
            .ok()
            .map(|s| s.as_u32())
    }

    pub(crate) fn ws_step(&self, s: u32, b: u8) -> Option<u32> {
        let dfa = self.ws.as_ref()?;
        let n = dfa.next_state(StateID::new_unchecked(s as usize), b);
        (!dfa.is_dead_state(n) && !dfa.is_quit_state(n)).then(|| n.as_u32())
    }

    pub(crate) fn ws_accepts(&self, s: u32) -> bool {
        self.ws.as_ref().is_some_and(|dfa| dfa.is_match_state(dfa.next_eoi_state(StateID::new_unchecked(s as usize))))
    }
}

/// JSON's whitespace bytes.
pub(crate) fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The number of containers (objects and arrays) on a stack: the depth inside the top one.
pub(crate) fn container_depth(stack: &Config) -> usize {
    stack.iter().filter(|f| matches!(f, Frame::Obj { .. } | Frame::Arr { .. })).count()
}
