//! The byte-level recogniser of a compiled schema: a pushdown automaton over JSON bytes.
//!
//! A state is a small set of configurations (more than one only inside a union whose branches
//! start alike, e.g. two object shapes); a configuration is a stack of [`Frame`]s with the
//! end-of-document frame at the bottom. Frames hold only what decides the future: a string's
//! length only when a length bound applies, a number's value only when a bound applies, so
//! that equal futures get equal state keys and the host's path tree stays small.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};

use regex_automata::dfa::Automaton;
use regex_automata::util::primitives::StateID;

use dspark_guest::{Recognizer, StateTable, Steps, TokenSet, TokenTable, TokenTrie, key};

use crate::graph::{ANY, Graph, Node, NodeId, PropertyOrder, integer_bounds};
use crate::stack::Stack;

/// Object parsing phases.
const OBJ_OPEN: u8 = 0; // after `{`: a key or `}`
const OBJ_COMMA: u8 = 1; // after `,`: a key
const OBJ_KEY: u8 = 2; // after a key: `:`
const OBJ_VALUE: u8 = 3; // after a value: `,` or `}`
const OBJ_CLOSE: u8 = 4; // indented layout, after the newline before `}`: only `}`

/// Array parsing phases.
const ARR_OPEN: u8 = 0;
const ARR_COMMA: u8 = 1;
const ARR_VALUE: u8 = 2;
const ARR_CLOSE: u8 = 3; // indented layout, after the newline before `]`: only `]`
/// [`Frame::Arr`]'s `start` when no captured item is being written.
const NO_ITEM: u32 = u32::MAX;

/// Number phases (JSON grammar).
const NUM_START: u8 = 0;
const NUM_MINUS: u8 = 1;
const NUM_ZERO: u8 = 2;
const NUM_INT: u8 = 3;
const NUM_DOT: u8 = 4;
const NUM_FRAC: u8 = 5;
const NUM_E: u8 = 6;
const NUM_ESIGN: u8 = 7;
const NUM_EXP: u8 = 8;

/// A string's escape/UTF-8 progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Chars {
    /// 0: plain; 1: after `\`; 2..=5: that many hex digits of `\u` still to read, plus one;
    /// 6: a high surrogate was read, `\` must follow; 7: then `u`.
    esc: u8,
    /// UTF-8 continuation bytes still expected.
    utf8: u8,
    /// The allowed range of the next continuation byte when it is not 0x80..=0xBF (Unicode
    /// table 3-7): 1: A0..BF, 2: 80..9F, 3: 90..BF, 4: 80..8F.
    first: u8,
    /// The `\u` escape being read must be a low surrogate (DC00..DFFF).
    low: bool,
    /// The `\u` code unit read so far.
    hex: u16,
    /// While a low surrogate's `\u` escape is read: the high surrogate before it.
    high: u16,
}

/// The state of a content-class walk: string escapes/UTF-8, automaton states, characters.
#[derive(Clone, Copy, Hash)]
struct ClassWalk {
    chars: Chars,
    dfa: [u32; 4],
    count: u32,
}

/// The content-class walk as a byte machine for a [`StateTable`]: escape-free string content
/// that keeps the automata of `key` alive (all of them, or for a key any) in the room left.
struct ClassSteps<'a> {
    graph: &'a Graph,
    key: ClassKey,
    /// Whether the character count can decide anything in this walk (see `content_class`).
    counted: bool,
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

/// One level of the parse stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// The end of the document: nothing may follow.
    End,
    /// A value of `node` is expected next.
    Value(NodeId),
    /// Inside an object.
    Obj {
        node: NodeId,
        phase: u8,
        /// Schema order: the index of the next declared property that may appear.
        next: u16,
        /// Any order: declared properties already written (first 64).
        seen: u64,
        count: u32,
        /// The node of the value after the current key.
        pending: NodeId,
    },
    /// Inside a declared key (bytes of its JSON encoding, through the object's key trie).
    Key { obj: NodeId, trie: u32, lo: u16, hi: u16, seen: u64 },
    /// Inside a key that is not declared (an additional property).
    FreeKey { obj: NodeId, trie: Option<u32>, chars: Chars, dfa: [u32; 4] },
    /// Inside an array; `used`: under an exact `uniqueItems` over literals, those already
    /// written; `texts`: under one over open strings, integers or objects, the sorted hashes
    /// (or integer keys) of the items written; `start`: under one over objects
    /// ([`crate::graph::ArrayNode::unique_values`]), where the item being written begins in
    /// the stack's capture ([`NO_ITEM`] between items).
    Arr { node: NodeId, phase: u8, count: u32, used: u64, texts: Option<Arc<Vec<u64>>>, start: u32 },
    /// Inside a string; `text`: for an item under an exact `uniqueItems` over open strings,
    /// the hash of its decoded text so far (see [`extend_text`]).
    Str { node: NodeId, len: u32, chars: Chars, dfa: [u32; 2], text: Option<NonZeroU64> },
    /// Inside a number; `value` is tracked (as f64 bits) only when the node has bounds.
    Num { node: NodeId, phase: u8, neg: bool, value: u64, frac: u16, exp: u16, exp_neg: bool },
    /// Inside one of a literal set's strings; `unique`: an item of an array with an exact
    /// `uniqueItems`, with the literals already written there (which it must not repeat).
    Lit { set: u32, trie: u32, unique: Option<u64> },
    /// Inside layout whitespace that must be written exactly (separators, indentation):
    /// [`Layout::pads`]`[text]`, `pos` bytes of it written.
    Pad { text: u16, pos: u16 },
    /// Inside free whitespace between tokens, at state `s` of the whitespace automaton.
    Ws { s: u32 },
}

/// A configuration: a parse stack.
pub type Config = Stack;

/// The recogniser state: the live configurations (almost always one), deduplicated, in a
/// canonical order. The first is held inline so that cloning a one-configuration state does
/// not allocate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    first: Config,
    more: Vec<Config>,
}

impl State {
    fn configs(&self) -> impl Iterator<Item = &Config> {
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

/// Where a captured item ends: the capture's hash and length, the item's start in it, and
/// its last byte.
type ItemEnd = (u64, u32, u32, u8);

/// The value key of the captured item that begins at `start` and ends with byte `last`.
/// A mask meets the same item end once per token that closes it (`}`, `},`, `}]`, ...), so
/// the last few are remembered by the capture's hash rather than parsed again.
fn captured_item_key(stack: &Config, start: u32, last: u8) -> u64 {
    let id = stack.capture_key().map(|(hash, len)| (hash, len, start, last));
    if let Some(id) = id
        && let Some(key) = ITEM_KEYS.with(|keys| keys.borrow().iter().find(|(k, _)| *k == id).map(|(_, v)| *v))
    {
        return key;
    }
    let mut bytes = stack.captured_since(start);
    bytes.push(last);
    let key = crate::values::canonical_hash(&bytes);
    if let Some(id) = id {
        ITEM_KEYS.with(|keys| {
            let mut keys = keys.borrow_mut();
            if keys.len() >= 16 {
                keys.remove(0);
            }
            keys.push((id, key));
        });
    }
    key
}

thread_local! {
    /// The value keys of the last captured items met ([`captured_item_key`]).
    static ITEM_KEYS: std::cell::RefCell<Vec<(ItemEnd, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Scratch space for `advance`, so a step does not allocate its output list.
    static SCRATCH: std::cell::RefCell<Vec<Config>> = const { std::cell::RefCell::new(Vec::new()) };
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
    pads: Vec<Vec<u8>>,
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

    fn levels(&self) -> usize {
        if self.indent.is_some() { MAX_INDENT_DEPTH + 1 } else { 1 }
    }

    /// The pad after `,` at depth `d`, if that depth is laid out.
    fn after_comma(&self, d: usize) -> Option<u16> {
        let d = if self.indent.is_some() { d } else { 0 };
        (d < self.levels()).then_some((1 + d) as u16)
    }

    /// The pad `newline + indent·d`.
    fn line(&self, d: usize) -> Option<u16> {
        (d < self.levels()).then_some((1 + self.levels() + d) as u16)
    }

    fn ws_start(&self) -> Option<u32> {
        let dfa = self.ws.as_ref()?;
        dfa.start_state(&regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes))
            .ok()
            .map(|s| s.as_u32())
    }

    fn ws_step(&self, s: u32, b: u8) -> Option<u32> {
        let dfa = self.ws.as_ref()?;
        let n = dfa.next_state(StateID::new_unchecked(s as usize), b);
        (!dfa.is_dead_state(n) && !dfa.is_quit_state(n)).then(|| n.as_u32())
    }

    fn ws_accepts(&self, s: u32) -> bool {
        self.ws.as_ref().is_some_and(|dfa| dfa.is_match_state(dfa.next_eoi_state(StateID::new_unchecked(s as usize))))
    }
}

/// JSON's whitespace bytes.
fn is_json_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// The number of containers (objects and arrays) on a stack: the depth inside the top one.
fn container_depth(stack: &Config) -> usize {
    stack.iter().filter(|f| matches!(f, Frame::Obj { .. } | Frame::Arr { .. })).count()
}

/// A compiled schema as a [`Recognizer`].
pub struct SchemaRecognizer {
    graph: Graph,
    layout: Layout,
    pattern_classes: PatternClassCache,
    /// The states mask walks met, tabulated (see [`StateTable`]), for the configurations that
    /// take no in-string fast path.
    walks: Mutex<StateTable<State>>,
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
    fn remember_class(&self, key: ClassKey, class: Arc<TokenSet>) {
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

    /// Feeds `b` to one configuration; pushes the resulting configurations onto `out`.
    fn step(&self, mut stack: Config, b: u8, out: &mut Vec<Config>, depth: u32) {
        if depth > 64 {
            return; // a union nested this deep in one byte: refuse rather than loop
        }
        let Some(top) = stack.pop() else { return };
        let g = &self.graph;
        let layout = &self.layout;
        // Free whitespace: a gap between tokens takes whitespace bytes through the whitespace
        // automaton, and ends (if the automaton accepts) at the first byte it does not take.
        if layout.ws.is_some() {
            if let Frame::Ws { s } = top {
                if is_json_ws(b) {
                    // More whitespace than the pattern allows in one gap is refused, not
                    // split into a second gap.
                    if let Some(n) = layout.ws_step(s, b) {
                        stack.push(Frame::Ws { s: n });
                        out.push(stack);
                    }
                } else if layout.ws_accepts(s) {
                    self.step(stack, b, out, depth + 1);
                }
                return;
            }
            if is_json_ws(b) && matches!(top, Frame::Obj { .. } | Frame::Arr { .. } | Frame::Value(_) | Frame::End) {
                if let Some(n) = layout.ws_start().and_then(|s0| layout.ws_step(s0, b)) {
                    stack.push(top);
                    stack.push(Frame::Ws { s: n });
                    out.push(stack);
                }
                return;
            }
        }
        match top {
            Frame::Ws { .. } => {}
            Frame::Pad { text, pos } => {
                let pad = &layout.pads[text as usize];
                if pad.get(pos as usize) == Some(&b) {
                    if pos as usize + 1 < pad.len() {
                        stack.push(Frame::Pad { text, pos: pos + 1 });
                    }
                    out.push(stack);
                }
            }
            Frame::End => {}
            Frame::Value(node) => self.start_value(stack, node, b, out, depth),
            Frame::Obj { node, phase, next, seen, count, pending } => {
                let Node::Object(o) = g.node(node) else { return };
                let indent = layout.indent.is_some();
                match (phase, b) {
                    (OBJ_KEY, b':') => {
                        stack.push(Frame::Obj { node, phase: OBJ_VALUE, next, seen, count, pending });
                        stack.push(Frame::Value(pending));
                        if !layout.key_after.is_empty() {
                            stack.push(Frame::Pad { text: 0, pos: 0 });
                        }
                        out.push(stack);
                    }
                    (OBJ_VALUE, b',') if count < o.max_props && self.key_possible(node, next, seen, count) => {
                        let d = container_depth(&stack) + 1;
                        stack.push(Frame::Obj { node, phase: OBJ_COMMA, next, seen, count, pending });
                        match layout.after_comma(d) {
                            Some(pad) if !layout.pads[pad as usize].is_empty() => {
                                stack.push(Frame::Pad { text: pad, pos: 0 })
                            }
                            Some(_) => {}
                            None => return,
                        }
                        out.push(stack);
                    }
                    // Indented: a non-empty object opens its first key and closes on a new line.
                    (OBJ_OPEN, b'\n')
                        if indent && count < o.max_props && self.key_possible(node, next, seen, count) =>
                    {
                        let d = container_depth(&stack) + 1;
                        let Some(pad) = layout.line(d) else { return };
                        stack.push(Frame::Obj { node, phase: OBJ_COMMA, next, seen, count, pending });
                        if layout.pads[pad as usize].len() > 1 {
                            stack.push(Frame::Pad { text: pad, pos: 1 });
                        }
                        out.push(stack);
                    }
                    (OBJ_VALUE, b'\n') if indent && self.object_closable(node, next, seen, count) => {
                        let d = container_depth(&stack);
                        let Some(pad) = layout.line(d) else { return };
                        stack.push(Frame::Obj { node, phase: OBJ_CLOSE, next, seen, count, pending });
                        if layout.pads[pad as usize].len() > 1 {
                            stack.push(Frame::Pad { text: pad, pos: 1 });
                        }
                        out.push(stack);
                    }
                    (OBJ_OPEN, b'}') | (OBJ_VALUE, b'}')
                        if (phase == OBJ_OPEN || !indent) && self.object_closable(node, next, seen, count) =>
                    {
                        if let Some(stack) = self.end_captured_item(stack, b) {
                            out.push(stack);
                        }
                    }
                    (OBJ_CLOSE, b'}') => {
                        if let Some(stack) = self.end_captured_item(stack, b) {
                            out.push(stack);
                        }
                    }
                    (OBJ_OPEN, b'"') if indent => {}
                    (OBJ_OPEN | OBJ_COMMA, b'"') if count < o.max_props => {
                        let (lo, hi) = self.key_window(node, next, seen, count);
                        let base = Frame::Obj { node, phase: OBJ_KEY, next, seen, count: count + 1, pending };
                        if lo <= hi
                            && let Some(t) = o.keys.child(0, b'"')
                            && self.key_reachable(node, t, lo, hi, seen)
                        {
                            let mut s = stack.clone();
                            s.push(base.clone());
                            s.push(Frame::Key { obj: node, trie: t, lo, hi, seen });
                            out.push(s);
                        }
                        if (o.additional != crate::graph::NEVER || !o.patterns.is_empty())
                            && self.additional_allowed(node, next, seen)
                        {
                            let mut dfa = [0u32; 4];
                            for (k, &p) in o.patterns.iter().enumerate().take(4) {
                                dfa[k] = self.dfa_start(p);
                            }
                            stack.push(base);
                            stack.push(Frame::FreeKey {
                                obj: node,
                                trie: o.keys.child(0, b'"'),
                                chars: Chars::default(),
                                dfa,
                            });
                            out.push(stack);
                        }
                    }
                    _ => {}
                }
            }
            Frame::Key { obj, trie, lo, hi, seen } => {
                let Node::Object(o) = g.node(obj) else { return };
                let Some(t) = o.keys.child(trie, b) else { return };
                if !self.key_reachable(obj, t, lo, hi, seen) {
                    return;
                }
                match o.keys.terminal[t as usize] {
                    Some(i)
                        if (lo..=hi).contains(&i)
                            && b == b'"'
                            && o.keys.edges.is_leaf(t)
                            && self.dependencies_writable(o, i, seen)
                            && o.allows_with_forbidden(i, seen) =>
                    {
                        // The key is complete: record it in the object frame.
                        let Some(Frame::Obj { node, phase, next, seen, count, .. }) = stack.pop() else { return };
                        let bit = if i < 64 { 1u64 << i } else { 0 };
                        let (next, seen) = match g.order {
                            // Schema order tracks presence only where a dependency needs it.
                            PropertyOrder::Schema => (i + 1, seen | (bit & o.dep_mask)),
                            PropertyOrder::Any => (next, seen | bit),
                        };
                        stack.push(Frame::Obj { node, phase, next, seen, count, pending: o.props[i as usize].node });
                        out.push(stack);
                    }
                    _ => {
                        stack.push(Frame::Key { obj, trie: t, lo, hi, seen });
                        out.push(stack);
                    }
                }
            }
            Frame::FreeKey { obj, trie, chars, mut dfa } => {
                let Node::Object(o) = g.node(obj) else { return };
                if chars.esc == 0 && chars.utf8 == 0 && b == b'"' {
                    // A declared name is not an additional property.
                    if let Some(t) = trie
                        && o.keys.child(t, b'"').is_some_and(|e| o.keys.terminal[e as usize].is_some())
                    {
                        return;
                    }
                    let mut subset = 0usize;
                    for (k, &p) in o.patterns.iter().enumerate().take(4) {
                        let d = &g.dfas[p as usize];
                        let st = StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO);
                        if d.is_match_state(d.next_eoi_state(st)) {
                            subset |= 1 << k;
                        }
                    }
                    let value = o.pattern_nodes[subset];
                    if value == crate::graph::NEVER {
                        return;
                    }
                    let Some(Frame::Obj { node, phase, next, seen, count, .. }) = stack.pop() else { return };
                    stack.push(Frame::Obj { node, phase, next, seen, count, pending: value });
                    out.push(stack);
                    return;
                }
                if b == b'\\' && chars.esc == 0 && !o.patterns.is_empty() {
                    return; // keys matched against patterns are written without escapes
                }
                let Some(chars) = advance_chars(chars, b) else { return };
                let mut live = false;
                for (k, &p) in o.patterns.iter().enumerate().take(4) {
                    let d = &g.dfas[p as usize];
                    let st = d.next_state(StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO), b);
                    dfa[k] = st.as_u32();
                    live |= g.live(p, st.as_u32());
                }
                // With `additionalProperties: false` the key must still be able to match a pattern.
                if o.additional == crate::graph::NEVER && !live {
                    return;
                }
                let trie = trie.and_then(|t| o.keys.child(t, b));
                stack.push(Frame::FreeKey { obj, trie, chars, dfa });
                out.push(stack);
            }
            Frame::Arr { node, phase, count, used, texts, start } => {
                let Node::Array(a) = g.node(node) else { return };
                // Under an exact `uniqueItems`, another item needs an unwritten literal, or an
                // unwritten integer within the bounds (asked only at a `,`).
                let more = || {
                    a.unique.is_none_or(|set| g.literals[set as usize].below[0] & !used != 0)
                        && (!a.unique_ints || int_values_left(g, a.items, texts.as_ref().map_or(0, |t| t.len())))
                };
                let indent = layout.indent.is_some();
                match (phase, b) {
                    (ARR_OPEN, b']') if count >= a.min_items => out.push(stack),
                    (ARR_VALUE, b']') if !indent && count >= a.min_items => out.push(stack),
                    (ARR_CLOSE, b']') => out.push(stack),
                    (ARR_VALUE, b',') if more() && count < a.max_items && self.item_node(node, count).is_some() => {
                        let d = container_depth(&stack) + 1;
                        stack.push(Frame::Arr { node, phase: ARR_COMMA, count, used, texts, start });
                        match layout.after_comma(d) {
                            Some(pad) if !layout.pads[pad as usize].is_empty() => {
                                stack.push(Frame::Pad { text: pad, pos: 0 })
                            }
                            Some(_) => {}
                            None => return,
                        }
                        out.push(stack);
                    }
                    (ARR_OPEN, b'\n') if indent && count < a.max_items && self.item_node(node, count).is_some() => {
                        let d = container_depth(&stack) + 1;
                        let Some(pad) = layout.line(d) else { return };
                        stack.push(Frame::Arr { node, phase: ARR_COMMA, count, used, texts, start });
                        if layout.pads[pad as usize].len() > 1 {
                            stack.push(Frame::Pad { text: pad, pos: 1 });
                        }
                        out.push(stack);
                    }
                    (ARR_VALUE, b'\n') if indent && count >= a.min_items => {
                        let d = container_depth(&stack);
                        let Some(pad) = layout.line(d) else { return };
                        stack.push(Frame::Arr { node, phase: ARR_CLOSE, count, used, texts, start });
                        if layout.pads[pad as usize].len() > 1 {
                            stack.push(Frame::Pad { text: pad, pos: 1 });
                        }
                        out.push(stack);
                    }
                    (ARR_OPEN, _) if indent => {}
                    (ARR_OPEN | ARR_COMMA, _) if count < a.max_items => {
                        let Some(item) = self.item_node(node, count) else { return };
                        // An item compared whole: its bytes are captured from here (the
                        // capture of an enclosing item, if one is open, goes on).
                        let start = if a.unique_values {
                            let at = stack.capture_len().unwrap_or(0);
                            stack.begin_capture();
                            at
                        } else {
                            NO_ITEM
                        };
                        stack.push(Frame::Arr { node, phase: ARR_VALUE, count: count + 1, used, texts, start });
                        match a.unique {
                            Some(set) => {
                                stack.push(Frame::Lit { set, trie: 0, unique: Some(used) });
                                self.step(stack, b, out, depth + 1);
                            }
                            // A string whose text is tracked from its first byte, or a literal.
                            None if a.unique_text => self.start_tracked_item(stack, item, b, out, depth + 1),
                            None => self.start_value(stack, item, b, out, depth + 1),
                        }
                    }
                    _ => {}
                }
            }
            Frame::Str { node, len, chars, dfa, text } => {
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
                }
                let len = if s.min_len > 0 || s.max_len < u32::MAX { len } else { 0 };
                stack.push(Frame::Str { node, len, chars: next_chars, dfa, text });
                out.push(stack);
            }
            Frame::Num { node, phase, neg, value, frac, exp, exp_neg } => {
                let Node::Number(n) = g.node(node) else { return };
                // An item under an exact `uniqueItems` over integers: a zero cannot go on, so
                // a written one is refused at its digit; another repeat where it ends.
                let unique = n.keep_value && is_unique_int_item(g, &stack, node);
                match self.number_step(n, phase, neg, value, frac, exp, exp_neg, b) {
                    NumStep::Continue(NumFrame { phase, neg, value, frac, exp, exp_neg }) => {
                        if unique && !fresh_int_completion(n, phase, neg, f64::from_bits(value), written_items(&stack))
                        {
                            return;
                        }
                        stack.push(Frame::Num { node, phase, neg, value, frac, exp, exp_neg });
                        out.push(stack);
                    }
                    NumStep::End => {
                        if number_ok(n, phase, neg, value, frac, exp, exp_neg)
                            && (!unique || record_item(&mut stack, int_key(neg, value)))
                        {
                            self.step(stack, b, out, depth + 1);
                        }
                    }
                    NumStep::Reject => {}
                }
            }
            Frame::Lit { set, trie, unique } => {
                let lits = &g.literals[set as usize];
                // An item beside tracked strings (`ArrayNode::unique_text`): the literals
                // whose keys the array has written count as used.
                let tracked = unique.is_none() && is_tracked_item(g, &stack);
                let unique = if tracked { Some(written_literals(&stack, lits)) } else { unique };
                // Under an exact `uniqueItems`: only towards literals not written yet, and the
                // one completed is recorded in the array.
                let fresh = |node: u32| unique.is_none_or(|used| lits.below[node as usize] & !used != 0);
                let complete = |node: u32| {
                    lits.terminal[node as usize]
                        && unique.is_none_or(|used| used >> lits.value[node as usize].min(63) & 1 == 0)
                };
                let record = |stack: &mut Config, value: u32| {
                    if tracked {
                        record_item(stack, lits.keys[value as usize]);
                    } else {
                        mark_used(stack, unique, value);
                    }
                };
                if let Some(t) = lits.child(trie, b) {
                    if !fresh(t) {
                        return;
                    }
                    if lits.terminal[t as usize] && lits.edges.is_leaf(t) {
                        if complete(t) {
                            record(&mut stack, lits.value[t as usize]);
                            out.push(stack);
                        }
                    } else {
                        // A tracked item's literal frame reads the array's list afresh.
                        let unique = if tracked { None } else { unique };
                        stack.push(Frame::Lit { set, trie: t, unique });
                        out.push(stack);
                    }
                } else if complete(trie) {
                    record(&mut stack, lits.value[trie as usize]);
                    self.step(stack, b, out, depth + 1);
                }
            }
        }
    }

    /// Starts a value of `node` with byte `b` on top of `stack`.
    fn start_value(&self, mut stack: Config, node: NodeId, b: u8, out: &mut Vec<Config>, depth: u32) {
        if depth > 64 {
            return; // a cycle of references with no structure between them
        }
        let g = &self.graph;
        match g.node(node) {
            Node::Never | Node::Pending => {}
            Node::Union(alts) => {
                for &alt in alts {
                    self.start_value(stack.clone(), alt, b, out, depth + 1);
                }
            }
            Node::Object(o) => {
                if b == b'{' && !(o.props.iter().any(|p| p.required && p.node == crate::graph::NEVER)) {
                    stack.push(Frame::Obj { node, phase: OBJ_OPEN, next: 0, seen: 0, count: 0, pending: ANY });
                    out.push(stack);
                }
            }
            Node::Array(_) => {
                if b == b'[' {
                    stack.push(Frame::Arr { node, phase: ARR_OPEN, count: 0, used: 0, texts: None, start: NO_ITEM });
                    out.push(stack);
                }
            }
            Node::String(_) => {
                if b == b'"' {
                    stack.push(self.string_start(node, None));
                    out.push(stack);
                }
            }
            Node::Number(_) => {
                stack.push(Frame::Num {
                    node,
                    phase: NUM_START,
                    neg: false,
                    value: 0,
                    frac: 0,
                    exp: 0,
                    exp_neg: false,
                });
                self.step(stack, b, out, depth + 1);
            }
            Node::Literals(set) => {
                stack.push(Frame::Lit { set: *set, trie: 0, unique: None });
                self.step(stack, b, out, depth + 1);
            }
        }
    }

    /// Starts an item of an array under [`crate::graph::ArrayNode::unique_text`] with byte
    /// `b`: a string alternative tracks its text, a literal one checks the array's list.
    fn start_tracked_item(&self, mut stack: Config, node: NodeId, b: u8, out: &mut Vec<Config>, depth: u32) {
        if depth > 64 {
            return;
        }
        match self.graph.node(node) {
            Node::Union(alts) => {
                for &alt in alts {
                    self.start_tracked_item(stack.clone(), alt, b, out, depth + 1);
                }
            }
            Node::String(_) => {
                if b == b'"' {
                    stack.push(self.string_start(node, Some(TEXT_START)));
                    out.push(stack);
                }
            }
            _ => self.start_value(stack, node, b, out, depth + 1),
        }
    }

    /// At `last`, the byte that closes a value whose frame was just popped off `stack`: when
    /// that value is an item compared whole ([`crate::graph::ArrayNode::unique_values`]),
    /// records it in its array and closes its capture, or returns `None` when an earlier
    /// item of the array has the same value (a repeat: the byte is refused).
    fn end_captured_item(&self, mut stack: Config, last: u8) -> Option<Config> {
        let Some(&Frame::Arr { node, start, .. }) = stack.top() else { return Some(stack) };
        if start == NO_ITEM || !matches!(self.graph.node(node), Node::Array(a) if a.unique_values) {
            return Some(stack);
        }
        let key = captured_item_key(&stack, start, last);
        if !record_item(&mut stack, key) {
            return None;
        }
        if let Some(Frame::Arr { node, phase, count, used, texts, .. }) = stack.pop() {
            stack.push(Frame::Arr { node, phase, count, used, texts, start: NO_ITEM });
        }
        // The outermost captured item began the capture: nothing encloses it.
        if start == 0 {
            stack.end_capture();
        }
        Some(stack)
    }

    /// The frame of string `node` after its opening quote; `text`: the hash to track its text
    /// with, for an item under an exact `uniqueItems`.
    fn string_start(&self, node: NodeId, text: Option<NonZeroU64>) -> Frame {
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
    fn some_escape_survives(&self, patterns: &[u32], dfa: [u32; 2]) -> bool {
        [b'"', b'\\', 0x08, 0x0C, b'\n', b'\r', b'\t'].iter().any(|&byte| {
            patterns.iter().enumerate().take(2).all(|(k, &p)| {
                let d = &self.graph.dfas[p as usize];
                let st = d.next_state(StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO), byte);
                self.graph.live(p, st.as_u32())
            })
        })
    }

    /// The anchored start state of pattern automaton `p`.
    fn dfa_start(&self, p: u32) -> u32 {
        let d = &self.graph.dfas[p as usize];
        d.start_state(&regex_automata::util::start::Config::new().anchored(regex_automata::Anchored::Yes))
            .map(|s| s.as_u32())
            .unwrap_or(0)
    }

    /// The declared properties that may come next: `[lo, hi]` (empty when lo > hi).
    fn key_window(&self, node: NodeId, next: u16, seen: u64, count: u32) -> (u16, u16) {
        let Node::Object(o) = self.graph.node(node) else { return (1, 0) };
        let n = o.props.len() as u16;
        if n == 0 {
            return (1, 0);
        }
        match self.graph.order {
            PropertyOrder::Any => {
                let _ = seen;
                (0, n - 1)
            }
            PropertyOrder::Schema => {
                // Up to and including the first property that must still be written (required,
                // or required by a dependency of a written one).
                let needed = o.dep_needed(seen);
                let mut hi = (next..n)
                    .find(|&i| o.props[i as usize].required || (i < 64 && needed & (1 << i) != 0))
                    .unwrap_or(n.saturating_sub(1));
                // With no undeclared key to make up the number, property `i` leaves only the
                // ones after it: `count + 1 + (n - 1 - i)` must reach `minProperties`.
                if o.additional == crate::graph::NEVER && o.patterns.is_empty() {
                    let last = n as i64 + count as i64 - o.min_props as i64;
                    if last < next as i64 {
                        return (1, 0);
                    }
                    hi = hi.min(last.min(u16::MAX as i64) as u16);
                }
                (next, hi)
            }
        }
    }

    /// Whether the key trie node `t` leads to a property in `[lo, hi]` not yet seen.
    fn key_reachable(&self, node: NodeId, t: u32, lo: u16, hi: u16, seen: u64) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        o.keys.below[t as usize].iter().any(|&i| {
            i >= lo
                && i <= hi
                && (i >= 64 || seen & (1 << i) == 0)
                && o.props[i as usize].node != crate::graph::NEVER
                && self.dependencies_writable(o, i, seen)
                && o.allows_with_forbidden(i, seen)
        })
    }

    /// Whether writing property `i` now leaves every property it requires writable: already
    /// written, or (schema order) still ahead of it.
    fn dependencies_writable(&self, o: &crate::graph::ObjectNode, i: u16, seen: u64) -> bool {
        o.deps.iter().filter(|(t, _)| *t == i).all(|(_, m)| {
            let missing = m & !seen;
            match self.graph.order {
                PropertyOrder::Any => true,
                PropertyOrder::Schema => (0..=i.min(63)).all(|k| missing & (1 << k) == 0),
            }
        })
    }

    /// Whether any key may come now (so that a `,` is not a dead end).
    fn key_possible(&self, node: NodeId, next: u16, seen: u64, count: u32) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        let (lo, hi) = self.key_window(node, next, seen, count);
        let declared = lo <= hi && o.keys.child(0, b'"').is_some_and(|t| self.key_reachable(node, t, lo, hi, seen));
        declared
            || ((o.additional != crate::graph::NEVER || !o.patterns.is_empty())
                && self.additional_allowed(node, next, seen))
    }

    /// Whether an undeclared key may come now.
    fn additional_allowed(&self, node: NodeId, next: u16, seen: u64) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        match self.graph.order {
            PropertyOrder::Any => true,
            // Additional properties come after every required declared one.
            PropertyOrder::Schema => !o.props[next as usize..].iter().any(|p| p.required) && o.dep_needed(seen) == 0,
        }
    }

    /// Whether `}` may come now.
    fn object_closable(&self, node: NodeId, next: u16, seen: u64, count: u32) -> bool {
        let Node::Object(o) = self.graph.node(node) else { return false };
        if count < o.min_props {
            return false;
        }
        if o.dep_needed(seen) != 0 {
            return false;
        }
        match self.graph.order {
            PropertyOrder::Schema => !o.props[(next as usize).min(o.props.len())..].iter().any(|p| p.required),
            PropertyOrder::Any => {
                o.props.iter().enumerate().all(|(i, p)| !p.required || (i < 64 && seen & (1 << i) != 0))
            }
        }
    }

    /// The node of item `index` of an array, if one may come there.
    fn item_node(&self, node: NodeId, index: u32) -> Option<NodeId> {
        let Node::Array(a) = self.graph.node(node) else { return None };
        let n = a.prefix.get(index as usize).copied().unwrap_or(a.items);
        (n != crate::graph::NEVER).then_some(n)
    }

    fn patterns_accept(&self, node: NodeId, dfa: [u32; 2]) -> bool {
        let Node::String(s) = self.graph.node(node) else { return false };
        s.patterns.iter().enumerate().take(2).all(|(k, &p)| {
            let d = &self.graph.dfas[p as usize];
            let st = StateID::new(dfa[k] as usize).unwrap_or(StateID::ZERO);
            d.is_match_state(d.next_eoi_state(st))
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn number_step(
        &self,
        n: &crate::graph::NumberNode,
        phase: u8,
        neg: bool,
        value: u64,
        frac: u16,
        exp: u16,
        exp_neg: bool,
        b: u8,
    ) -> NumStep {
        if let Some((lo, hi)) = n.exact {
            return exact_integer_step(lo, hi, phase, neg, value, b);
        }
        let tracked = n.min.is_some() || n.max.is_some() || n.multiple_of.is_some();
        // Without bounds the value decides nothing and is kept at 0, so that states repeat;
        // but for an item under an exact `uniqueItems`.
        let keep = tracked || n.keep_value;
        let v = f64::from_bits(value);
        let frame = |phase, neg, v: f64, frac, exp, exp_neg| {
            NumStep::Continue(NumFrame { phase, neg, value: if keep { v.to_bits() } else { 0 }, frac, exp, exp_neg })
        };
        let digit = b.is_ascii_digit();
        let d = (b.wrapping_sub(b'0')) as f64;
        // Pruning: a positive number only grows with more integer digits, a negative one
        // only shrinks; once past a bound there is no way back.
        // Integers have no fraction or exponent to come back with: their bounds are exact
        // (as inclusive integer bounds), so a prefix is refused as soon as no integer fits.
        let (lo, hi) = if n.integer { integer_bounds(n) } else { (n.min.map(|(m, _)| m), n.max.map(|(m, _)| m)) };
        let over = |v: f64| if neg { lo.is_some_and(|m| -v < m) } else { hi.is_some_and(|m| v > m) };
        match (phase, b) {
            (NUM_START, b'-') => {
                // The negative number closest to zero: -1 for integers (`-0` is not written),
                // as close as wanted for others.
                let refused =
                    if n.integer { lo.is_some_and(|m| m > -1.0) } else { n.min.is_some_and(|(m, _)| m >= 0.0) };
                if refused {
                    return NumStep::Reject;
                }
                frame(NUM_MINUS, true, 0.0, 0, 0, false)
            }
            // `-0` is a float (-0.0) to most parsers: integers are written `0`.
            (NUM_MINUS, b'0') if n.integer => NumStep::Reject,
            (NUM_START | NUM_MINUS, b'0') => {
                // A leading zero is 0 (integer) or below 1 (number): reject it when the
                // minimum cannot be reached that way.
                let can_reach_min = if n.integer {
                    n.min.is_none_or(|(m, e)| m < 0.0 || (m == 0.0 && !e))
                } else {
                    n.min.is_none_or(|(m, _)| m < 1.0)
                };
                if !can_reach_min && !neg {
                    return NumStep::Reject;
                }
                if !neg && n.max.is_some_and(|(m, e)| m < 0.0 || (m == 0.0 && e)) {
                    return NumStep::Reject;
                }
                frame(NUM_ZERO, neg, 0.0, 0, 0, false)
            }
            (NUM_START | NUM_MINUS, b'1'..=b'9') => {
                if !neg && n.max.is_some_and(|(m, _)| m < 0.0) {
                    return NumStep::Reject;
                }
                if over(d) || (tracked && !int_prefix_feasible(n, neg, d)) {
                    return NumStep::Reject;
                }
                frame(NUM_INT, neg, d, 0, 0, false)
            }
            (NUM_INT, _) if digit => {
                let nv = v * 10.0 + d;
                if over(nv) || (tracked && !int_prefix_feasible(n, neg, nv)) {
                    return NumStep::Reject;
                }
                frame(NUM_INT, neg, nv, 0, 0, false)
            }
            (NUM_ZERO | NUM_INT, b'.') if !n.integer => {
                if !neg && n.min.is_some_and(|(m, _)| v + 1.0 <= m) {
                    return NumStep::Reject;
                }
                frame(NUM_DOT, neg, v, 0, 0, false)
            }
            // Integers are written without a fraction: `1.0` is an integer to JSON Schema, but
            // not to every consumer (nor to the `jsonschema` crate).
            // Under a whole `multipleOf` (`multipleOf: 1` on a number) only a zero fraction
            // stays a multiple whatever follows: a nonzero digit would need an exponent large
            // enough to shift it away, which the bounds usually forbid (a dead end).
            (NUM_DOT | NUM_FRAC, _) if digit && b != b'0' && whole_multiple(n) => NumStep::Reject,
            (NUM_DOT | NUM_FRAC, _) if digit => {
                let k = frac.saturating_add(1);
                let nv = v + d * 10f64.powi(-(k as i32));
                if over(nv) {
                    return NumStep::Reject;
                }
                frame(NUM_FRAC, neg, nv, if tracked { k } else { 0 }, 0, false)
            }
            // A zero mantissa stays zero whatever the exponent: refused where zero is.
            (NUM_ZERO | NUM_INT | NUM_FRAC, b'e' | b'E') if !n.integer => {
                if tracked && v == 0.0 && !admits_zero(n) {
                    return NumStep::Reject;
                }
                // Some exponent, either sign, must end inside (`9e` under `enum: [5, 10]`
                // has none, and wrote exponent digits forever).
                let signs = [false, !whole_multiple(n)];
                if tracked && !signs.iter().any(|&exp_neg| exponent_completes(n, neg, v, frac, 0, exp_neg)) {
                    return NumStep::Reject;
                }
                frame(NUM_E, neg, v, frac, 0, false)
            }
            // With bounds, an exponent sign or digit is refused once no completion can land
            // inside them: a non-negative exponent only grows the magnitude, a negative one
            // only shrinks it.
            (NUM_E, b'+') if !tracked || exponent_completes(n, neg, v, frac, 0, false) => {
                frame(NUM_ESIGN, neg, v, frac, 0, false)
            }
            (NUM_E, b'-') if !whole_multiple(n) && (!tracked || exponent_completes(n, neg, v, frac, 0, true)) => {
                frame(NUM_ESIGN, neg, v, frac, 0, true)
            }
            // At most two exponent digits (untracked) so that every number stays finite.
            (NUM_E | NUM_ESIGN | NUM_EXP, _) if digit && (tracked || phase != NUM_EXP || exp < 1) => {
                let e = if tracked {
                    exp.saturating_mul(10).saturating_add(d as u16).min(400)
                } else {
                    u16::from(phase == NUM_EXP)
                };
                if tracked && !exponent_completes(n, neg, v, frac, e, exp_neg) {
                    return NumStep::Reject;
                }
                frame(NUM_EXP, neg, v, frac, e, exp_neg)
            }
            (NUM_ZERO | NUM_INT | NUM_FRAC | NUM_EXP, _) => {
                let _ = exp;
                NumStep::End
            }
            _ => NumStep::Reject,
        }
    }
}

/// The fields of a number frame after one byte.
struct NumFrame {
    phase: u8,
    neg: bool,
    value: u64,
    frac: u16,
    exp: u16,
    exp_neg: bool,
}

enum NumStep {
    Continue(NumFrame),
    End,
    Reject,
}

/// Whether a number node's `multipleOf` is a whole number (its values are integers).
fn whole_multiple(n: &crate::graph::NumberNode) -> bool {
    n.multiple_of.is_some_and(|m| m >= 1.0 && m.fract() == 0.0)
}

/// Whether an integer part `v` (sign `neg`) can still be completed, by more digits (and, for
/// non-integers, a fraction), into a value within the bounds: the completions with `j` more
/// digits span `[v·10^j, (v+1)·10^j)`.
fn int_prefix_feasible(n: &crate::graph::NumberNode, neg: bool, v: f64) -> bool {
    // Integers: exact inclusive bounds. Others: exclusive ends ignored (a fraction or an
    // exponent can still land inside), a conservative "feasible" that keeps valid documents
    // reachable.
    let (min, max) = if n.integer { integer_bounds(n) } else { (n.min.map(|(m, _)| m), n.max.map(|(m, _)| m)) };
    // An integer node with a whole `multipleOf`: a range of completions must also hold a
    // multiple (below 2^53, where f64 holds integers exactly), or the writer would be stuck
    // after `3` under `minimum: 2, maximum: 3, multipleOf: 2`.
    let step = n.multiple_of.filter(|_| n.integer && whole_multiple(n));
    let inside = |lo: f64, hi: f64| {
        let (a, b) = if neg { (-hi, -lo) } else { (lo, hi) };
        // A non-integer's completions never reach `hi` (`9` and its fractions stay below 10):
        // that end is open, so `9` is refused under `enum: [10]` instead of left stuck.
        let open_end_misses = !n.integer && if neg { max.is_some_and(|m| a >= m) } else { min.is_some_and(|m| b <= m) };
        let (a, b) = (min.map_or(a, |m| a.max(m)), max.map_or(b, |m| b.min(m)));
        match step {
            _ if a > b || open_end_misses => false,
            Some(k) if a.abs() <= crate::compile::EXACT && b.abs() <= crate::compile::EXACT => (a / k).ceil() * k <= b,
            _ => true,
        }
    };
    let mut scale = 1.0f64;
    for _ in 0..20 {
        let lo = v * scale;
        let hi = if n.integer { lo + scale - 1.0 } else { lo + scale };
        if inside(lo, hi) {
            return true;
        }
        // Magnitudes only grow from here: stop once past the far bound.
        let far = if neg { min.map(|m| -m) } else { max };
        if far.is_some_and(|f| lo > f) {
            return false;
        }
        scale *= 10.0;
    }
    false
}

/// [`SchemaRecognizer::number_step`] for an integer node with exact bounds `lo..=hi` (see
/// [`crate::graph::NumberNode::exact`]): `magnitude` is the integer written so far, saturated
/// at `u64::MAX` only where the bound it grows towards is absent.
fn exact_integer_step(lo: i128, hi: i128, phase: u8, neg: bool, magnitude: u64, b: u8) -> NumStep {
    let next = |phase, neg, value| NumStep::Continue(NumFrame { phase, neg, value, frac: 0, exp: 0, exp_neg: false });
    match (phase, b) {
        // Some integer <= -1 must fit.
        (NUM_START, b'-') if lo <= hi.min(-1) => next(NUM_MINUS, true, 0),
        // `-0` is a float (-0.0) to most parsers: integers are written `0`.
        (NUM_START, b'0') if lo <= 0 && 0 <= hi => next(NUM_ZERO, false, 0),
        (NUM_START | NUM_MINUS, b'1'..=b'9') | (NUM_INT, b'0'..=b'9') => {
            let d = (b - b'0') as u64;
            let before = if phase == NUM_INT { magnitude } else { 0 };
            match before.checked_mul(10).and_then(|x| x.checked_add(d)) {
                Some(m) if exact_prefix_feasible(lo, hi, neg, m) => next(NUM_INT, neg, m),
                Some(_) => NumStep::Reject,
                // Past 64 bits: beyond any bound on that side, fine where there is none.
                None if (neg && lo == i128::MIN) || (!neg && hi == i128::MAX) => next(NUM_INT, neg, u64::MAX),
                None => NumStep::Reject,
            }
        }
        (NUM_ZERO | NUM_INT, _) => NumStep::End,
        _ => NumStep::Reject,
    }
}

/// Whether the integer magnitude `m` (sign `neg`) written so far can be completed, by more
/// digits, into an integer within `lo..=hi`: with `j` more digits the magnitudes span
/// `m·10^j ..= (m+1)·10^j - 1`.
fn exact_prefix_feasible(lo: i128, hi: i128, neg: bool, m: u64) -> bool {
    let (mut a, mut b) = (m as i128, m as i128);
    for _ in 0..40 {
        let (x, y) = if neg { (b.saturating_neg(), a.saturating_neg()) } else { (a, b) };
        if x <= hi && y >= lo {
            return true;
        }
        // Magnitudes only grow from here: stop once past the far bound.
        if (!neg && a > hi) || (neg && a.saturating_neg() < lo) {
            return false;
        }
        a = a.saturating_mul(10);
        b = b.saturating_mul(10).saturating_add(9);
    }
    false
}

/// Whether the exponent `e` written so far (sign `exp_neg`) can be completed, as it is or by
/// more digits, into a number within the node's bounds (mantissa `v`, sign `neg`): some
/// exponent among `e`, `10e..=10e+9`, `100e..=100e+99`, ... (up to the 400 the recogniser
/// caps it at) must end inside. Only the exponent's range is searched, each candidate with
/// the check the number's end applies, so `1e2` under `1000..=5000` is refused at the `2`
/// instead of left with no way to end.
fn exponent_completes(n: &crate::graph::NumberNode, neg: bool, v: f64, frac: u16, e: u16, exp_neg: bool) -> bool {
    const MAX_EXP: u32 = 400;
    // The exponents below `skip` leave the magnitude short of the bound it has to reach (by
    // at least a factor 10, so a rounding of `log10` does not matter): the search starts
    // there rather than at 0, and stays a few steps long (this runs per byte in a mask).
    let reach = match (exp_neg, neg) {
        (false, false) => n.min.map(|(m, _)| m).filter(|m| *m > 0.0),
        (false, true) => n.max.map(|(m, _)| -m).filter(|m| *m > 0.0),
        (true, false) => n.max.map(|(m, _)| m).filter(|m| *m > 0.0),
        (true, true) => n.min.map(|(m, _)| -m).filter(|m| *m > 0.0),
    };
    let skip = match reach {
        Some(t) if v > 0.0 => {
            let ratio = if exp_neg { v / t } else { t / v };
            (ratio.log10().floor() - 1.0).clamp(0.0, MAX_EXP as f64) as u32
        }
        _ => 0,
    };
    // Exponents in increasing order, until one ends inside, or the magnitude is past the
    // bound it moves towards (larger exponents only move it further).
    let search = |range: std::ops::Range<u32>| {
        for x in range.start.max(skip)..range.end {
            if number_ok(n, NUM_EXP, neg, v.to_bits(), frac, x as u16, exp_neg) {
                return Some(true);
            }
            let magnitude = scaled(v, x as u16, exp_neg);
            if if exp_neg { shrinks_past(n, neg, magnitude) } else { grows_past(n, neg, magnitude) } {
                return Some(false);
            }
        }
        None
    };
    if e == 0 {
        // Leading zeros: every exponent is still reachable.
        return search(0..MAX_EXP + 1).unwrap_or(false);
    }
    let (mut first, mut count) = (u32::from(e), 1u32);
    while first <= MAX_EXP {
        if let Some(found) = search(first..(first + count).min(MAX_EXP + 1)) {
            return found;
        }
        first *= 10;
        count *= 10;
    }
    false
}

/// `v * 10^(±e)` (zero for a zero `v`, where `10^e` may be infinite).
fn scaled(v: f64, e: u16, neg_exp: bool) -> f64 {
    if v == 0.0 {
        return 0.0;
    }
    if neg_exp { v / 10f64.powi(e as i32) } else { v * 10f64.powi(e as i32) }
}

/// Whether zero is within a number node's bounds.
fn admits_zero(n: &crate::graph::NumberNode) -> bool {
    n.min.is_none_or(|(m, excl)| m < 0.0 || (m == 0.0 && !excl))
        && n.max.is_none_or(|(m, excl)| m > 0.0 || (m == 0.0 && !excl))
}

/// Whether a magnitude of `v` (sign `neg`) is already past the bound it grows towards.
fn grows_past(n: &crate::graph::NumberNode, neg: bool, v: f64) -> bool {
    if neg { n.min.is_some_and(|(m, _)| -v < m) } else { n.max.is_some_and(|(m, _)| v > m) }
}

/// Whether a magnitude of `v` (sign `neg`) is already short of the bound it shrinks away from.
fn shrinks_past(n: &crate::graph::NumberNode, neg: bool, v: f64) -> bool {
    if neg { n.max.is_some_and(|(m, _)| m < 0.0 && -v > m) } else { n.min.is_some_and(|(m, _)| m > 0.0 && v < m) }
}

/// Whether a finished number satisfies its node.
fn number_ok(
    n: &crate::graph::NumberNode,
    phase: u8,
    neg: bool,
    value: u64,
    _frac: u16,
    exp: u16,
    exp_neg: bool,
) -> bool {
    if !matches!(phase, NUM_ZERO | NUM_INT | NUM_FRAC | NUM_EXP) {
        return false;
    }
    if n.min.is_none() && n.max.is_none() && n.multiple_of.is_none() {
        return true;
    }
    if let Some((lo, hi)) = n.exact {
        let v = if neg { -(value as i128) } else { value as i128 };
        return matches!(phase, NUM_ZERO | NUM_INT) && lo <= v && v <= hi;
    }
    let mag = if phase == NUM_EXP { scaled(f64::from_bits(value), exp, exp_neg) } else { f64::from_bits(value) };
    let v = if neg { -mag } else { mag };
    if let Some((m, excl)) = n.min
        && (v < m || (excl && v <= m))
    {
        return false;
    }
    if let Some((m, excl)) = n.max
        && (v > m || (excl && v >= m))
    {
        return false;
    }
    if let Some(k) = n.multiple_of {
        let q = v / k;
        if (q - q.round()).abs() > 1e-9 * q.abs().max(1.0) {
            return false;
        }
    }
    true
}

/// Advances the escape/UTF-8 tracker of a string by one raw byte.
pub(crate) fn advance_chars(c: Chars, b: u8) -> Option<Chars> {
    match c.esc {
        1 => match b {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(Chars::default()),
            b'u' => Some(Chars { esc: 5, hex: 0, ..Chars::default() }),
            _ => None,
        },
        6 => (b == b'\\').then_some(Chars { esc: 7, ..c }),
        7 => (b == b'u').then_some(Chars { esc: 5, hex: 0, low: true, high: c.hex, ..Chars::default() }),
        2..=5 => {
            let h = (b as char).to_digit(16)? as u16;
            let hex = c.hex << 4 | h;
            // Surrogates (D800..DFFF) only as a high-low pair, decided by the first two digits
            // so that no prefix is a dead end.
            match c.esc {
                5 if c.low && h != 0xD => return None,
                4 if c.low && !(0xC..=0xF).contains(&h) => return None,
                4 if !c.low && hex >> 4 == 0xD && h >= 0xC => return None,
                _ => {}
            }
            if c.esc > 2 {
                return Some(Chars { esc: c.esc - 1, hex, ..c });
            }
            if !c.low && (0xD800..=0xDBFF).contains(&hex) {
                return Some(Chars { esc: 6, hex, ..Chars::default() });
            }
            Some(Chars::default())
        }
        _ => {
            if c.utf8 > 0 {
                let ok = match c.first {
                    1 => (0xA0..=0xBF).contains(&b),
                    2 => (0x80..=0x9F).contains(&b),
                    3 => (0x90..=0xBF).contains(&b),
                    4 => (0x80..=0x8F).contains(&b),
                    _ => (0x80..=0xBF).contains(&b),
                };
                return ok.then_some(Chars { utf8: c.utf8 - 1, first: 0, ..c });
            }
            let lead = |n: u8, first: u8| Some(Chars { utf8: n, first, ..c });
            match b {
                b'\\' => Some(Chars { esc: 1, ..c }),
                b'"' => None,
                0x00..=0x1F => None,
                0x20..=0x7F => Some(c),
                0xC2..=0xDF => lead(1, 0),
                0xE0 => lead(2, 1),
                0xED => lead(2, 2),
                0xE1..=0xEF => lead(2, 0),
                0xF0 => lead(3, 3),
                0xF4 => lead(3, 4),
                0xF1..=0xF3 => lead(3, 0),
                _ => None,
            }
        }
    }
}

/// A few bytes, inline.
struct Decoded {
    buf: [u8; 4],
    len: usize,
}

impl Chars {
    /// Between characters: not inside an escape or a UTF-8 sequence.
    pub fn is_plain(&self) -> bool {
        self.esc == 0 && self.utf8 == 0
    }
}

impl Decoded {
    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// The bytes of the decoded string that raw byte `b` completes (none while an escape is
/// still being read).
fn decoded_bytes(before: Chars, after: Chars, b: u8) -> Decoded {
    let mut d = Decoded { buf: [0; 4], len: 0 };
    match before.esc {
        0 if b == b'\\' => {}
        0 => {
            d.buf[0] = b;
            d.len = 1;
        }
        1 if b == b'u' => {}
        1 => {
            d.buf[0] = match b {
                b'b' => 0x08,
                b'f' => 0x0C,
                b'n' => b'\n',
                b'r' => b'\r',
                b't' => b'\t',
                other => other,
            };
            d.len = 1;
        }
        2 => {
            // A high surrogate waits for its pair; the pair is given to patterns as U+FFFD.
            let unit = (before.hex << 4) | (b as char).to_digit(16).unwrap_or(0) as u16;
            if after.esc != 6 {
                let ch = char::from_u32(unit as u32).unwrap_or('\u{FFFD}');
                d.len = ch.encode_utf8(&mut d.buf).len();
            }
        }
        _ => {}
    }
    d
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

/// Records literal `value` as written in the array below the top of `stack`, for an item
/// under an exact `uniqueItems` (`unique` is `Some`); otherwise leaves the stack alone.
fn mark_used(stack: &mut Config, unique: Option<u64>, value: u32) {
    if unique.is_none() || value >= 64 {
        return;
    }
    if let Some(Frame::Arr { node, phase, count, used, texts, start }) = stack.pop() {
        stack.push(Frame::Arr { node, phase, count, used: used | 1 << value, texts, start });
    }
}

/// The bytes of the decoded string that raw byte `b` completes, as [`decoded_bytes`] but
/// with a surrogate pair decoded to its own character (patterns see U+FFFD there), so that
/// a character hashes the same escaped or not.
fn text_bytes(before: Chars, after: Chars, b: u8) -> Decoded {
    if before.esc == 2 && before.low {
        let low = (before.hex << 4) | (b as char).to_digit(16).unwrap_or(0) as u16;
        let code = 0x10000 + ((before.high as u32).wrapping_sub(0xD800) << 10) + (low as u32).wrapping_sub(0xDC00);
        let mut d = Decoded { buf: [0; 4], len: 0 };
        d.len = char::from_u32(code).unwrap_or('\u{FFFD}').encode_utf8(&mut d.buf).len();
        return d;
    }
    decoded_bytes(before, after, b)
}

/// The hash of an empty tracked string (FNV-1a's offset basis).
const TEXT_START: NonZeroU64 = NonZeroU64::new(0xcbf2_9ce4_8422_2325).unwrap();

/// Extends the hash of a tracked string's decoded text by `decoded` bytes: FNV-1a, kept off
/// zero. Items are compared by this 64-bit hash: two different texts that collide (about
/// 2^-64 per pair) would make the second unwritable, never a repeat writable.
fn hash_text(h: NonZeroU64, decoded: &[u8]) -> NonZeroU64 {
    let mut h = h.get();
    for &b in decoded {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    NonZeroU64::new(h).unwrap_or(NonZeroU64::MIN)
}

/// The hash of a tracked string whose text so far hashes to `h`, after the raw (JSON-escaped)
/// bytes `raw` written from between characters; `None` when `raw` is not string content.
pub(crate) fn extend_text(h: NonZeroU64, raw: &[u8]) -> Option<NonZeroU64> {
    let (mut c, mut h) = (Chars::default(), h);
    for &b in raw {
        let next = advance_chars(c, b)?;
        h = hash_text(h, text_bytes(c, next, b).as_slice());
        c = next;
    }
    Some(h)
}

/// At the closing quote of a string: records a tracked item's text in the array below the
/// top of `stack`; `false` when that array holds the same text already (a repeat).
fn record_text(stack: &mut Config, text: Option<NonZeroU64>) -> bool {
    let Some(h) = text else { return true };
    record_item(stack, h.get())
}

/// Whether the number of `node` on top of `stack` (popped) is an item of an array with an
/// exact `uniqueItems` over integers (the array's frame is the next one down).
fn is_unique_int_item(g: &Graph, stack: &Config, node: NodeId) -> bool {
    match stack.top() {
        Some(Frame::Arr { node: arr, .. }) => {
            matches!(g.node(*arr), Node::Array(a) if a.unique_ints && a.items == node)
        }
        _ => false,
    }
}

/// Whether the frame popped off `stack` is an item of an array under an exact `uniqueItems`
/// over strings and literals (the array's frame is the next one down).
fn is_tracked_item(g: &Graph, stack: &Config) -> bool {
    match stack.top() {
        Some(Frame::Arr { node, .. }) => matches!(g.node(*node), Node::Array(a) if a.unique_text),
        _ => false,
    }
}

/// The literals of `lits` (of the first 64) whose keys the array below the top of `stack`
/// has written, as bits.
fn written_literals(stack: &Config, lits: &crate::graph::LiteralTrie) -> u64 {
    let Some(Frame::Arr { texts: Some(items), .. }) = stack.top() else { return 0 };
    lits.keys
        .iter()
        .take(64)
        .enumerate()
        .filter(|(_, k)| items.binary_search(k).is_ok())
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// The key of an integer item in its array's list: the bits of its magnitude as `f64` (an
/// integer beyond 2^53 shares its key with its neighbours, which makes them unwritable
/// after it, never a repeat writable), the sign in the top bit.
fn int_key(neg: bool, value: u64) -> u64 {
    value | (neg as u64) << 63
}

/// Whether the array below the top of `stack` holds item `key` already.
fn item_written(stack: &Config, key: u64) -> bool {
    match stack.top() {
        Some(Frame::Arr { texts: Some(items), .. }) => items.binary_search(&key).is_ok(),
        _ => false,
    }
}

/// The item keys the array below the top of `stack` has recorded, sorted.
fn written_items(stack: &Config) -> &[u64] {
    match stack.top() {
        Some(Frame::Arr { texts: Some(items), .. }) => items,
        _ => &[],
    }
}

/// Under an exact `uniqueItems` over integers: whether the integer written so far (`phase`,
/// sign `neg`, magnitude `v`) can still be completed into a value within the bounds that is
/// not among `written` ([`int_key`]s). A nonzero prefix with `j` more digits spans the
/// magnitudes `[v·10^j, (v+1)·10^j)`, `0` is zero alone, `-` every negative integer; the
/// values of those within the bounds are counted and compared with the written ones among
/// them. Unbounded in the prefix's direction, there is always one more.
fn fresh_int_completion(n: &crate::graph::NumberNode, phase: u8, neg: bool, v: f64, written: &[u64]) -> bool {
    let (lo, hi) = integer_bounds(n);
    // Signed values within the bounds in the magnitudes [a, b].
    let count = |a: f64, b: f64| {
        let (x, y) = if neg { (-b, -a) } else { (a, b) };
        let (x, y) = (lo.map_or(x, |l| x.max(l)), hi.map_or(y, |h| y.min(h)));
        (y - x + 1.0).max(0.0)
    };
    let total = match phase {
        NUM_ZERO => count(0.0, 0.0),
        NUM_MINUS if lo.is_none() => return true,
        NUM_MINUS => count(1.0, f64::MAX),
        NUM_INT if (if neg { lo } else { hi }).is_none() => return true,
        NUM_INT => {
            let far = if neg { lo.map_or(0.0, |l| -l) } else { hi.unwrap_or(0.0) };
            let (mut total, mut scale) = (0.0, 1.0f64);
            while v * scale <= far && scale < 1e20 {
                total += count(v * scale, (v + 1.0) * scale - 1.0);
                scale *= 10.0;
            }
            total
        }
        _ => return true,
    };
    let prefix = v as u64;
    let in_prefix = |key: u64| {
        let (wneg, w) = (key >> 63 == 1, f64::from_bits(key & (u64::MAX >> 1)));
        match phase {
            NUM_ZERO => w == 0.0,
            NUM_MINUS => wneg && w >= 1.0,
            _ => {
                let mut x = w as u64;
                while x > prefix {
                    x /= 10;
                }
                wneg == neg && w >= 1.0 && x == prefix
            }
        }
    };
    total > written.iter().filter(|&&k| in_prefix(k)).count() as f64
}

/// Whether an array of integer items (`items`) under an exact `uniqueItems` has a value
/// within the bounds left once `written` are: what a `,` needs.
fn int_values_left(g: &Graph, items: NodeId, written: usize) -> bool {
    let Node::Number(n) = g.node(items) else { return true };
    match integer_bounds(n) {
        (Some(lo), Some(hi)) => hi - lo + 1.0 > written as f64,
        _ => true,
    }
}

/// Records item `key` (a tracked string's text hash, an integer's [`int_key`]) in the array
/// below the top of `stack`; `false` when it is there already (a repeat).
fn record_item(stack: &mut Config, key: u64) -> bool {
    if !matches!(stack.top(), Some(Frame::Arr { .. })) {
        return true;
    }
    let Some(Frame::Arr { node, phase, count, used, texts, start }) = stack.pop() else { return true };
    let mut items = texts.as_deref().cloned().unwrap_or_default();
    match items.binary_search(&key) {
        Ok(_) => false,
        Err(at) => {
            items.insert(at, key);
            stack.push(Frame::Arr { node, phase, count, used, texts: Some(Arc::new(items)), start });
            true
        }
    }
}
