//! DSpark's path tree: the answers of a compiled constraint, cached by state key and shared
//! by every sequence that uses the constraint.
//!
//! A plugin promises (`state-key` in `wit/0.1.0/constraint.wit`) that two matchers with equal
//! keys have equal futures: the same mask, and for every token the same commit result and the
//! same successor key. So the host can remember, per key, the mask and the edges
//! `token -> (forced span, stop, successor key)` it has seen, and a sequence that walks a
//! known path never calls into Wasm at all.
//!
//! - [`PathTree`] is the graph of one compiled constraint, grown lazily and bounded in bytes:
//!   when it outgrows its budget, the least recently used nodes are dropped (a later visit
//!   simply misses and asks the plugin again).
//! - [`TreeCache`] holds the trees of many constraints, keyed by whatever identifies a
//!   compiled constraint (plugin, kind, canonical source, options; the tokenizer is implied
//!   by the cache's owner), and drops the least recently used trees beyond its budget.
//! - [`TreeWalker`] is one sequence's position in a tree. On a miss it brings the
//!   sequence's own matcher (a [`StateSource`]) up to date by replaying the tokens sampled
//!   since its last sync (the plugin advances over forced spans by itself), asks for that one
//!   answer, and records it.
//!
//! The walker never trusts the tree more than the plugin: after a replay it reads the
//! matcher's key again and continues from the key the plugin reports.
//!
//! Two sequences walking the same path: the first asks its matcher, the second is answered by
//! the tree alone.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use dspark_host::constraint::path_tree::{Mask, PathTree, StateSource, TreeWalker};
//!
//! /// `yes` or `no` over the tokens 0 `y`, 1 `es`, 2 `no`; the state is what was written.
//! struct YesNo { written: Vec<u32>, calls: usize }
//! impl StateSource for YesNo {
//!     fn commit(&mut self, tokens: &[u32]) -> anyhow::Result<(Vec<u32>, bool)> {
//!         self.calls += 1;
//!         self.written.extend(tokens);
//!         // After `y`, `es` is the only way on: the plugin forces it and advances over it.
//!         if self.written == [0] {
//!             self.written.push(1);
//!             return Ok((vec![1], true));
//!         }
//!         Ok((Vec::new(), !self.written.is_empty()))
//!     }
//!     fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
//!         self.calls += 1;
//!         Ok(Some(vec![0b101].into())) // `y` or `no` at the start
//!     }
//!     fn state_key(&mut self) -> anyhow::Result<u64> {
//!         Ok(self.written.len() as u64)
//!     }
//! }
//!
//! let tree = Arc::new(Mutex::new(PathTree::new(1 << 20)));
//! for (i, expected_calls) in [(0, 3), (1, 0)] {
//!     let mut matcher = YesNo { written: Vec::new(), calls: 0 };
//!     let mut walker = TreeWalker::new(tree.clone());
//!     assert!(walker.start(&mut matcher)?.forced.is_empty());
//!     assert_eq!(walker.mask(&mut matcher)?.as_deref(), Some(&[0b101u32][..]));
//!     let edge = walker.commit(&mut matcher, 0)?; // `y`: `es` follows, and the output ends
//!     assert_eq!((&*edge.forced, edge.stop), (&[1u32][..], true));
//!     assert_eq!(matcher.calls, expected_calls, "sequence {i}");
//! }
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

pub use crate::engine::Mask;

/// What committing one token (or nothing, at the start) leads to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    /// The forced span that follows the token (already advanced over by the plugin).
    pub forced: Arc<[u32]>,
    /// The sequence must end.
    pub stop: bool,
    /// The state key after the token and its span.
    pub next: u64,
}

impl Edge {
    fn bytes(&self) -> usize {
        EDGE_OVERHEAD + self.forced.len() * 4
    }
}

/// Approximate bookkeeping bytes of one edge and one node (hash-map slots, headers).
const EDGE_OVERHEAD: usize = 48;
const NODE_OVERHEAD: usize = 96;

/// The cached answers of one state.
#[derive(Default)]
struct Node {
    /// `None`: not asked yet; `Some(None)`: every token is allowed.
    mask: Option<Option<Mask>>,
    edges: HashMap<u32, Edge>,
    /// The token last taken from this state and how many times in a row it was taken.
    taken: Option<(u32, u32)>,
    last_used: u64,
    bytes: usize,
}

/// Times in a row a token must have been taken from a state before it is offered as a
/// guess ([`PathTree::guess`]). Where the model's choice depends on the content (digits,
/// names) the streak breaks at once; where it is structural (the `":"` after a key name
/// that the plugin held back) it holds.
pub const GUESS_MIN_STREAK: u32 = 2;

/// Hit and miss counts of a tree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Masks and edges answered from the tree.
    pub hits: u64,
    /// Masks and edges the plugin had to compute.
    pub misses: u64,
    /// Nodes dropped to stay within the budget.
    pub evicted_nodes: u64,
}

impl TreeStats {
    fn count(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }
}

/// The lazily grown graph of one compiled constraint (see the module docs).
pub struct PathTree {
    start: Option<Edge>,
    nodes: HashMap<u64, Node>,
    bytes: usize,
    max_bytes: usize,
    clock: u64,
    stats: TreeStats,
}

impl PathTree {
    /// An empty tree that keeps at most about `max_bytes` of masks and edges.
    pub fn new(max_bytes: usize) -> Self {
        Self { start: None, nodes: HashMap::new(), bytes: 0, max_bytes, clock: 0, stats: TreeStats::default() }
    }

    /// Bytes held (masks, spans and bookkeeping, approximately).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Nodes held.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the tree holds no node.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Hit and miss counts.
    pub fn stats(&self) -> TreeStats {
        self.stats
    }

    /// The edge from the start of the constraint (the initial forced span and first key).
    pub fn start(&mut self) -> Option<Edge> {
        let found = self.start.clone();
        self.count(found.is_some());
        found
    }

    /// Records the start edge.
    pub fn set_start(&mut self, edge: Edge) {
        self.start = Some(edge);
    }

    /// The cached mask of `key`: `Some(None)` allows every token, `None` is a miss.
    pub fn mask(&mut self, key: u64) -> Option<Option<Mask>> {
        let clock = self.tick();
        let found = self.nodes.get_mut(&key).and_then(|n| {
            n.last_used = clock;
            n.mask.clone()
        });
        self.count(found.is_some());
        found
    }

    /// Records the mask of `key`.
    pub fn insert_mask(&mut self, key: u64, mask: Option<Mask>) {
        let added = mask.as_ref().map_or(0, |m| m.len() * 4);
        let node = self.node(key);
        if node.mask.is_none() {
            node.mask = Some(mask);
            node.bytes += added;
            self.bytes += added;
        }
        self.shrink();
    }

    /// The cached edge of `token` from `key`.
    pub fn edge(&mut self, key: u64, token: u32) -> Option<Edge> {
        let clock = self.tick();
        let found = self.nodes.get_mut(&key).and_then(|n| {
            n.last_used = clock;
            n.edges.get(&token).cloned()
        });
        self.count(found.is_some());
        found
    }

    /// Records that a sequence took `token` from `key` (the edge is known).
    pub fn note_taken(&mut self, key: u64, token: u32) {
        if let Some(n) = self.nodes.get_mut(&key) {
            n.taken = match n.taken {
                Some((t, streak)) if t == token => Some((t, streak.saturating_add(1))),
                _ => Some((token, 1)),
            };
        }
    }

    /// The token taken from `key` at least [`GUESS_MIN_STREAK`] times in a row, when its
    /// edge does not end the sequence: a likely next token, with the forced span it brings.
    pub fn guess(&self, key: u64) -> Option<(u32, Arc<[u32]>)> {
        let n = self.nodes.get(&key)?;
        let (token, streak) = n.taken?;
        let edge = n.edges.get(&token).filter(|e| !e.stop)?;
        (streak >= GUESS_MIN_STREAK).then(|| (token, edge.forced.clone()))
    }

    /// Records the edge of `token` from `key`.
    pub fn insert_edge(&mut self, key: u64, token: u32, edge: Edge) {
        let added = edge.bytes();
        let node = self.node(key);
        if node.edges.insert(token, edge).is_none() {
            node.bytes += added;
            self.bytes += added;
        }
        self.shrink();
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn count(&mut self, hit: bool) {
        self.stats.count(hit);
    }

    fn node(&mut self, key: u64) -> &mut Node {
        let clock = self.tick();
        let bytes = &mut self.bytes;
        let node = self.nodes.entry(key).or_insert_with(|| {
            *bytes += NODE_OVERHEAD;
            Node { bytes: NODE_OVERHEAD, ..Node::default() }
        });
        node.last_used = clock;
        node
    }

    /// Drops the least recently used quarter of the nodes (at least one) until the tree fits.
    fn shrink(&mut self) {
        while self.bytes > self.max_bytes && self.nodes.len() > 1 {
            let mut ages: Vec<(u64, u64)> = self.nodes.iter().map(|(&k, n)| (n.last_used, k)).collect();
            ages.sort_unstable();
            let drop = (ages.len() / 4).max(1);
            for &(_, key) in &ages[..drop] {
                if let Some(n) = self.nodes.remove(&key) {
                    self.bytes -= n.bytes;
                    self.stats.evicted_nodes += 1;
                }
            }
        }
    }
}

/// A path tree shared between sequences.
pub type SharedTree = Arc<Mutex<PathTree>>;

/// Locks a tree; a panic in another holder leaves a consistent tree (every update is one
/// map insertion), so poisoning is ignored.
pub fn lock(tree: &Mutex<PathTree>) -> MutexGuard<'_, PathTree> {
    tree.lock().unwrap_or_else(|p| p.into_inner())
}

/// Path trees of many compiled constraints, least recently used dropped first.
pub struct TreeCache<K> {
    trees: HashMap<K, (SharedTree, u64)>,
    clock: u64,
    max_bytes: usize,
    max_trees: usize,
}

impl<K: Hash + Eq + Clone> TreeCache<K> {
    /// A cache of at most `max_trees` trees and about `max_bytes` in all; each tree may use
    /// up to a quarter of the bytes.
    pub fn new(max_trees: usize, max_bytes: usize) -> Self {
        Self { trees: HashMap::new(), clock: 0, max_bytes, max_trees: max_trees.max(1) }
    }

    /// The tree of `key`, created empty on first use.
    pub fn get(&mut self, key: &K) -> SharedTree {
        self.clock += 1;
        let clock = self.clock;
        if let Some((tree, used)) = self.trees.get_mut(key) {
            *used = clock;
            return tree.clone();
        }
        self.make_room();
        let tree = Arc::new(Mutex::new(PathTree::new(self.max_bytes / 4)));
        self.trees.insert(key.clone(), (tree.clone(), clock));
        tree
    }

    /// Trees held.
    pub fn len(&self) -> usize {
        self.trees.len()
    }

    /// Whether no tree is held.
    pub fn is_empty(&self) -> bool {
        self.trees.is_empty()
    }

    /// Bytes held by all trees.
    pub fn bytes(&self) -> usize {
        self.trees.values().map(|(t, _)| lock(t).bytes()).sum()
    }

    /// Hit and miss counts summed over the trees held.
    pub fn stats(&self) -> TreeStats {
        self.trees.values().fold(TreeStats::default(), |acc, (t, _)| {
            let s = lock(t).stats();
            TreeStats {
                hits: acc.hits + s.hits,
                misses: acc.misses + s.misses,
                evicted_nodes: acc.evicted_nodes + s.evicted_nodes,
            }
        })
    }

    /// Drops least recently used trees until one more fits (by count and by bytes).
    fn make_room(&mut self) {
        while !self.trees.is_empty() && (self.trees.len() >= self.max_trees || self.bytes() > self.max_bytes) {
            let oldest = self.trees.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    self.trees.remove(&k);
                }
                None => break,
            }
        }
    }
}

/// The plugin side of one sequence: its own matcher, called only on a miss.
pub trait StateSource {
    /// Commits `tokens` (none: the start) and returns the forced span and the stop flag.
    fn commit(&mut self, tokens: &[u32]) -> anyhow::Result<(Vec<u32>, bool)>;
    /// The mask at the matcher's state (`None`: every token), in the sampler's layout.
    fn mask(&mut self) -> anyhow::Result<Option<Mask>>;
    /// The matcher's state key.
    fn state_key(&mut self) -> anyhow::Result<u64>;
}

/// One sequence's position in a shared [`PathTree`].
pub struct TreeWalker {
    tree: SharedTree,
    key: u64,
    /// Whether the matcher has been started (committed with no tokens).
    started: bool,
    /// Sampled tokens the matcher has not seen yet.
    unsynced: Vec<u32>,
    stats: TreeStats,
}

impl TreeWalker {
    /// A walker at the start of `tree`'s constraint; nothing is asked yet.
    pub fn new(tree: SharedTree) -> Self {
        Self { tree, key: 0, started: false, unsynced: Vec::new(), stats: TreeStats::default() }
    }

    /// The current state key.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Sampled tokens the matcher has not been told yet.
    pub fn unsynced(&self) -> usize {
        self.unsynced.len()
    }

    /// This walker's hits and misses (starts, masks and edges).
    pub fn stats(&self) -> TreeStats {
        self.stats
    }

    fn count(&mut self, hit: bool) {
        self.stats.count(hit);
    }

    /// The span that starts the output.
    pub fn start(&mut self, source: &mut dyn StateSource) -> anyhow::Result<Edge> {
        let cached = lock(&self.tree).start();
        self.count(cached.is_some());
        if let Some(edge) = cached {
            self.key = edge.next;
            return Ok(edge);
        }
        let (forced, stop) = source.commit(&[])?;
        self.started = true;
        let edge = Edge { forced: forced.into(), stop, next: source.state_key()? };
        lock(&self.tree).set_start(edge.clone());
        self.key = edge.next;
        Ok(edge)
    }

    /// The mask at the current state.
    pub fn mask(&mut self, source: &mut dyn StateSource) -> anyhow::Result<Option<Mask>> {
        let cached = lock(&self.tree).mask(self.key);
        self.count(cached.is_some());
        if let Some(mask) = cached {
            return Ok(mask);
        }
        self.sync(source)?;
        let mask = source.mask()?;
        lock(&self.tree).insert_mask(self.key, mask.clone());
        Ok(mask)
    }

    /// Advances over a sampled token; returns the edge taken.
    pub fn commit(&mut self, source: &mut dyn StateSource, token: u32) -> anyhow::Result<Edge> {
        let cached = {
            let mut tree = lock(&self.tree);
            let cached = tree.edge(self.key, token);
            if cached.is_some() {
                tree.note_taken(self.key, token);
            }
            cached
        };
        self.count(cached.is_some());
        if let Some(edge) = cached {
            self.unsynced.push(token);
            self.key = edge.next;
            return Ok(edge);
        }
        self.sync(source)?;
        let (forced, stop) = source.commit(&[token])?;
        let edge = Edge { forced: forced.into(), stop, next: source.state_key()? };
        {
            let mut tree = lock(&self.tree);
            tree.insert_edge(self.key, token, edge.clone());
            tree.note_taken(self.key, token);
        }
        self.key = edge.next;
        Ok(edge)
    }

    /// A likely next token at the current state and the span it brings ([`PathTree::guess`]);
    /// asks nothing of the plugin.
    pub fn guess(&self) -> Option<(u32, Arc<[u32]>)> {
        lock(&self.tree).guess(self.key)
    }

    /// What the tree knows of the states after `draft` (tokens, each with the forced span
    /// expected after it, from the current state): entry `i` is the cached mask of the state
    /// after token `i` and its span (`None`: every token allowed). Stops at the first edge or
    /// mask not cached, an edge whose span differs from the one expected, or one that ends the
    /// sequence. Asks nothing of the plugin and counts no hit or miss.
    pub fn masks_after<'a>(&self, draft: impl IntoIterator<Item = (u32, &'a [u32])>) -> Vec<Option<Mask>> {
        let tree = lock(&self.tree);
        let mut key = self.key;
        let mut masks = Vec::new();
        for (token, forced) in draft {
            let Some(edge) = tree.nodes.get(&key).and_then(|n| n.edges.get(&token)) else { break };
            if edge.stop || *edge.forced != *forced {
                break;
            }
            let Some(mask) = tree.nodes.get(&edge.next).and_then(|n| n.mask.clone()) else { break };
            masks.push(mask);
            key = edge.next;
        }
        masks
    }

    /// Brings the matcher to the walker's state: starts it, replays the sampled tokens (the
    /// plugin advances over their forced spans itself) and adopts the plugin's key.
    fn sync(&mut self, source: &mut dyn StateSource) -> anyhow::Result<()> {
        if !self.started {
            source.commit(&[])?;
            self.started = true;
        } else if self.unsynced.is_empty() {
            return Ok(());
        }
        for token in std::mem::take(&mut self.unsynced) {
            source.commit(&[token])?;
        }
        self.key = source.state_key()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The language `a* b` over tokens {0: "a", 1: "b", 2: "ab"} with the key = state, where
    /// "b" forces token 3 (an end marker). A real (if tiny) matcher, counting its calls.
    struct ABSource {
        state: u64,
        calls: usize,
    }

    impl StateSource for ABSource {
        fn commit(&mut self, tokens: &[u32]) -> anyhow::Result<(Vec<u32>, bool)> {
            self.calls += 1;
            let mut forced = Vec::new();
            for &t in tokens {
                anyhow::ensure!(self.state == 0, "token {t} after the end");
                match t {
                    0 => {}
                    1 | 2 => {
                        self.state = 1;
                        forced.push(3);
                    }
                    _ => anyhow::bail!("token {t} is not allowed"),
                }
            }
            Ok((forced, self.state == 1))
        }
        fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
            self.calls += 1;
            Ok(Some(if self.state == 0 { vec![0b0111] } else { vec![0] }.into()))
        }
        fn state_key(&mut self) -> anyhow::Result<u64> {
            self.calls += 1;
            Ok(self.state)
        }
    }

    fn walk(tree: &SharedTree, tokens: &[u32]) -> (Vec<(Option<Mask>, Edge)>, usize) {
        let mut source = ABSource { state: 0, calls: 0 };
        let mut walker = TreeWalker::new(tree.clone());
        walker.start(&mut source).unwrap();
        let mut seen = Vec::new();
        for &t in tokens {
            let mask = walker.mask(&mut source).unwrap();
            seen.push((mask, walker.commit(&mut source, t).unwrap()));
        }
        let end = Edge { forced: Vec::new().into(), stop: false, next: walker.key() };
        seen.push((walker.mask(&mut source).unwrap(), end));
        (seen, source.calls)
    }

    #[test]
    fn a_token_taken_twice_in_a_row_from_a_state_is_guessed_there() {
        let tree: SharedTree = Arc::new(Mutex::new(PathTree::new(1 << 20)));
        let guess_at_start = |tree: &SharedTree| {
            let mut source = ABSource { state: 0, calls: 0 };
            let mut walker = TreeWalker::new(tree.clone());
            walker.start(&mut source).unwrap();
            walker.guess()
        };
        walk(&tree, &[0]);
        // Taken from state 0 once: too short a streak.
        assert_eq!(guess_at_start(&tree), None);
        walk(&tree, &[0]);
        // 0 twice in a row.
        assert_eq!(guess_at_start(&tree).map(|(t, span)| (t, span.len())), Some((0, 0)));
        walk(&tree, &[1]);
        assert_eq!(guess_at_start(&tree), None, "the streak broke");
        walk(&tree, &[1]);
        // 1 twice in a row, but its edge ends the sequence: not worth a guess.
        assert_eq!(guess_at_start(&tree), None);
    }

    #[test]
    fn a_second_walk_on_a_known_path_makes_no_plugin_call() {
        let tree: SharedTree = Arc::new(Mutex::new(PathTree::new(1 << 20)));
        let (first, calls) = walk(&tree, &[0, 0, 1]);
        assert!(calls > 0);
        let (second, calls) = walk(&tree, &[0, 0, 1]);
        assert_eq!(calls, 0);
        assert_eq!(first, second);
        assert_eq!(second[2].1, Edge { forced: vec![3].into(), stop: true, next: 1 });
    }

    #[test]
    fn a_miss_after_hits_replays_the_sampled_tokens() {
        let tree: SharedTree = Arc::new(Mutex::new(PathTree::new(1 << 20)));
        walk(&tree, &[0, 0]);
        // Known up to two "a"s, then a new token: the matcher must see the two "a"s first.
        let (seen, calls) = walk(&tree, &[0, 0, 2]);
        assert!(calls > 0);
        assert_eq!(seen[2].1, Edge { forced: vec![3].into(), stop: true, next: 1 });
    }

    #[test]
    fn an_evicting_tree_still_gives_the_same_answers() {
        let roomy: SharedTree = Arc::new(Mutex::new(PathTree::new(1 << 20)));
        let tiny: SharedTree = Arc::new(Mutex::new(PathTree::new(200)));
        for tokens in [&[0u32, 1][..], &[2], &[0, 0, 0, 2], &[0, 1]] {
            assert_eq!(walk(&roomy, tokens).0, walk(&tiny, tokens).0);
        }
        let tiny = lock(&tiny);
        assert!(tiny.bytes() <= 200 || tiny.len() == 1, "{} bytes in {} nodes", tiny.bytes(), tiny.len());
        assert!(tiny.stats().evicted_nodes > 0);
    }

    #[test]
    fn the_cache_drops_the_least_recently_used_tree() {
        let mut cache: TreeCache<&str> = TreeCache::new(2, 1 << 20);
        let a = cache.get(&"a");
        cache.get(&"b");
        assert!(Arc::ptr_eq(&a, &cache.get(&"a")));
        cache.get(&"c");
        assert_eq!(cache.len(), 2);
        assert!(Arc::ptr_eq(&a, &cache.get(&"a")), "a was used last, b goes");
        let fresh_b = cache.get(&"b");
        assert_eq!(lock(&fresh_b).len(), 0);
    }
}
