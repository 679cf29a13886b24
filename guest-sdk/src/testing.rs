//! Native test mode: drive a plugin's matchers from `cargo test`, without wasm, the way the
//! host drives them ([`walk_text`]), and search a recogniser for dead ends, prefixes it accepts
//! but can never complete ([`search_dead_ends`]).

use std::collections::HashMap;

use crate::api::Matcher;
use crate::bitset::Mask;
use crate::recognizer::Recognizer;
use crate::table::TokenTable;

/// What happened when a text was walked through a matcher token by token.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Walk {
    /// The tokens of the text, in the table's tokenisation.
    pub tokens: Vec<u32>,
    /// The index of the first token the mask disallowed or the commit rejected, if any.
    pub rejected_at: Option<usize>,
    /// How many of the text's tokens arrived as forced spans that matched the text.
    pub forced_tokens: usize,
    /// Whether the matcher was accepting after the last token.
    pub accepting: bool,
    /// Whether a token's mask verdict and its commit verdict disagreed (a plugin bug).
    pub mask_commit_mismatch: bool,
}

impl Walk {
    /// Whether the text was accepted whole: no token rejected and the end accepting.
    pub fn accepted(&self) -> bool {
        self.rejected_at.is_none() && self.accepting
    }
}

/// Tokenises `text` with the table and walks it through `matcher`: at each token the mask
/// is computed and checked, the token committed, and a forced span consumed when the text's
/// next tokens are exactly that span (otherwise the span is rolled back and the text's own
/// tokens are committed).
pub fn walk_text(matcher: &mut dyn Matcher, table: &TokenTable, text: &[u8]) -> Walk {
    let tokens = table.tokenize(text);
    walk_tokens(matcher, table, &tokens)
}

/// [`walk_text`] over given tokens.
pub fn walk_tokens(matcher: &mut dyn Matcher, table: &TokenTable, tokens: &[u32]) -> Walk {
    let mut walk = Walk { tokens: tokens.to_vec(), ..Walk::default() };
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i];
        let allowed = match matcher.compute_mask() {
            Ok(m) => allows(&m, t, table.vocab_size()),
            Err(_) => false,
        };
        let result = matcher.commit(&[t]);
        if allowed != result.is_ok() {
            walk.mask_commit_mismatch = true;
        }
        let Ok(result) = result else {
            walk.rejected_at = Some(i);
            return walk;
        };
        if !allowed {
            walk.rejected_at = Some(i);
            return walk;
        }
        i += 1;
        let span = &result.forced;
        if !span.is_empty() {
            if tokens.get(i..i + span.len()) == Some(span.as_slice()) {
                walk.forced_tokens += span.len();
                i += span.len();
            } else if matcher.rollback(span.len() as u32).is_err() {
                walk.rejected_at = Some(i);
                return walk;
            }
        }
    }
    walk.accepting = matcher.is_accepting();
    walk
}

fn allows(mask: &Mask, token: u32, vocab: usize) -> bool {
    (token as usize) < vocab && mask.allows(token)
}

/// What [`search_dead_ends`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadEndSearch {
    /// The shortest prefix the recogniser accepts byte by byte but can never complete (no
    /// accepting state is reachable from where it leads), if one was found.
    pub dead_end: Option<Vec<u8>>,
    /// Distinct states (by state key) visited.
    pub states: usize,
    /// Whether every reachable state was expanded (no state was cut off by the depth or the
    /// state cap), so that finding no dead end proves there is none.
    pub exhaustive: bool,
}

/// The most states [`search_dead_ends`] visits.
pub const MAX_SEARCH_STATES: usize = 200_000;

/// Explores every state `recognizer` reaches from its start within `max_len` bytes (all 256
/// bytes from each, states told apart by their keys) and reports a prefix after which no
/// accepting state can be reached: the rule of `advance` that the host relies on (such a
/// prefix leaves the model with no allowed token). A state at the depth limit counts as able
/// to finish, so a dead end is only reported when it is proven.
pub fn search_dead_ends<R: Recognizer>(recognizer: &R, max_len: usize) -> DeadEndSearch {
    struct Node<S> {
        state: S,
        parent: Option<(usize, u8)>,
        depth: usize,
        expanded: bool,
    }
    let start = recognizer.start();
    let mut index = HashMap::from([(recognizer.state_key(&start), 0usize)]);
    let mut nodes = vec![Node { state: start, parent: None, depth: 0, expanded: false }];
    let mut preds: Vec<Vec<usize>> = vec![Vec::new()];
    let mut exhaustive = true;
    let mut next = 0;
    while next < nodes.len() {
        let id = next;
        next += 1;
        if nodes[id].depth >= max_len {
            exhaustive &= !(0..=255u8).any(|b| recognizer.advance(&nodes[id].state, b).is_some());
            continue;
        }
        nodes[id].expanded = true;
        for byte in 0..=255u8 {
            let Some(state) = recognizer.advance(&nodes[id].state, byte) else { continue };
            let child = match index.get(&recognizer.state_key(&state)) {
                Some(&child) => child,
                None if nodes.len() >= MAX_SEARCH_STATES => {
                    exhaustive = false;
                    continue;
                }
                None => {
                    let child = nodes.len();
                    index.insert(recognizer.state_key(&state), child);
                    nodes.push(Node { state, parent: Some((id, byte)), depth: nodes[id].depth + 1, expanded: false });
                    preds.push(Vec::new());
                    child
                }
            };
            preds[child].push(id);
        }
    }
    // Live: accepting, or not expanded (unknown beyond the limit), or one step from live.
    let mut live: Vec<bool> = nodes.iter().map(|n| !n.expanded || recognizer.is_accepting(&n.state)).collect();
    let mut work: Vec<usize> = (0..nodes.len()).filter(|&i| live[i]).collect();
    while let Some(id) = work.pop() {
        for &p in &preds[id] {
            if !live[p] {
                live[p] = true;
                work.push(p);
            }
        }
    }
    // Nodes are in breadth-first order: the first dead one has the shortest prefix.
    let dead_end = (0..nodes.len()).find(|&i| !live[i]).map(|mut id| {
        let mut prefix = Vec::new();
        while let Some((parent, byte)) = nodes[id].parent {
            prefix.push(byte);
            id = parent;
        }
        prefix.reverse();
        prefix
    });
    DeadEndSearch { dead_end, states: nodes.len(), exhaustive }
}

/// Panics, showing the prefix, if [`search_dead_ends`] finds one within `max_len` bytes.
pub fn assert_no_dead_ends<R: Recognizer>(recognizer: &R, max_len: usize) {
    let search = search_dead_ends(recognizer, max_len);
    if let Some(prefix) = search.dead_end {
        panic!(
            "the recogniser accepts {:?} byte by byte but can never complete it: `advance` must return None \
             for the byte that leads there ({} states searched)",
            String::from_utf8_lossy(&prefix),
            search.states
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key;

    /// `ab`, with a bug: after `a`, `c` is accepted, then `d`, after which nothing is.
    struct Buggy;

    impl Recognizer for Buggy {
        type State = u8;
        fn start(&self) -> u8 {
            0
        }
        fn advance(&self, s: &u8, b: u8) -> Option<u8> {
            match (s, b) {
                (0, b'a') => Some(1),
                (1, b'b') => Some(2),
                (1, b'c') => Some(3),
                (3, b'd') => Some(4),
                _ => None,
            }
        }
        fn is_accepting(&self, s: &u8) -> bool {
            *s == 2
        }
        fn state_key(&self, s: &u8) -> u64 {
            key::mix(*s as u64, 1)
        }
    }

    /// Any number of `x`, then `y`: infinite, no dead end.
    struct Loop;

    impl Recognizer for Loop {
        type State = bool;
        fn start(&self) -> bool {
            false
        }
        fn advance(&self, done: &bool, b: u8) -> Option<bool> {
            match (done, b) {
                (false, b'x') => Some(false),
                (false, b'y') => Some(true),
                _ => None,
            }
        }
        fn is_accepting(&self, done: &bool) -> bool {
            *done
        }
        fn state_key(&self, done: &bool) -> u64 {
            *done as u64
        }
    }

    #[test]
    fn the_shortest_prefix_that_cannot_complete_is_found() {
        let search = search_dead_ends(&Buggy, 8);
        assert_eq!(search.dead_end.as_deref(), Some(&b"ac"[..]));
        assert_eq!(search.states, 5);
        assert!(search.exhaustive);
        // A search too shallow to prove `ac` dead reports nothing, and says it was cut short.
        let shallow = search_dead_ends(&Buggy, 2);
        assert_eq!(shallow.dead_end, None);
        assert!(!shallow.exhaustive);
        let panic = std::panic::catch_unwind(|| assert_no_dead_ends(&Buggy, 8)).unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(
            message.starts_with("the recogniser accepts \"ac\" byte by byte but can never complete it"),
            "{message}"
        );
    }

    #[test]
    fn loops_are_explored_once_by_state_key() {
        let search = search_dead_ends(&Loop, 1000);
        assert_eq!(search, DeadEndSearch { dead_end: None, states: 2, exhaustive: true });
        assert_no_dead_ends(&Loop, 1000);
    }
}
