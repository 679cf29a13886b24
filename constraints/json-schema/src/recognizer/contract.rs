//! The plugin contract's [`Recognizer`] over the schema automaton: start, advance (every
//! configuration through the byte, deduplicated), accepting, masks and state keys.

use dspark_guest::{Recognizer, TokenSet, TokenTable, key};

use super::SchemaRecognizer;
use super::frame::Frame;
use super::number::number_ok;
use super::state::{Config, State};
use crate::graph::Node;
use crate::stack::Stack;

thread_local! {
    /// Scratch space for `advance`, so a step does not allocate its output list.
    static SCRATCH: std::cell::RefCell<Vec<Config>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Recognizer for SchemaRecognizer {
    type State = State;

    fn start(&self) -> State {
        State { first: Stack::from_frames([Frame::End, Frame::Value(self.graph.root)]), more: Vec::new() }
    }

    fn advance(&self, state: &State, byte: u8) -> Option<State> {
        SCRATCH.with(|scratch| {
            let mut out = scratch.take();
            out.clear();
            for config in state.configs() {
                self.step(config.clone(), byte, &mut out, 0);
            }
            for config in out.iter_mut() {
                config.capture_byte(byte);
            }
            if out.len() > 1 {
                out.sort_unstable_by_key(key::of);
                out.dedup();
            }
            let mut drain = out.drain(..);
            let first = drain.next();
            let more: Vec<Config> = drain.collect();
            let result = first.map(|first| State { first, more });
            scratch.replace(out);
            result
        })
    }

    fn is_accepting(&self, state: &State) -> bool {
        state.configs().any(|c| {
            let mut frames = c.iter().peekable();
            if let Some(Frame::Ws { s }) = frames.peek() {
                if !self.layout.ws_accepts(*s) {
                    return false;
                }
                frames.next();
            }
            let (top, below) = (frames.next(), frames.next());
            match (top, below, frames.next()) {
                (Some(Frame::End), None, _) => true,
                (Some(Frame::Num { node, phase, neg, value, frac, exp, exp_neg }), Some(Frame::End), None) => {
                    match self.graph.node(*node) {
                        Node::Number(n) => number_ok(n, *phase, *neg, *value, *frac, *exp, *exp_neg),
                        _ => false,
                    }
                }
                (Some(Frame::Lit { set, trie, .. }), Some(Frame::End), None) => {
                    self.graph.literals[*set as usize].terminal[*trie as usize]
                }
                _ => false,
            }
        })
    }

    fn fill_mask(&self, state: &State, table: &TokenTable, set: &mut TokenSet) -> bool {
        if !crate::strings::fill_string_mask(self, state, table, set) {
            self.fill_by_table(state, table, set);
        }
        true
    }

    fn state_key(&self, state: &State) -> u64 {
        key::of(state)
    }
}
