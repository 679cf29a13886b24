//! [`TokenTrie`]: the vocabulary as a byte trie laid out in preorder, so that the allowed
//! tokens of a byte-level recogniser are found in one allocation-free pass that skips every
//! subtree whose prefix the recogniser rejects.
//!
//! Two shortcuts keep a walk from visiting every node of a big allowed subtree: where the
//! state loops on every byte class below a node (inside a string), the subtree's tokens are
//! taken whole; and where it loops on lower-case letters (inside an identifier or a word),
//! a trie built with [`TokenTrie::build_indexed`] has the subtree's tokens split at the end of
//! their run of letters, so the walk inserts the all-letter ones at once and walks only the
//! remainders past the run, which thousands of tokens share.

use crate::bitset::TokenSet;

/// One trie node: the byte on the edge from its parent, its depth, where its subtree ends in
/// preorder, and where its tokens start in `node_tokens`. Tokens are listed in preorder too,
/// so a node's own tokens end where the next node's start, and its whole subtree's end at
/// `subtree_tokens_end` (kept here so that taking a subtree whole reads no other node).
#[derive(Clone, Copy, Debug)]
struct Node {
    byte: u8,
    depth: u16,
    subtree_end: u32,
    tokens_start: u32,
    subtree_tokens_end: u32,
    /// The [`byte_class`]es of the edges below this node (its descendants' bytes), and
    /// [`UTF8_WHOLE`] when this node ends at a character boundary and every path below it is
    /// well-formed UTF-8 (possibly cut inside the last character).
    below: u64,
}

/// A bit of the class sets [`TokenTrie::walk_looping`] passes (beside the [`byte_class`]
/// bits): the subtree starts at a UTF-8 character boundary and holds only well-formed UTF-8,
/// so a state that steps from itself back to itself over every character (and stays alive
/// inside one) accepts all of it.
pub const UTF8_WHOLE: u64 = 1 << 63;

/// The byte classes of the bytes 0x80..=0xff.
pub const NON_ASCII_CLASSES: u64 = 0b1111 << 41;

/// The class of the lower-case ASCII letters, as a class set.
pub const LOWERCASE: u64 = 1 << byte_class(b'a');

/// A flag beside the classes of a node's `below`: the node has a [`Tails`] index. Never
/// passed to [`IdSteps::loops_on`].
const HAS_TAILS: u64 = 1 << 62;

/// The fewest nodes a subtree has for [`TokenTrie::build_indexed`] to give it a [`Tails`]
/// index, and how much smaller than the subtree the index's trie must be.
const TAILS_MIN_NODES: u32 = 48;

/// Where a UTF-8 decoder is: at a character boundary, or inside a character with the bytes
/// still expected and the range the next one must lie in (RFC 3629: no overlong forms, no
/// surrogates, nothing past U+10FFFF).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Utf8Step {
    /// Continuation bytes still expected (0: at a boundary).
    pub remaining: u8,
    /// The smallest allowed next byte.
    pub lo: u8,
    /// The largest allowed next byte.
    pub hi: u8,
}

impl Utf8Step {
    /// At a character boundary.
    pub const BOUNDARY: Utf8Step = Utf8Step { remaining: 0, lo: 0, hi: 0xf4 };

    /// The decoder after byte `b`, or `None` where `b` makes the text ill-formed.
    pub fn next(self, b: u8) -> Option<Utf8Step> {
        let cont = |remaining| Some(Utf8Step { remaining, lo: 0x80, hi: 0xbf });
        if self.remaining > 0 {
            if !(self.lo..=self.hi).contains(&b) {
                return None;
            }
            return if self.remaining == 1 { Some(Utf8Step::BOUNDARY) } else { cont(self.remaining - 1) };
        }
        match b {
            0x00..=0x7f => Some(Utf8Step::BOUNDARY),
            0xc2..=0xdf => cont(1),
            0xe0 => Some(Utf8Step { remaining: 2, lo: 0xa0, hi: 0xbf }),
            0xe1..=0xec | 0xee..=0xef => cont(2),
            0xed => Some(Utf8Step { remaining: 2, lo: 0x80, hi: 0x9f }),
            0xf0 => Some(Utf8Step { remaining: 3, lo: 0x90, hi: 0xbf }),
            0xf1..=0xf3 => cont(3),
            0xf4 => Some(Utf8Step { remaining: 3, lo: 0x80, hi: 0x8f }),
            _ => None,
        }
    }
}

/// The number of byte classes: see [`byte_class`].
pub const BYTE_CLASSES: u32 = 45;

/// The class of a byte, for the subtree signatures of [`TokenTrie::walk_looping`]: control
/// characters, tab, newline, carriage return and space; each ASCII punctuation character on
/// its own; digits; upper-case letters; lower-case letters; DEL; UTF-8 continuation bytes;
/// and the three kinds of UTF-8 lead bytes. Classes group the bytes that identifier-,
/// number- and text-like patterns treat alike, so such a pattern's state loops on whole
/// classes.
pub const fn byte_class(b: u8) -> u32 {
    match b {
        b'\t' => 1,
        b'\n' => 2,
        b'\r' => 3,
        0..=0x1f => 0,
        b' ' => 4,
        b'0'..=b'9' => 37,
        b'A'..=b'Z' => 38,
        b'a'..=b'z' => 39,
        0x21..=0x2f => 5 + (b - 0x21) as u32,
        0x3a..=0x40 => 20 + (b - 0x3a) as u32,
        0x5b..=0x60 => 27 + (b - 0x5b) as u32,
        0x7b..=0x7e => 33 + (b - 0x7b) as u32,
        0x7f => 40,
        0x80..=0xbf => 41,
        0xc0..=0xdf => 42,
        0xe0..=0xef => 43,
        0xf0..=0xff => 44,
    }
}

/// The smallest and largest byte of each class (every class but the control characters is
/// one range), so that [`class_bytes`] looks at a class's own bytes instead of all 256: the
/// loop checks of a mask's walk list the bytes of thousands of classes.
const CLASS_SPAN: [(u8, u8); BYTE_CLASSES as usize] = {
    let mut span = [(u8::MAX, 0u8); BYTE_CLASSES as usize];
    let mut b = 0usize;
    while b < 256 {
        let c = byte_class(b as u8) as usize;
        if span[c].0 > b as u8 {
            span[c].0 = b as u8;
        }
        if span[c].1 < b as u8 {
            span[c].1 = b as u8;
        }
        b += 1;
    }
    span
};

/// The bytes of class `class` (see [`byte_class`]); none for a number that is not a class.
pub fn class_bytes(class: u32) -> impl Iterator<Item = u8> {
    let (lo, hi) = CLASS_SPAN.get(class as usize).copied().unwrap_or((1, 0));
    (lo..=hi).filter(move |&b| byte_class(b) == class)
}

/// Below this many nodes a subtree is cheaper to walk than to check whether a state loops
/// over it.
const MIN_SUBTREE: u32 = 4;

/// What [`TokenTrie::walk_ids`] asks of a table of numbered states.
pub trait IdSteps {
    /// The state after `byte` from `state`, or `None` where the byte is rejected.
    fn step(&mut self, state: u32, byte: u8) -> Option<u32>;
    /// Whether `state` steps to itself on every byte of the [`byte_class`]es in `classes`
    /// (with [`UTF8_WHOLE`]: also over every whole UTF-8 character).
    fn loops_on(&mut self, state: u32, classes: u64) -> bool;
}

/// A byte trie over token strings in preorder (node 0 is the root, the empty prefix).
#[derive(Clone, Debug)]
pub struct TokenTrie {
    nodes: Vec<Node>,
    node_tokens: Vec<u32>,
    max_depth: usize,
    /// The [`Tails`] indexes, by node, in node order (see [`TokenTrie::build_indexed`]).
    tails: Vec<(u32, Tails)>,
}

/// The tokens below one node split where the run of lower-case letters that follows the
/// node ends: those made of nothing else past the node (`pure`, the node's own tokens
/// included), and a trie of the others' remainders from their first other byte on
/// (`rest`). A state that steps to itself on every lower-case letter is in that same state
/// after any such run, so for it the node's whole subtree is one bulk insertion and a walk
/// of the remainders, which many tokens share: inside an identifier, ` foo(` and ` bar(`
/// are both the remainder `(`, and ` foo` and ` bar` need no walk at all. For the
/// Llama-3 vocabulary, the 30,009 tokens of a space and a lower-case letter are 63,267
/// trie nodes; 26,095 of them are pure and the rest's remainders are 8,420 nodes.
#[derive(Clone, Debug)]
struct Tails {
    pure: Vec<u32>,
    rest: TokenTrie,
}

impl TokenTrie {
    /// Builds the trie over tokens `0..vocab`; `bytes_of(id)` gives a token's bytes, empty for
    /// tokens that must not be matched (special tokens).
    pub fn build<'a>(vocab: usize, bytes_of: impl Fn(usize) -> &'a [u8]) -> Self {
        Self::from_pairs((0..vocab).map(|id| (bytes_of(id), id as u32)).collect())
    }

    /// [`Self::build`], plus an index that lets [`Self::walk_ids`] take a big subtree in a
    /// few steps where the state after the node loops on lower-case letters (see `Tails`):
    /// for the vocabularies the plugins serve, where mask walks inside identifiers and
    /// words visit most of the trie otherwise. Costs a few MiB for a 128k vocabulary.
    pub fn build_indexed<'a>(vocab: usize, bytes_of: impl Fn(usize) -> &'a [u8]) -> Self {
        Self::build_indexed_over(vocab, bytes_of, TAILS_MIN_NODES)
    }

    /// [`Self::build_indexed`] indexing subtrees of at least `min_nodes` nodes (tests give
    /// small vocabularies an index this way).
    fn build_indexed_over<'a>(vocab: usize, bytes_of: impl Fn(usize) -> &'a [u8], min_nodes: u32) -> Self {
        let mut trie = Self::build(vocab, &bytes_of);
        let mut tails = Vec::new();
        for i in 1..trie.nodes.len() {
            let n = trie.nodes[i];
            if n.subtree_end - (i as u32) < min_nodes || n.below & LOWERCASE == 0 {
                continue;
            }
            let depth = n.depth as usize;
            let mut pure = Vec::new();
            let mut rest = Vec::new();
            for &t in &trie.node_tokens[n.tokens_start as usize..n.subtree_tokens_end as usize] {
                let after = &bytes_of(t as usize)[depth..];
                let run = after.iter().take_while(|b| b.is_ascii_lowercase()).count();
                if run == after.len() {
                    pure.push(t);
                } else {
                    rest.push((&after[run..], t));
                }
            }
            let rest = Self::from_pairs(rest);
            // Worth it only where the remainders are much smaller than the subtree.
            if rest.nodes.len() as u32 * 2 <= n.subtree_end - i as u32 {
                tails.push((i as u32, Tails { pure, rest }));
                trie.nodes[i].below |= HAS_TAILS;
            }
        }
        trie.tails = tails;
        trie
    }

    /// The trie of `(bytes, id)` pairs (empty and over-long byte strings left out).
    fn from_pairs(mut order: Vec<(&[u8], u32)>) -> Self {
        order.retain(|(b, _)| !b.is_empty() && b.len() < u16::MAX as usize);
        order.sort_unstable();
        let mut nodes =
            vec![Node { byte: 0, depth: 0, subtree_end: 0, tokens_start: 0, subtree_tokens_end: 0, below: 0 }];
        let mut node_tokens = Vec::with_capacity(order.len());
        // `path[d]` is the node index at depth d on the current root-to-leaf path.
        let mut path: Vec<usize> = vec![0];
        let mut path_bytes: Vec<u8> = Vec::new();
        let mut max_depth = 0;
        for (bytes, id) in order {
            let common = path_bytes.iter().zip(bytes).take_while(|(a, b)| a == b).count();
            // Close the nodes deeper than the common prefix: their subtrees are complete.
            while path.len() > common + 1 {
                let closed = path.pop().unwrap_or(0);
                nodes[closed].subtree_end = nodes.len() as u32;
            }
            path_bytes.truncate(common);
            for &b in &bytes[common..] {
                let start = node_tokens.len() as u32;
                nodes.push(Node {
                    byte: b,
                    depth: path.len() as u16,
                    subtree_end: 0,
                    tokens_start: start,
                    subtree_tokens_end: 0,
                    below: 0,
                });
                path.push(nodes.len() - 1);
                path_bytes.push(b);
            }
            max_depth = max_depth.max(bytes.len());
            node_tokens.push(id);
        }
        let end = nodes.len() as u32;
        for &open in &path {
            nodes[open].subtree_end = end;
        }
        // Children come after their parent in preorder: one backward pass folds each node's
        // byte and classes into its parent's. The parent is the nearest earlier node one
        // level up, found with a stack of the latest node per depth.
        // Alongside, each node's UTF-8 decoder state (None: ill-formed on the way) and whether
        // everything below it is well-formed.
        let mut latest: Vec<usize> = Vec::new();
        let mut parent = vec![0usize; nodes.len()];
        let mut utf8 = vec![Some(Utf8Step::BOUNDARY); nodes.len()];
        for (i, n) in nodes.iter().enumerate().skip(1) {
            let d = n.depth as usize;
            latest.truncate(d - 1);
            parent[i] = if d == 1 { 0 } else { latest[d - 2] };
            utf8[i] = utf8[parent[i]].and_then(|u| u.next(n.byte));
            latest.push(i);
        }
        let mut well_formed_below = vec![true; nodes.len()];
        for i in (1..nodes.len()).rev() {
            let add = nodes[i].below & !UTF8_WHOLE | 1u64 << byte_class(nodes[i].byte);
            let p = parent[i];
            nodes[p].below |= add;
            well_formed_below[p] &= utf8[i].is_some() && well_formed_below[i];
        }
        for (i, n) in nodes.iter_mut().enumerate() {
            if well_formed_below[i] && utf8[i] == Some(Utf8Step::BOUNDARY) {
                n.below |= UTF8_WHOLE;
            }
        }
        let total = node_tokens.len() as u32;
        for i in 0..nodes.len() {
            let end = nodes[i].subtree_end as usize;
            nodes[i].subtree_tokens_end = nodes.get(end).map_or(total, |n| n.tokens_start);
        }
        Self { nodes, node_tokens, max_depth, tails: Vec::new() }
    }

    /// The [`Tails`] index of node `i`, which has one.
    fn tails_at(&self, i: usize) -> Option<&Tails> {
        let k = self.tails.binary_search_by_key(&(i as u32), |(n, _)| *n).ok()?;
        Some(&self.tails[k].1)
    }

    /// How many nodes have a `Tails` index, and how many nodes and token entries the
    /// indexes hold (for tests and size reports).
    pub fn tails_size(&self) -> (usize, usize, usize) {
        let nodes = self.tails.iter().map(|(_, t)| t.rest.nodes.len()).sum();
        let entries = self.tails.iter().map(|(_, t)| t.pure.len() + t.rest.node_tokens.len()).sum();
        (self.tails.len(), nodes, entries)
    }

    /// Where node `i`'s own tokens end in `node_tokens`: where the next node's start.
    #[inline]
    fn tokens_end(&self, i: usize) -> u32 {
        self.nodes.get(i + 1).map_or(self.node_tokens.len() as u32, |n| n.tokens_start)
    }

    /// The number of nodes, root included.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The length of the longest token, in bytes.
    pub fn max_token_len(&self) -> usize {
        self.max_depth
    }

    /// Walks every token whose bytes `step` accepts from `start`, calling `on_token` for each.
    /// `step(state, byte)` advances a recogniser by one byte (None: rejected, the whole subtree
    /// is skipped). `stack` is scratch space, reused across calls so the walk does not
    /// allocate once it has grown to the longest token.
    pub fn walk<S: Clone>(
        &self,
        start: &S,
        stack: &mut Vec<S>,
        step: impl FnMut(&S, u8) -> Option<S>,
        on_token: impl FnMut(u32),
    ) {
        self.walk_looping(start, stack, step, |_, _| false, on_token);
    }

    /// [`Self::walk`] with a shortcut for states that repeat (a lazily built DFA's): where the
    /// state after a node's byte loops on every byte below that node
    /// (`loops_on(state, classes)`: the state steps to itself on every byte of those
    /// [`byte_class`]es), the whole subtree is accepted without stepping through it. Inside
    /// an identifier or a string most of the vocabulary is such subtrees.
    pub fn walk_looping<S: Clone>(
        &self,
        start: &S,
        stack: &mut Vec<S>,
        mut step: impl FnMut(&S, u8) -> Option<S>,
        mut loops_on: impl FnMut(&S, u64) -> bool,
        mut on_token: impl FnMut(u32),
    ) {
        // `stack[d]` is the state after the first `d` bytes of the node being visited.
        stack.clear();
        stack.push(start.clone());
        let nodes = &self.nodes[..];
        let tokens = &self.node_tokens[..];
        let mut i = 1;
        while let Some(node) = nodes.get(i) {
            let depth = node.depth as usize;
            match step(&stack[depth - 1], node.byte) {
                Some(next) => {
                    if node.subtree_end - i as u32 > MIN_SUBTREE && loops_on(&next, node.below & !HAS_TAILS) {
                        for &t in &tokens[node.tokens_start as usize..node.subtree_tokens_end as usize] {
                            on_token(t);
                        }
                        i = node.subtree_end as usize;
                        continue;
                    }
                    for &t in &tokens[node.tokens_start as usize..self.tokens_end(i) as usize] {
                        on_token(t);
                    }
                    stack.truncate(depth);
                    stack.push(next);
                    i += 1;
                }
                None => i = node.subtree_end as usize,
            }
        }
    }

    /// [`Self::walk_looping`] for states that are numbers in a table (a lazily built DFA's),
    /// inserting the tokens into `set`: the hot loop of a mask, kept free of clones, pushes
    /// and per-token calls.
    pub fn walk_ids(&self, start: u32, stack: &mut Vec<u32>, table: &mut impl IdSteps, set: &mut TokenSet) {
        stack.clear();
        stack.resize(self.max_depth + 1, start);
        let nodes = &self.nodes[..];
        let tokens = &self.node_tokens[..];
        let mut tail_stack = Vec::new();
        let mut i = 1;
        while let Some(node) = nodes.get(i) {
            let depth = node.depth as usize;
            let Some(next) = table.step(stack[depth - 1], node.byte) else {
                i = node.subtree_end as usize;
                continue;
            };
            if node.subtree_end - i as u32 > MIN_SUBTREE {
                if table.loops_on(next, node.below & !HAS_TAILS) {
                    set.insert_all(&tokens[node.tokens_start as usize..node.subtree_tokens_end as usize]);
                    i = node.subtree_end as usize;
                    continue;
                }
                if node.below & HAS_TAILS != 0
                    && table.loops_on(next, LOWERCASE)
                    && let Some(tails) = self.tails_at(i)
                {
                    set.insert_all(&tails.pure);
                    tails.rest.walk_ids(next, &mut tail_stack, table, set);
                    i = node.subtree_end as usize;
                    continue;
                }
            }
            let own_end = nodes.get(i + 1).map_or(tokens.len(), |n| n.tokens_start as usize);
            set.insert_all(&tokens[node.tokens_start as usize..own_end]);
            stack[depth] = next;
            i += 1;
        }
    }

    /// Walks the tokens that extend `prefix` by at least one byte, stepping `step` from `start`
    /// over the bytes after `prefix` (a rejected byte skips its subtree), and calls
    /// `on_token` with each token reached; `on_token` returning `false` ends the walk. Nothing
    /// when no token starts with `prefix`. This is how a forced span's tail finds the tokens
    /// that could merge it with what follows.
    pub fn walk_extensions<S: Clone>(
        &self,
        prefix: &[u8],
        start: &S,
        stack: &mut Vec<S>,
        mut step: impl FnMut(&S, u8) -> Option<S>,
        mut on_token: impl FnMut(u32) -> bool,
    ) {
        let Some(root) = self.node_of(prefix) else { return };
        let base = self.nodes[root].depth as usize;
        let end = self.nodes[root].subtree_end as usize;
        let tokens = &self.node_tokens[..];
        // `stack[d]` is the state after the first `d` bytes past `prefix`.
        stack.clear();
        stack.push(start.clone());
        let mut i = root + 1;
        while i < end {
            let node = &self.nodes[i];
            let depth = node.depth as usize - base;
            match step(&stack[depth - 1], node.byte) {
                Some(next) => {
                    for &t in &tokens[node.tokens_start as usize..self.tokens_end(i) as usize] {
                        if !on_token(t) {
                            return;
                        }
                    }
                    stack.truncate(depth);
                    stack.push(next);
                    i += 1;
                }
                None => i = node.subtree_end as usize,
            }
        }
    }

    /// The node of `prefix`, or `None` when no token starts with it.
    fn node_of(&self, prefix: &[u8]) -> Option<usize> {
        let mut node = 0usize;
        for &b in prefix {
            let end = self.nodes[node].subtree_end as usize;
            let mut child = node + 1;
            while child < end && self.nodes[child].byte != b {
                child = self.nodes[child].subtree_end as usize;
            }
            if child >= end {
                return None;
            }
            node = child;
        }
        Some(node)
    }

    /// Calls `f` with each byte that continues `prefix` into a longer token (the edges below
    /// `prefix`'s node); nothing when no token starts with `prefix`.
    pub fn continuations(&self, prefix: &[u8], mut f: impl FnMut(u8)) {
        let Some(node) = self.node_of(prefix) else { return };
        let end = self.nodes[node].subtree_end as usize;
        let mut child = node + 1;
        while child < end {
            f(self.nodes[child].byte);
            child = self.nodes[child].subtree_end as usize;
        }
    }

    /// The longest token that is a prefix of `text`: its id and length.
    pub fn longest_prefix(&self, text: &[u8]) -> Option<(u32, usize)> {
        let mut best = None;
        let mut node = 0usize;
        for (k, &b) in text.iter().enumerate() {
            // Children of `node` are the nodes in (node, subtree_end) at depth + 1.
            let end = self.nodes[node].subtree_end as usize;
            let mut child = node + 1;
            let mut found = None;
            while child < end {
                if self.nodes[child].byte == b {
                    found = Some(child);
                    break;
                }
                child = self.nodes[child].subtree_end as usize;
            }
            let Some(c) = found else { break };
            node = c;
            let nd = self.nodes[c];
            if self.tokens_end(c) > nd.tokens_start {
                best = Some((self.node_tokens[nd.tokens_start as usize], k + 1));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trie(tokens: &[&str]) -> TokenTrie {
        TokenTrie::build(tokens.len(), |i| tokens[i].as_bytes())
    }

    #[test]
    fn walk_finds_exactly_the_tokens_a_recogniser_accepts() {
        let tokens = ["a", "ab", "abc", "b", "ba", "c", "", "ab"];
        let t = trie(&tokens);
        // Recogniser: any string over {a, b} of length <= 2; state = length so far.
        let mut got = Vec::new();
        let mut stack = Vec::new();
        t.walk(
            &0usize,
            &mut stack,
            |&len, b| (len < 2 && (b == b'a' || b == b'b')).then_some(len + 1),
            |id| got.push(id),
        );
        got.sort();
        assert_eq!(got, vec![0, 1, 3, 4, 7]);
    }

    #[test]
    fn looping_walk_agrees_with_the_plain_walk() {
        let tokens = ["abc", "abcd", "abcde", "abcdef", "ab(", "abz9", "a", "abcdefgh", "abc_d", "x", "ab", "abcdd"];
        let t = trie(&tokens);
        // State 0: start; 1: after `a`; 2: inside [a-z]* after `ab` (loops on letters).
        let step = |&s: &u32, b: u8| match (s, b) {
            (0, b'a') => Some(1),
            (1, b'b') => Some(2),
            (2, b'a'..=b'z') => Some(2),
            _ => None,
        };
        let mut plain = Vec::new();
        t.walk(&0u32, &mut Vec::new(), step, |id| plain.push(id));
        let mut looping = Vec::new();
        let mut checks = 0;
        let loops_on = |&s: &u32, classes: u64| {
            checks += 1;
            s == 2 && classes & !(1u64 << byte_class(b'a')) == 0
        };
        t.walk_looping(&0, &mut Vec::new(), step, loops_on, |id| looping.push(id));
        plain.sort();
        looping.sort();
        assert_eq!(plain, vec![0, 1, 2, 3, 6, 7, 10, 11]);
        assert_eq!(looping, plain);
        assert!(checks > 0);
    }

    /// A table over [`looping_walk_agrees_with_the_plain_walk`]'s states for `walk_ids`.
    struct Letters {
        checks: usize,
    }

    impl IdSteps for Letters {
        fn step(&mut self, s: u32, b: u8) -> Option<u32> {
            match (s, b) {
                (0, b'a') => Some(1),
                (1, b'b') => Some(2),
                (2, b'a'..=b'z') => Some(2),
                _ => None,
            }
        }
        fn loops_on(&mut self, s: u32, classes: u64) -> bool {
            self.checks += 1;
            s == 2 && classes & !(1u64 << byte_class(b'a')) == 0
        }
    }

    #[test]
    fn id_walk_agrees_with_the_plain_walk() {
        let tokens = ["abc", "abcd", "abcde", "abcdef", "ab(", "abz9", "a", "abcdefgh", "abc_d", "x", "ab", "abcdd"];
        let t = trie(&tokens);
        let mut plain = Vec::new();
        t.walk(&0u32, &mut Vec::new(), |&s, b| Letters { checks: 0 }.step(s, b), |id| plain.push(id));
        plain.sort();
        let mut steps = Letters { checks: 0 };
        let mut set = TokenSet::new(tokens.len());
        t.walk_ids(0, &mut Vec::new(), &mut steps, &mut set);
        let ids: Vec<u32> = (0..tokens.len() as u32).filter(|&i| set.contains(i)).collect();
        assert_eq!(ids, plain);
        assert_eq!(ids, vec![0, 1, 2, 3, 6, 7, 10, 11]);
        assert!(steps.checks > 0, "the subtree below `ab` is large enough to be checked");
        // Each node's own tokens, and a subtree's, end where the trie says: the ids of the
        // subtree below `abc` (taken whole from state 2) are exactly the tokens that start
        // with `abc` and stay in letters.
        let mut set = TokenSet::new(tokens.len());
        t.walk_ids(2, &mut Vec::new(), &mut Letters { checks: 0 }, &mut set);
        let from_letters: Vec<u32> = (0..tokens.len() as u32).filter(|&i| set.contains(i)).collect();
        let expected: Vec<u32> =
            (0..tokens.len() as u32).filter(|&i| tokens[i as usize].bytes().all(|b| b.is_ascii_lowercase())).collect();
        assert_eq!(from_letters, expected);
    }

    /// Identifiers and calls: 0 start (space or a letter), 1 inside `[a-z][a-z0-9]*`, 2 after
    /// `(`, 3 after `()`; `.` goes back to 0. Its loop checks are exact.
    struct Calls {
        /// How many loop checks of the lower-case letters alone succeeded: the index's use.
        lowercase_loops: usize,
    }

    impl IdSteps for Calls {
        fn step(&mut self, s: u32, b: u8) -> Option<u32> {
            match (s, b) {
                (0, b' ') => Some(0),
                (0 | 1, b'a'..=b'z') => Some(1),
                (1, b'0'..=b'9') => Some(1),
                (1, b'(') => Some(2),
                (1, b'.') => Some(0),
                (2, b')') => Some(3),
                _ => None,
            }
        }
        fn loops_on(&mut self, s: u32, classes: u64) -> bool {
            assert_eq!(classes & HAS_TAILS, 0, "the index flag is not a class");
            if classes & NON_ASCII_CLASSES != 0 {
                return false;
            }
            let loops = (0..BYTE_CLASSES)
                .filter(|c| classes >> c & 1 == 1)
                .all(|c| class_bytes(c).all(|b| self.step(s, b) == Some(s)));
            self.lowercase_loops += (loops && classes == LOWERCASE) as usize;
            loops
        }
    }

    #[test]
    fn tails_index_walks_agree_with_the_plain_walk() {
        let mut words = Vec::new();
        for lead in ["", " "] {
            for stem in ["a", "ab", "abc", "zz", "x9", "q"] {
                for run in ["", "a", "bc", "xyz", "zzzz"] {
                    for tail in ["", "(", "()", "(x", ".", ".ab", "9", "9a", ")", " "] {
                        words.push(format!("{lead}{stem}{run}{tail}"));
                    }
                }
            }
        }
        words.sort();
        words.dedup();
        let plain_trie = TokenTrie::build(words.len(), |i| words[i].as_bytes());
        let indexed = TokenTrie::build_indexed_over(words.len(), |i| words[i].as_bytes(), 4);
        let (indexes, nodes, entries) = indexed.tails_size();
        assert!(indexes > 0 && nodes > 0 && entries > 0, "{indexes} {nodes} {entries}");
        assert!(nodes < plain_trie.node_count(), "the remainders are smaller than the trie");
        for start in 0..4u32 {
            let mut plain = Vec::new();
            let mut calls = Calls { lowercase_loops: 0 };
            plain_trie.walk(&start, &mut Vec::new(), |&s, b| calls.step(s, b), |id| plain.push(id));
            plain.sort();
            let mut set = TokenSet::new(words.len());
            indexed.walk_ids(start, &mut Vec::new(), &mut calls, &mut set);
            let got: Vec<u32> = (0..words.len() as u32).filter(|&i| set.contains(i)).collect();
            assert_eq!(got, plain, "from state {start}");
            if start < 2 {
                assert!(calls.lowercase_loops > 0, "from state {start} the walk takes indexed subtrees");
            }
        }
        // A plain build has no index.
        assert_eq!(plain_trie.tails_size(), (0, 0, 0));
    }

    #[test]
    fn utf8_steps_accept_exactly_well_formed_text() {
        let run = |bytes: &[u8]| bytes.iter().try_fold(Utf8Step::BOUNDARY, |u, &b| u.next(b));
        for text in ["", "abc", "é", "日本語", "🦀", "a\u{10ffff}z", "\u{d7ff}\u{e000}"] {
            assert_eq!(run(text.as_bytes()), Some(Utf8Step::BOUNDARY), "{text}");
        }
        // Cut inside a character: alive, not at a boundary.
        assert!(run(&"é".as_bytes()[..1]).is_some_and(|u| u != Utf8Step::BOUNDARY));
        // Overlong, surrogate, past U+10FFFF, stray continuation, bad lead.
        for bad in
            [&[0xc0, 0x80][..], &[0xe0, 0x80, 0x80], &[0xed, 0xa0, 0x80], &[0xf4, 0x90, 0x80, 0x80], &[0x80], &[0xff]]
        {
            assert_eq!(run(bad), None, "{bad:x?}");
        }
        let t = trie(&["é", "éa", "éab", "éabc", "éabcd", "\u{fffd}"]);
        // Node 1 is the first byte of `é` (inside a character), node 2 its end.
        assert_eq!(t.nodes[1].below & UTF8_WHOLE, 0);
        assert_ne!(t.nodes[2].below & UTF8_WHOLE, 0);
        let t = trie(&["é", "é\u{80}", "éa"]);
        assert_ne!(t.nodes[2].below & UTF8_WHOLE, 0);
        let bad = TokenTrie::build(2, |i| [&b"\xc3\xa9"[..], &b"\xc3\xa9\xff"[..]][i]);
        assert_eq!(bad.nodes[2].below & UTF8_WHOLE, 0);
    }

    #[test]
    fn byte_classes_cover_every_byte_below_the_limit() {
        for b in 0..=255u8 {
            assert!(byte_class(b) < BYTE_CLASSES, "{b}");
            assert!(class_bytes(byte_class(b)).any(|x| x == b));
        }
        assert_eq!(byte_class(b'q'), byte_class(b'a'));
        assert_ne!(byte_class(b'_'), byte_class(b'-'));
        // Each class lists exactly its own bytes, in order, and a number past the classes none.
        for class in 0..BYTE_CLASSES {
            let listed: Vec<u8> = class_bytes(class).collect();
            let all: Vec<u8> = (0..=255u8).filter(|&b| byte_class(b) == class).collect();
            assert_eq!(listed, all, "class {class}");
        }
        assert_eq!(class_bytes(BYTE_CLASSES).count(), 0);
        assert_eq!(class_bytes(63).count(), 0);
    }

    #[test]
    fn continuations_are_the_bytes_that_extend_a_prefix() {
        let t = trie(&["a", "ab", "abc", "abd", "b", "xy"]);
        let mut got = Vec::new();
        t.continuations(b"ab", |b| got.push(b));
        assert_eq!(got, b"cd");
        got.clear();
        t.continuations(b"", |b| got.push(b));
        assert_eq!(got, b"abx");
        got.clear();
        t.continuations(b"abc", |b| got.push(b));
        t.continuations(b"q", |b| got.push(b));
        t.continuations(b"x", |b| got.push(b));
        assert_eq!(got, b"y");
    }

    #[test]
    fn longest_prefix_prefers_longer_tokens() {
        let t = trie(&["a", "ab", "abc", "b"]);
        assert_eq!(t.longest_prefix(b"abd"), Some((1, 2)));
        assert_eq!(t.longest_prefix(b"abcd"), Some((2, 3)));
        assert_eq!(t.longest_prefix(b"x"), None);
        assert_eq!(t.max_token_len(), 3);
    }
}
