//! Byte-level recognisers: the language a plugin author describes, byte by byte. The matcher
//! the SDK builds from one is [`crate::RecognizerMatcher`].

use crate::bitset::TokenSet;
use crate::table::TokenTable;

/// A byte-level recogniser of a language: a (possibly infinite) state machine over bytes.
pub trait Recognizer: Send + Sync + 'static {
    /// A state: where the recogniser is after some bytes. Cheap to clone (the trie walk clones
    /// one per node it visits).
    type State: Clone + Send + 'static;

    /// The state before any byte.
    fn start(&self) -> Self::State;

    /// The state after `byte`, or `None` when no match can start with the bytes so far plus
    /// `byte`. Must be `None` only for dead ends: a `Some` state must still be able to reach an
    /// accepting state.
    fn advance(&self, state: &Self::State, byte: u8) -> Option<Self::State>;

    /// Whether the bytes so far are a complete match.
    fn is_accepting(&self, state: &Self::State) -> bool;

    /// A key with the contract's promise: equal keys, equal futures. Hash only what decides
    /// the future (e.g. a DFA state id, not the bytes that led there).
    fn state_key(&self, state: &Self::State) -> u64;

    /// The only byte that can follow, when exactly one can. The default tries all 256 bytes;
    /// override it when the recogniser knows faster.
    fn forced_byte(&self, state: &Self::State) -> Option<u8> {
        let mut only = None;
        for b in 0..=255u8 {
            if self.advance(state, b).is_some() {
                if only.is_some() {
                    return None;
                }
                only = Some(b);
            }
        }
        only
    }

    /// Whether any byte can follow. The default tries all 256 bytes.
    fn can_extend(&self, state: &Self::State) -> bool {
        (0..=255u8).any(|b| self.advance(state, b).is_some())
    }

    /// An optional fast path for masks: adds to `set` exactly the non-special tokens whose
    /// bytes `state` accepts (EOS is handled by the SDK) and returns `true`, or returns
    /// `false` to let the SDK walk the token trie. Worth it for states that allow most of the
    /// vocabulary (e.g. the inside of a JSON string), where the walk visits every node.
    fn fill_mask(&self, _state: &Self::State, _table: &TokenTable, _set: &mut TokenSet) -> bool {
        false
    }
}
