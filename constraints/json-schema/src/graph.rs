//! The compiled form of a schema: a graph of value shapes ([`Node`]) that the recogniser walks.
//! Nodes refer to each other by index, so recursive schemas (`$ref` cycles) are plain cycles.

use regex_automata::dfa::dense;

/// Index of a node in [`Graph::nodes`].
pub type NodeId = u32;

/// Nodes every graph has, at fixed indices.
pub const NEVER: NodeId = 0;
/// Any JSON value.
pub const ANY: NodeId = 1;

/// A property of an object node.
#[derive(Debug, Clone)]
pub struct Prop {
    /// The key, JSON-encoded with its quotes (`"name"`): the bytes the output carries.
    pub key: Vec<u8>,
    /// The value's node.
    pub node: NodeId,
    /// Whether it must appear.
    pub required: bool,
}

/// The edges of a byte trie: per node, children sorted by byte. Node 0 is the root.
#[derive(Debug, Clone)]
pub struct Edges(Vec<Vec<(u8, u32)>>);

impl Default for Edges {
    fn default() -> Self {
        Edges(vec![Vec::new()])
    }
}

impl Edges {
    /// The child of `node` by `byte`.
    #[inline]
    pub fn child(&self, node: u32, byte: u8) -> Option<u32> {
        let c = &self.0[node as usize];
        c.binary_search_by_key(&byte, |&(b, _)| b).ok().map(|k| c[k].1)
    }

    /// Whether `node` has no children.
    #[inline]
    pub fn is_leaf(&self, node: u32) -> bool {
        self.0[node as usize].is_empty()
    }

    /// The child of `node` by `byte`, created if missing; `true` when it was created.
    fn child_or_insert(&mut self, node: usize, byte: u8) -> (usize, bool) {
        match self.0[node].binary_search_by_key(&byte, |&(b, _)| b) {
            Ok(k) => (self.0[node][k].1 as usize, false),
            Err(k) => {
                let id = self.0.len();
                self.0[node].insert(k, (byte, id as u32));
                self.0.push(Vec::new());
                (id, true)
            }
        }
    }
}

/// A byte trie over the encoded keys of an object (quotes included).
#[derive(Debug, Clone, Default)]
pub struct KeyTrie {
    /// The trie's edges.
    pub edges: Edges,
    /// Per node: the property whose key ends here.
    pub terminal: Vec<Option<u16>>,
    /// Per node: the sorted property indices whose keys pass through it.
    pub below: Vec<Vec<u16>>,
}

impl KeyTrie {
    /// The trie of `props`' keys.
    pub fn build(props: &[Prop]) -> Self {
        let mut t = KeyTrie { edges: Edges::default(), terminal: vec![None], below: vec![Vec::new()] };
        for (i, p) in props.iter().enumerate() {
            let mut n = 0usize;
            t.below[0].push(i as u16);
            for &b in &p.key {
                let (next, new) = t.edges.child_or_insert(n, b);
                if new {
                    t.terminal.push(None);
                    t.below.push(Vec::new());
                }
                n = next;
                t.below[n].push(i as u16);
            }
            t.terminal[n] = Some(i as u16);
        }
        t
    }

    /// The child of `node` by `byte`.
    #[inline]
    pub fn child(&self, node: u32, byte: u8) -> Option<u32> {
        self.edges.child(node, byte)
    }
}

/// An object shape.
#[derive(Debug, Clone)]
pub struct ObjectNode {
    /// Declared properties, in schema order.
    pub props: Vec<Prop>,
    /// The node of other properties ([`NEVER`] when closed).
    pub additional: NodeId,
    /// `patternProperties` patterns (DFA indices, search semantics), at most four.
    pub patterns: Vec<u32>,
    /// The value node of an undeclared key, by the set of patterns it matches (bit i =
    /// pattern i): entry 0 is `additional`, others the `allOf` of the matching schemas.
    pub pattern_nodes: Vec<NodeId>,
    /// Trie over the declared keys.
    pub keys: KeyTrie,
    /// `minProperties`.
    pub min_props: u32,
    /// `maxProperties`.
    pub max_props: u32,
    /// `dependentRequired` (and array-valued `dependencies`): when the property at the first
    /// index is written, the properties in the bitmask must be too (indices below 64).
    pub deps: Vec<(u16, u64)>,
    /// Sets of properties that must not all be present (`not: {required: [...]}`), as
    /// bitmasks (indices below 64).
    pub forbidden: Vec<u64>,
    /// Required properties (indices below 64), as a bitmask.
    pub required_mask: u64,
    /// The properties taking part in a dependency or a forbidden set, as a bitmask: their
    /// presence is tracked.
    pub dep_mask: u64,
}

impl ObjectNode {
    /// The properties that written triggers still require: not yet written.
    pub fn dep_needed(&self, seen: u64) -> u64 {
        self.deps.iter().filter(|(t, _)| *t < 64 && seen & (1 << t) != 0).fold(0, |acc, (_, m)| acc | m) & !seen
    }

    /// Whether writing property `i` (with `seen` written so far) keeps every forbidden set
    /// incomplete, counting what must still be written (required, and required by
    /// dependencies) as present.
    pub fn allows_with_forbidden(&self, i: u16, seen: u64) -> bool {
        if self.forbidden.is_empty() {
            return true;
        }
        let now = seen | if i < 64 { 1 << i } else { 0 };
        let future = now | (self.required_mask & !now) | self.dep_needed(now);
        self.forbidden.iter().all(|&set| set & !future != 0)
    }
}

/// An array shape.
#[derive(Debug, Clone)]
pub struct ArrayNode {
    /// Items by position (`prefixItems`, or draft-4..7 array-form `items`).
    pub prefix: Vec<NodeId>,
    /// Items after the prefix ([`NEVER`] when none are allowed).
    pub items: NodeId,
    /// `minItems`.
    pub min_items: u32,
    /// `maxItems`.
    pub max_items: u32,
    /// `uniqueItems` enforced exactly: the items are values of this literal set (an `enum` of
    /// at most 64 strings, booleans or null), each written at most once.
    pub unique: Option<u32>,
    /// `uniqueItems` enforced exactly over strings and literals: every item is a string that
    /// can always be written on (no pattern or one whose automaton never runs out of ways to
    /// go on; no `maxLength`, or none but `maxLength`) or one of a literal set of at most 64
    /// (`null`, booleans, an `enum`). The array's state remembers a hash of each item's
    /// decoded text (or the literal's key, [`LiteralTrie::keys`]); a string repeat is refused
    /// at its closing quote, or at the character that fills its `maxLength`; a literal at the
    /// first byte past which only written ones are left.
    pub unique_text: bool,
    /// `uniqueItems` enforced exactly over integers with no `multipleOf` (bounds within
    /// 2^53): the array's state remembers each item's value (in the same list as
    /// [`Self::unique_text`]'s hashes), a digit is refused past which every value within the
    /// bounds is written already (a zero, which cannot go on, once written), a repeat at the
    /// byte that ends it, and a `,` once the bounds hold no unwritten value.
    pub unique_ints: bool,
    /// `uniqueItems` enforced exactly over objects that can always take one more property
    /// (additional properties of any name, no `maxProperties`): each item's bytes are
    /// captured while it is written, and at the `}` that ends it the hash of its value
    /// ([`crate::values::canonical_hash`]: members in any order, numbers by value) is looked
    /// up among the earlier items' (the same list as [`Self::unique_text`]'s); a repeat is
    /// refused there, where a `,` and another property can always be written instead.
    pub unique_values: bool,
}

/// A string shape.
#[derive(Debug, Clone)]
pub struct StringNode {
    /// `minLength`, in characters.
    pub min_len: u32,
    /// `maxLength`, in characters.
    pub max_len: u32,
    /// Patterns the string must match (`pattern`, `format`), as indices into [`Graph::dfas`].
    pub patterns: Vec<u32>,
}

/// A number shape.
#[derive(Debug, Clone)]
pub struct NumberNode {
    /// Only integers (no fraction, no exponent).
    pub integer: bool,
    /// Lower bound and whether it is exclusive.
    pub min: Option<(f64, bool)>,
    /// Upper bound and whether it is exclusive.
    pub max: Option<(f64, bool)>,
    /// `multipleOf`, checked when the number ends.
    pub multiple_of: Option<f64>,
    /// For an integer node with a bound beyond 2^53 (where f64 cannot tell neighbouring
    /// integers apart) that the schema gives exactly, and no `multipleOf`: the inclusive
    /// integer bounds (`i128::MIN`/`MAX` where absent), compared exactly against the
    /// magnitude written so far, kept as an integer.
    pub exact: Option<(i128, i128)>,
    /// Keep the value written in the state even without bounds: an item under
    /// [`ArrayNode::unique_ints`].
    pub keep_value: bool,
}

/// A value shape.
#[derive(Debug, Clone)]
pub enum Node {
    /// Nothing is valid.
    Never,
    /// One of these nodes.
    Union(Vec<NodeId>),
    /// An object.
    Object(ObjectNode),
    /// An array.
    Array(ArrayNode),
    /// A string.
    String(StringNode),
    /// A number or integer.
    Number(NumberNode),
    /// Exactly one of these compact serialisations (enum, const, true/false/null), as an index
    /// into [`Graph::literals`].
    Literals(u32),
    /// Not built yet (a `$ref` target under construction).
    Pending,
}

/// A set of byte strings as a trie: node 0 is the root.
#[derive(Debug, Clone, Default)]
pub struct LiteralTrie {
    /// The trie's edges.
    pub edges: Edges,
    /// Per node: whether a literal ends here.
    pub terminal: Vec<bool>,
    /// Per node: the index of the literal that ends here (`u32::MAX` where none does).
    pub value: Vec<u32>,
    /// Per node: the literals (of the first 64) that end at or below it, as bits.
    pub below: Vec<u64>,
    /// By literal index: its key as an item under an exact `uniqueItems` over strings and
    /// literals ([`crate::values::literal_key`]).
    pub keys: Vec<u64>,
}

impl LiteralTrie {
    /// The trie of `values`; equal values share their index (the first one's).
    pub fn build<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut t = LiteralTrie {
            edges: Edges::default(),
            terminal: vec![false],
            value: vec![u32::MAX],
            below: vec![0],
            keys: Vec::new(),
        };
        let mut count = 0u32;
        for v in values {
            let mut path = vec![0usize];
            let mut n = 0usize;
            for &b in v {
                let (next, new) = t.edges.child_or_insert(n, b);
                if new {
                    t.terminal.push(false);
                    t.value.push(u32::MAX);
                    t.below.push(0);
                }
                n = next;
                path.push(n);
            }
            if !t.terminal[n] {
                t.terminal[n] = true;
                t.value[n] = count;
                t.keys.push(crate::values::literal_key(v));
                if count < 64 {
                    for &p in &path {
                        t.below[p] |= 1 << count;
                    }
                }
                count += 1;
            }
        }
        t
    }

    /// How many distinct literals the set holds.
    pub fn len(&self) -> usize {
        self.terminal.iter().filter(|&&t| t).count()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The child of `node` by `byte`.
    #[inline]
    pub fn child(&self, node: u32, byte: u8) -> Option<u32> {
        self.edges.child(node, byte)
    }
}

/// Distances to a match by automaton state index (`u32::MAX`: no match reachable).
#[derive(Debug, Clone)]
pub struct LiveTable {
    /// State ids are premultiplied by `1 << stride2`.
    pub stride2: usize,
    /// By state index.
    pub dist: Vec<u32>,
    /// By state index: the fewest characters from the state to a match (bytes that start a
    /// character count, UTF-8 continuation bytes do not), `u32::MAX` where none is reachable.
    /// `maxLength` counts characters, so the room left is compared with this, not `dist`.
    pub char_dist: Vec<u32>,
    /// By state index: no byte sequence leads from the state to one that cannot match (an
    /// unanchored pattern once matched, or with nothing to rule out).
    pub safe: Vec<bool>,
    /// Whether every live state reachable from the start has infinitely many completions
    /// over bytes a string can carry under a pattern (so a text can always be extended into
    /// one no earlier item has: what exact `uniqueItems` over strings needs).
    pub infinite: bool,
}

/// How properties may be ordered in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PropertyOrder {
    /// Declared properties in schema order, then additional ones (the default: it lets the
    /// plugin force key names).
    #[default]
    Schema,
    /// Any order.
    Any,
}

/// A compiled schema.
#[derive(Debug)]
pub struct Graph {
    /// All nodes; [`NEVER`] and [`ANY`] first.
    pub nodes: Vec<Node>,
    /// Literal sets.
    pub literals: Vec<LiteralTrie>,
    /// Pattern automata (unanchored search DFAs over the string's decoded bytes).
    pub dfas: Vec<std::sync::Arc<dense::DFA<Vec<u32>>>>,
    /// Per automaton, the states from which a match is still reachable, with the fewest
    /// bytes needed to get there. A DFA state that is not dead may still be hopeless (e.g.
    /// after `^` failed); only live states may be entered, and under `maxLength` only those
    /// close enough to a match, so that no prefix the mask allows is a dead end.
    pub live: Vec<std::sync::Arc<LiveTable>>,
    /// For strings under two automata (a `pattern` and a `format`), the pairs of states from
    /// which *both* can still reach a match together: each may be live alone while no text
    /// satisfies the two (`^[a-z]+$` with `date-time`), and entering such a pair is a dead end.
    pub pairs: std::collections::HashMap<(u32, u32), std::sync::Arc<PairLive>>,
    /// The root.
    pub root: NodeId,
    /// Property order.
    pub order: PropertyOrder,
}

/// The live state pairs of two automata run side by side (see [`Graph::pairs`]).
#[derive(Debug, Default)]
pub struct PairLive {
    /// Pairs of state ids from which some text leads both automata to a match.
    pub live: std::collections::HashSet<(u32, u32)>,
}

impl Graph {
    /// Whether states `st` of automata `p` can still reach a match together (true where the
    /// pair has no table: one automaton, or a product too large to tabulate).
    #[inline]
    pub fn pair_live(&self, p: [u32; 2], st: [u32; 2]) -> bool {
        self.pairs.get(&(p[0], p[1])).is_none_or(|t| t.live.contains(&(st[0], st[1])))
    }

    /// Whether state `st` of automaton `p` can still reach a match.
    #[inline]
    pub fn live(&self, p: u32, st: u32) -> bool {
        self.distance(p, st).is_some()
    }

    /// The largest [`Self::distance`] of any live state of automaton `p`.
    pub fn max_distance(&self, p: u32) -> u32 {
        self.live[p as usize].dist.iter().copied().filter(|&d| d != u32::MAX).max().unwrap_or(0)
    }

    /// The fewest bytes from state `st` of automaton `p` to a match, if one is reachable.
    #[inline]
    pub fn distance(&self, p: u32, st: u32) -> Option<u32> {
        let t = &self.live[p as usize];
        t.dist.get((st as usize) >> t.stride2).copied().filter(|&d| d != u32::MAX)
    }

    /// The fewest characters from state `st` of automaton `p` to a match, if one is
    /// reachable (the rest of a character begun counts nothing).
    #[inline]
    pub fn char_distance(&self, p: u32, st: u32) -> Option<u32> {
        let t = &self.live[p as usize];
        t.char_dist.get((st as usize) >> t.stride2).copied().filter(|&d| d != u32::MAX)
    }

    /// Whether every byte sequence from state `st` of automaton `p` keeps it able to match.
    #[inline]
    pub fn safe(&self, p: u32, st: u32) -> bool {
        let t = &self.live[p as usize];
        t.safe.get((st as usize) >> t.stride2).copied().unwrap_or(false)
    }

    /// The node `id`.
    #[inline]
    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }
}

/// The bounds of an integer node as inclusive integers (`exclusiveMinimum: -1` is `>= 0`).
pub fn integer_bounds(n: &NumberNode) -> (Option<f64>, Option<f64>) {
    let lo = n.min.map(|(m, excl)| if excl { m.floor() + 1.0 } else { m.ceil() });
    let hi = n.max.map(|(m, excl)| if excl { m.ceil() - 1.0 } else { m.floor() });
    (lo, hi)
}
