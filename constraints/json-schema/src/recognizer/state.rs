//! The recogniser's state: a deduplicated set of configurations (parse stacks).

use std::num::NonZeroU64;
use std::sync::Arc;

use super::frame::Frame;
use crate::stack::Stack;

/// A configuration: a parse stack.
pub type Config = Stack;

/// The recogniser state: the live configurations (almost always one), deduplicated, in a
/// canonical order. The first is held inline so that cloning a one-configuration state does
/// not allocate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub(crate) first: Config,
    pub(crate) more: Vec<Config>,
}

impl State {
    pub(crate) fn configs(&self) -> impl Iterator<Item = &Config> {
        std::iter::once(&self.first).chain(self.more.iter())
    }

    /// Each configuration as a state of its own (the state accepts what any of them does).
    pub fn split(&self) -> Vec<State> {
        self.configs().map(|c| State { first: c.clone(), more: Vec::new() }).collect()
    }

    /// For a single configuration inside a free (undeclared) key: the same state with the
    /// key's text no longer following any declared name, so that a closing quote is judged
    /// as the end of an additional property whatever the text was.
    pub(crate) fn off_declared_names(&self) -> Option<State> {
        let mut first = self.single()?.clone();
        match first.pop()? {
            Frame::FreeKey { obj, chars, dfa, .. } => first.push(Frame::FreeKey { obj, trie: None, chars, dfa }),
            _ => return None,
        }
        Some(State { first, more: Vec::new() })
    }

    /// For a single configuration inside an item string under an exact `uniqueItems`: the
    /// hash of its text so far and the hashes of the array's items already written.
    pub(crate) fn tracked_text(&self) -> Option<(NonZeroU64, Option<Arc<Vec<u64>>>)> {
        let mut frames = self.single()?.iter();
        let Some(Frame::Str { text: Some(h), .. }) = frames.next() else { return None };
        match frames.next() {
            Some(Frame::Arr { texts, .. }) => Some((*h, texts.clone())),
            _ => None,
        }
    }

    /// For a single configuration inside an item string under an exact `uniqueItems`: the
    /// same state with the text no longer tracked, so that its closing quote is judged as
    /// for any string (the caller checks the repeat itself).
    pub(crate) fn untracked_text(&self) -> Option<State> {
        let mut first = self.single()?.clone();
        match first.pop()? {
            Frame::Str { node, len, chars, dfa, .. } => first.push(Frame::Str { node, len, chars, dfa, text: None }),
            _ => return None,
        }
        Some(State { first, more: Vec::new() })
    }

    /// The single configuration, if there is exactly one.
    pub(crate) fn single(&self) -> Option<&Config> {
        self.more.is_empty().then_some(&self.first)
    }
}
