//! The byte-level recogniser of a compiled schema: a pushdown automaton over JSON bytes.
//!
//! A state is a small set of configurations (more than one only inside a union whose branches
//! start alike, e.g. two object shapes); a configuration is a stack of [`Frame`]s with the
//! end-of-document frame at the bottom. Frames hold only what decides the future: a string's
//! length only when a length bound applies, a number's value only when a bound applies, so
//! that equal futures get equal state keys and the host's path tree stays small.
//!
//! Files: `frame` and `state` (the stack's frames and the set of configurations), `step` (one
//! byte through one configuration, dispatched by the top frame to `object`, `array`, `string`
//! or `number`, literals and value starts handled there), `unique` (the `uniqueItems`
//! bookkeeping), `layout` (whitespace, separators, indentation), `classes` (content-token
//! classes for masks) and `contract` (the SDK's [`dspark_guest::Recognizer`] over all of it).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dspark_guest::{Recognizer, StateTable, Steps, TokenSet, TokenTable, TokenTrie};

use crate::graph::Graph;

mod array;
pub(crate) mod classes;
mod contract;
pub(crate) mod frame;
pub(crate) mod layout;
mod number;
mod object;
pub(crate) mod state;
mod step;
mod string;
pub(crate) mod unique;

pub use classes::{ClassKey, PatternClassCache};
use classes::{ClassSteps, ClassWalk};
pub use frame::{Chars, Frame};
pub use layout::Layout;
pub use state::{Config, State};

/// A compiled schema as a [`Recognizer`].
pub struct SchemaRecognizer {
    pub(crate) graph: Graph,
    pub(crate) layout: Layout,
    pub(crate) pattern_classes: PatternClassCache,
    /// The states mask walks met, tabulated (see [`StateTable`]), for the configurations that
    /// take no in-string fast path.
    pub(crate) walks: Mutex<StateTable<State>>,
}

impl SchemaRecognizer {
    /// Wraps a compiled graph (compact layout).
    pub fn new(graph: Graph) -> Self {
        Self::with_layout(graph, Layout::default())
    }

    /// Wraps a compiled graph with a layout.
    pub fn with_layout(graph: Graph, layout: Layout) -> Self {
        Self { graph, layout, pattern_classes: Mutex::new(HashMap::new()), walks: Mutex::default() }
    }

    /// Fills `set` with the tokens `state` allows by walking the token trie through the
    /// recogniser's state table.
    pub(crate) fn fill_by_table(&self, state: &State, table: &TokenTable, set: &mut TokenSet) {
        self.fill_trie_by_table(state, table.trie(), set);
    }

    /// [`Self::fill_by_table`] over the tokens of `trie` only.
    pub(crate) fn fill_trie_by_table(&self, state: &State, trie: &TokenTrie, set: &mut TokenSet) {
        // Inside an item whose bytes are captured every byte makes a new state: the table
        // would only fill with states no later walk meets (and push out those it would), so
        // such states take the plain walk.
        if state.configs().any(|c| c.capture_len().is_some()) {
            trie.walk(state, &mut Vec::new(), |s, b| self.advance(s, b), |t| set.insert(t));
            return;
        }
        self.walks.lock().unwrap_or_else(|p| p.into_inner()).fill_trie(self, state, trie, set);
    }

    /// The escape-free content tokens allowed by `key`, found by walking the token trie with
    /// the automata (dead prefixes prune whole subtrees); cached.
    pub(crate) fn content_class(&self, key: ClassKey, table: &TokenTable) -> Arc<TokenSet> {
        if let Some(c) = self.pattern_classes.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return c.clone();
        }
        let mut out = TokenSet::new(table.vocab_size());
        let mut start = ClassWalk { chars: Chars::default(), dfa: [0; 4], count: 0 };
        for k in 0..key.n as usize {
            start.dfa[k] = key.patterns[k].1;
        }
        // The count matters only where the room left could run out inside one token: with
        // more room than the longest token plus the longest way to a match, it cannot.
        let slack = (0..key.n as usize)
            .map(|k| self.graph.max_distance(key.patterns[k].0))
            .max()
            .unwrap_or(0)
            .saturating_add(table.trie().max_token_len() as u32);
        let counted = key.left != u32::MAX && key.left < slack;
        if !counted && key.n > 0 {
            // An automaton at a safe state stays able to match whatever follows (a search
            // pattern that matched, or one that never rules anything out): it constrains
            // nothing here, and the class is that of the others (of none, for keys, where
            // one alive suffices). This spares a walk per position inside a counted
            // repetition such as `[a-z0-9]{162}`.
            let n = key.n as usize;
            let safe: Vec<bool> = (0..n).map(|k| self.graph.safe(key.patterns[k].0, key.patterns[k].1)).collect();
            if safe.iter().any(|&s| s) {
                let mut reduced = ClassKey { patterns: [(0, 0); 4], n: 0, ..key };
                if !key.any {
                    for k in (0..n).filter(|&k| !safe[k]) {
                        reduced.patterns[reduced.n as usize] = key.patterns[k];
                        reduced.n += 1;
                    }
                }
                let class = self.content_class(reduced, table);
                self.remember_class(key, class.clone());
                return class;
            }
        }
        let steps = ClassSteps { graph: &self.graph, key, counted };
        let max_distance = slack - table.trie().max_token_len() as u32;
        // Under a length bound (a 128-character version string) the count would make every
        // position a new walk of the whole trie. A token of `c` characters stays within
        // `c + max_distance` of the room at every step, so where that fits it is allowed
        // exactly when the unbounded class allows it; only the longer tokens need stepping
        // through with the count, which pays where they are few.
        let fits = key.left.saturating_sub(max_distance);
        let bounded_but_roomy = counted && key.left > max_distance;
        let long = if bounded_but_roomy { table.by_char_count() } else { &[] };
        let longer = long.partition_point(|&(chars, _)| chars > fits);
        let few_longer = bounded_but_roomy && longer <= table.vocab_size() / 16;
        if few_longer {
            let unbounded = self.content_class(ClassKey { left: u32::MAX, ..key }, table);
            out.words_mut().copy_from_slice(unbounded.words());
            for &(_, t) in &long[..longer] {
                if out.contains(t) {
                    let mut w = start;
                    for &b in table.token_bytes(t) {
                        match steps.step(&w, b) {
                            Some(n) => w = n,
                            None => {
                                out.remove(t);
                                break;
                            }
                        }
                    }
                }
            }
        } else if !counted {
            // States repeat (inside a URI's path, a date's digits): tabulate them, and take
            // whole the subtrees they loop over.
            StateTable::default().fill_trie(&steps, &start, table.trie(), &mut out);
        } else {
            // A character count in every state: nothing repeats, the plain walk is cheaper.
            table.trie().walk(&start, &mut Vec::new(), |w, b| steps.step(w, b), |t| out.insert(t));
        }
        let out = Arc::new(out);
        self.remember_class(key, out.clone());
        out
    }

    /// Caches a content class (bounded: cleared when full).
    pub(crate) fn remember_class(&self, key: ClassKey, class: Arc<TokenSet>) {
        let mut cache = self.pattern_classes.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= 4096 {
            cache.clear();
        }
        cache.insert(key, class);
    }

    /// The graph.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Whether `text` is a complete document (for tests).
    pub fn matches(&self, text: &[u8]) -> bool {
        let mut s = self.start();
        for &b in text {
            match self.advance(&s, b) {
                Some(n) => s = n,
                None => return false,
            }
        }
        self.is_accepting(&s)
    }
}
