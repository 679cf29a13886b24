//! The grammar as a byte recogniser: a nondeterministic pushdown automaton whose
//! configurations are parse stacks.
//!
//! A configuration's top frame is where it is: inside an alternative at a symbol
//! ([`Frame::Sym`]), inside a terminal's DFA ([`Frame::Tok`]), inside the `%ignore` DFA, or at
//! the end. A byte expands nonterminals at the top until a terminal is reached (a prediction
//! per alternative) and steps its DFA. A call in tail position replaces its caller's frame, so
//! repetition (`S: e S | ε`) runs in constant stack depth; nesting depth is the output's own.
//!
//! Stacks are persistent linked lists with the hash of each tail stored in its link, so a
//! clone (one per token-trie node in a mask) copies one frame and one pointer, and equal
//! configurations are found by hash. The state is the deduplicated set of configurations,
//! ordered by hash; its key hashes exactly that, so two prefixes that leave the same parse
//! stacks share their masks.
//!
//! Lark terminals match greedily: a token ends only where the next byte cannot continue it
//! (a lexer's longest match, without its backtracking to an earlier, shorter match). GBNF text
//! is plain context-free: a terminal may end wherever its DFA accepts.

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use dspark_guest::key::KeyMap;
use dspark_guest::{
    ClassLoops, IdSteps, NON_ASCII_CLASSES, Recognizer, TokenSet, TokenTable, Transitions, UTF8_WHOLE, Utf8Step, key,
};
use regex_automata::dfa::Automaton;
use regex_automata::util::primitives::StateID;

use crate::compile::{Compiled, Sym};

/// The most configurations one state keeps; past this the grammar is too ambiguous to follow
/// and the extra parses are dropped (the output stays valid; some valid texts are refused).
pub const MAX_CONFIGS: usize = 256;
/// The most expansion steps one byte may take per configuration.
const STEP_BUDGET: u32 = 20_000;

/// Where a configuration is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Frame {
    /// In alternative `alt`, before symbol `pos` (for a caller: where it resumes).
    Sym {
        /// The alternative.
        alt: u32,
        /// The symbol index.
        pos: u32,
    },
    /// Inside terminal `t`, at DFA state `s`.
    Tok {
        /// The terminal.
        t: u32,
        /// The DFA state.
        s: u32,
    },
    /// Inside the `%ignore` terminal, at DFA state `s`; below is the frame it returns to.
    Ignore {
        /// The DFA state.
        s: u32,
    },
    /// Below everything: the output may end here.
    End,
}

/// A stack link: a frame, the rest below it, and the hash of both.
#[derive(Debug)]
struct Link {
    frame: Frame,
    below: Option<Arc<Link>>,
    hash: u64,
}

/// One parse stack.
#[derive(Clone, Debug)]
pub struct Config {
    top: Frame,
    below: Option<Arc<Link>>,
}

fn frame_hash(f: &Frame) -> u64 {
    key::of(f)
}

fn links_equal(a: &Option<Arc<Link>>, b: &Option<Arc<Link>>) -> bool {
    let (mut a, mut b) = (a, b);
    loop {
        match (a, b) {
            (None, None) => return true,
            (Some(x), Some(y)) => {
                if Arc::ptr_eq(x, y) {
                    return true;
                }
                if x.hash != y.hash || x.frame != y.frame {
                    return false;
                }
                a = &x.below;
                b = &y.below;
            }
            _ => return false,
        }
    }
}

impl Config {
    fn hash64(&self) -> u64 {
        key::mix(frame_hash(&self.top), self.below.as_ref().map_or(0, |l| l.hash))
    }

    fn with_top(&self, top: Frame) -> Config {
        Config { top, below: self.below.clone() }
    }

    fn push(&self, top: Frame) -> Config {
        let below_hash = self.below.as_ref().map_or(0, |l| l.hash);
        let link =
            Link { frame: self.top, below: self.below.clone(), hash: key::mix(frame_hash(&self.top), below_hash) };
        Config { top, below: Some(Arc::new(link)) }
    }

    fn pop(&self) -> Option<Config> {
        self.below.as_ref().map(|l| Config { top: l.frame, below: l.below.clone() })
    }
}

impl PartialEq for Config {
    fn eq(&self, other: &Self) -> bool {
        self.top == other.top && links_equal(&self.below, &other.below)
    }
}

impl Eq for Config {}

/// The recogniser state: its live configurations, deduplicated, ordered by hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct State {
    configs: Vec<(u64, Config)>,
}

impl State {
    /// A key for maps inside one mask computation: the configurations' hashes mixed.
    fn fast_key(&self) -> u64 {
        self.configs.iter().fold(0x5eed, |h, (k, _)| key::mix(h, *k))
    }
}

impl Hash for State {
    fn hash<H: Hasher>(&self, h: &mut H) {
        for (k, _) in &self.configs {
            k.hash(h);
        }
    }
}

/// Configurations that are all inside the same token at the same DFA state when a mask's
/// trie walk meets them: the walk steps the DFA alone and leaves their stacks untouched until
/// the token ends.
#[derive(Debug)]
struct Group {
    /// The terminal (the `%ignore` one when `ignore`).
    t: u32,
    ignore: bool,
    configs: Vec<Config>,
    /// What a byte that ends the token leads to, by byte class: a greedy token that ends hands the
    /// byte to its configurations' callers, whatever DFA state it ended in, so the answer is
    /// the same at every trie node where this group's token ends with that byte.
    after: Mutex<After>,
    /// What follows the token once it ends, expanded down to the next terminals: the
    /// byte-independent half of every `after` entry, computed once.
    frontier: OnceLock<Frontier>,
}

/// What follows a group's token once it ends, expanded down to the next terminals, with the
/// bytes each configuration can take first: a byte none of them takes is refused without
/// scanning, and a byte is scanned only against the configurations that take it.
#[derive(Debug)]
struct Frontier {
    configs: Vec<Config>,
    first: Vec<ByteSet>,
    any: ByteSet,
}

/// A set of bytes.
type ByteSet = [u64; 4];

fn has_byte(set: &ByteSet, b: u8) -> bool {
    set[(b >> 6) as usize] >> (b & 63) & 1 == 1
}

/// What a byte that ends a group's token leads to, by byte class. Empty (no allocation)
/// until the first entry: most groups of a walk never end inside a token.
#[derive(Default)]
struct After {
    /// Per byte class: 0, or one more than the entry's index in `walks`.
    slot: Vec<u16>,
    walks: Vec<Option<Walk>>,
}

impl After {
    fn get(&self, class: u8) -> Option<&Option<Walk>> {
        match self.slot.get(class as usize) {
            Some(&i) if i > 0 => Some(&self.walks[i as usize - 1]),
            _ => None,
        }
    }

    fn insert(&mut self, class: u8, classes: usize, walk: Option<Walk>) {
        if self.slot.is_empty() {
            self.slot = vec![0; classes];
        }
        self.walks.push(walk);
        self.slot[class as usize] = self.walks.len() as u16;
    }
}

impl std::fmt::Debug for After {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "After({} byte classes)", self.walks.len())
    }
}

/// The entries of a hash map under one 64-bit hash: almost always one, kept inline so that
/// a new hash costs no allocation.
struct Bucket<T> {
    first: T,
    rest: Vec<T>,
}

impl<T> Bucket<T> {
    fn iter(&self) -> impl Iterator<Item = &T> {
        std::iter::once(&self.first).chain(&self.rest)
    }
}

/// Adds `value` under `hash`.
fn add_to<T>(map: &mut KeyMap<Bucket<T>>, hash: u64, value: T) {
    match map.entry(hash) {
        std::collections::hash_map::Entry::Occupied(mut o) => o.get_mut().rest.push(value),
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(Bucket { first: value, rest: Vec::new() });
        }
    }
}

/// Groups and group lists already built, so that equal ones are one object and share their
/// `after` caches and walk-state ids.
#[derive(Default)]
struct SharedGroups {
    /// Group lists by the hash of the state they came from.
    lists: KeyMap<Bucket<(State, GroupList, [u32; MAX_GROUPS])>>,
    /// Groups by the hash of their terminal and configurations.
    groups: KeyMap<Bucket<Arc<Group>>>,
}

/// The token groups of a walk state.
type GroupList = Arc<Vec<Arc<Group>>>;

impl SharedGroups {
    /// The group of `configs` inside terminal `t`, shared with every list that has it.
    fn group(&mut self, t: u32, ignore: bool, configs: Vec<Config>) -> Arc<Group> {
        let hash = configs.iter().fold(key::of(&(t, ignore)), |h, c| key::mix(h, c.hash64()));
        if let Some(same) = self.groups.get(&hash)
            && let Some(g) = same.iter().find(|g| g.t == t && g.ignore == ignore && g.configs == configs)
        {
            return g.clone();
        }
        let g = Arc::new(Group { t, ignore, configs, after: Mutex::default(), frontier: OnceLock::new() });
        add_to(&mut self.groups, hash, g.clone());
        g
    }
}

/// The most token groups a walk state steps without materialising its configurations.
const MAX_GROUPS: usize = 24;
/// A group whose token ended or died.
const GONE: u32 = u32::MAX;

/// The state of a mask's trie walk. `Tokens` is the common case and allocation-free to clone
/// and step: every configuration is inside a token, and only the DFA states change until a
/// token ends; `Full` is any other state.
#[derive(Clone, Debug)]
enum Walk {
    Tokens { groups: GroupList, states: [u32; MAX_GROUPS] },
    Full(Arc<FullWalk>),
}

/// A walk state that is not all inside tokens (a grammar's start, before anything is
/// predicted), with its configurations expanded once for every byte that steps it: the
/// first mask of a grammar takes all 256 bytes from it.
#[derive(Debug)]
struct FullWalk {
    state: State,
    frontier: OnceLock<Frontier>,
}

impl Walk {
    fn full(state: State) -> Walk {
        Walk::Full(Arc::new(FullWalk { state, frontier: OnceLock::new() }))
    }
}

/// A compiled grammar as a [`Recognizer`].
pub struct GrammarRecognizer {
    g: Compiled,
    /// The walk states met by earlier masks and their transitions, kept so that a mask whose
    /// states were seen before walks the trie by table lookups alone.
    walk_table: Mutex<WalkTable>,
    /// [`Self::first_bytes`] by terminal and DFA state.
    first_bytes: Mutex<KeyMap<ByteSet>>,
    /// The bytes every terminal treats alike.
    classes: ByteClasses,
}

/// The bytes that every terminal's DFA treats alike, numbered: every step of the recogniser
/// is a DFA step, so a walk state's transition on a byte depends only on the byte's class,
/// and the walk table keeps one entry per class (about 40 for a grammar of keywords,
/// names and punctuation, instead of 256), which makes its rows quicker to fill and more of
/// them fit in cache.
#[derive(Clone, Debug)]
pub struct ByteClasses {
    /// The class of each byte.
    of: [u8; 256],
    /// How many classes there are.
    count: usize,
}

impl ByteClasses {
    /// The joint classes of `g`'s terminals: two bytes share a class where every DFA puts
    /// them in one class.
    fn of_grammar(g: &Compiled) -> Self {
        let mut of = [0u8; 256];
        let mut count = 1;
        for terminal in &g.dfas {
            let theirs = terminal.dfa.byte_classes();
            // Split each class by the DFA's classes: a new number per (class, their class)
            // pair met, in a table of all pairs (small: classes times their classes).
            let width = theirs.alphabet_len();
            let mut renumber = vec![u16::MAX; count * width];
            let mut next = 0u16;
            for b in 0..=255u8 {
                let pair = of[b as usize] as usize * width + theirs.get(b) as usize;
                if renumber[pair] == u16::MAX {
                    renumber[pair] = next;
                    next += 1;
                }
                // At most 256 pairs are met (one per byte), so the numbers fit a byte.
                of[b as usize] = renumber[pair] as u8;
            }
            count = next as usize;
        }
        Self { of, count }
    }

    /// How many classes there are.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The class of byte `b`.
    pub fn class_of(&self, b: u8) -> u8 {
        self.of[b as usize]
    }
}

/// A map key for DFA state `s` of terminal `t`: one-to-one (the pair packed into 64 bits,
/// then [`key::mix`], a bijection, spreads the bits the hash map indexes by), and quicker than
/// hashing the pair with SipHash on every frontier computed.
fn dfa_state_key(t: u32, s: u32) -> u64 {
    key::mix(((t as u64) << 32) | s as u64, 0)
}

/// Locks `m`; a poisoned lock (a panic in an earlier call, which traps the whole instance in
/// the plugin) still holds consistent caches: every entry is written complete or not at all.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GrammarRecognizer {
    /// Wraps a compiled grammar.
    pub fn new(g: Compiled) -> Self {
        let classes = ByteClasses::of_grammar(&g);
        Self { walk_table: Mutex::new(WalkTable::new(&classes)), first_bytes: Mutex::default(), classes, g }
    }

    /// The bytes the grammar's terminals treat alike.
    pub fn byte_classes(&self) -> &ByteClasses {
        &self.classes
    }

    /// Whether the whole of `text` is in the language (for tests).
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

    fn dfa_step(&self, t: u32, s: u32, b: u8) -> Option<u32> {
        let terminal = &self.g.dfas[t as usize];
        let next = terminal.dfa.next_state(StateID::new_unchecked(s as usize), b);
        // Any state from which the terminal can no longer match is a dead end, not only
        // regex-automata's dead state.
        terminal.live.is_live(next).then(|| next.as_u32())
    }

    fn dfa_accepts(&self, t: u32, s: u32) -> bool {
        let dfa = &self.g.dfas[t as usize].dfa;
        dfa.is_match_state(dfa.next_eoi_state(StateID::new_unchecked(s as usize)))
    }

    /// Feeds `b` to configuration `c`, pushing the results into `out`: its expansions
    /// ([`Self::expand`]), each scanned with the byte.
    fn step(&self, c: Config, b: u8, out: &mut Vec<(u64, Config)>, budget: &mut u32) {
        let mut expanded = Vec::new();
        self.expand(c, &mut expanded, budget);
        for (_, e) in &expanded {
            self.scan(e, b, out, budget);
        }
    }

    /// The configurations `configs` lead to before their next byte: every nonterminal at the
    /// top expanded (one configuration per alternative) until a terminal or `%ignore` frame
    /// is at the top. [`Self::scan`] over the result is [`Self::step`] over `configs`, with
    /// the expansion done once for every byte.
    fn predict(&self, configs: impl Iterator<Item = Config>) -> Vec<Config> {
        let mut out = Vec::new();
        for c in configs {
            let mut budget = STEP_BUDGET;
            self.expand(c, &mut out, &mut budget);
        }
        out.sort_by_key(|(h, _)| *h);
        out.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// [`Self::step`] without the byte: pushes `c`'s expansions into `out`.
    fn expand(&self, c: Config, out: &mut Vec<(u64, Config)>, budget: &mut u32) {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        match c.top {
            Frame::Tok { .. } | Frame::Ignore { .. } => out.push((c.hash64(), c)),
            Frame::Sym { alt, pos } => {
                let syms = &self.g.alts[alt as usize];
                let pos = pos as usize;
                if pos == syms.len() {
                    if let Some(p) = c.pop() {
                        self.expand(p, out, budget);
                    }
                    return;
                }
                let rest = if pos + 1 == syms.len() {
                    c.pop()
                } else {
                    Some(c.with_top(Frame::Sym { alt, pos: pos as u32 + 1 }))
                };
                let Some(rest) = rest else { return };
                match syms[pos] {
                    Sym::N(n) => {
                        for &a in &self.g.nonterms[n as usize].alts {
                            self.expand(rest.push(Frame::Sym { alt: a, pos: 0 }), out, budget);
                        }
                    }
                    Sym::T(t) => {
                        let start = self.g.dfas[t as usize].start;
                        self.expand(rest.push(Frame::Tok { t, s: start }), out, budget);
                        if let Some(i) = self.g.ignore {
                            let start = self.g.dfas[i as usize].start;
                            self.expand(c.push(Frame::Ignore { s: start }), out, budget);
                        }
                    }
                }
            }
            Frame::End => {
                if let Some(i) = self.g.ignore {
                    let start = self.g.dfas[i as usize].start;
                    self.expand(c.push(Frame::Ignore { s: start }), out, budget);
                }
            }
        }
    }

    /// Feeds `b` to an expanded configuration (one [`Self::predict`] returned).
    fn scan(&self, c: &Config, b: u8, out: &mut Vec<(u64, Config)>, budget: &mut u32) {
        match c.top {
            Frame::Tok { t, s } => self.step_token(c, t, s, false, b, out, budget),
            Frame::Ignore { s } => {
                if let Some(i) = self.g.ignore {
                    self.step_token(c, i, s, true, b, out, budget);
                }
            }
            // `expand` leaves only terminal tops; anything else has nothing to scan.
            Frame::Sym { .. } | Frame::End => {}
        }
    }

    /// Whether terminal `t`'s DFA, from state `s` at a character boundary, comes back to `s`
    /// after every multi-byte UTF-8 character and stays alive inside each (for plain-text
    /// grammars, where a token may end wherever it accepts, also without accepting there).
    /// A search over (DFA state, UTF-8 decoder state) pairs, memoised in `memo`.
    fn dfa_loops_over_utf8(&self, t: u32, s: u32, memo: &mut KeyMap<bool>) -> bool {
        if let Some(&known) = memo.get(&dfa_state_key(t, s)) {
            return known;
        }
        let may_end = |q: u32| !self.g.greedy && self.dfa_accepts(t, q);
        let mut loops = !may_end(s);
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![(s, Utf8Step::BOUNDARY)];
        'search: while let Some((q, u)) = todo.pop() {
            let bytes = if u == Utf8Step::BOUNDARY { 0xc2..=0xf4 } else { u.lo..=u.hi };
            for b in bytes {
                let Some(next_u) = u.next(b) else { continue };
                let Some(next_q) = self.dfa_step(t, q, b) else {
                    loops = false;
                    break 'search;
                };
                if next_u == Utf8Step::BOUNDARY {
                    if next_q != s {
                        loops = false;
                        break 'search;
                    }
                } else if may_end(next_q) {
                    loops = false;
                    break 'search;
                } else if seen.insert((next_q, next_u)) {
                    todo.push((next_q, next_u));
                }
            }
        }
        memo.insert(dfa_state_key(t, s), loops);
        loops
    }

    /// Feeds `b` to a configuration inside terminal `t` (the `%ignore` one when `ignore`):
    /// the token goes on if the byte continues it, and ends here, handing the byte to what
    /// follows, if it can end and (for greedy tokens) the byte does not continue it.
    #[allow(clippy::too_many_arguments)]
    fn step_token(
        &self,
        c: &Config,
        t: u32,
        s: u32,
        ignore: bool,
        b: u8,
        out: &mut Vec<(u64, Config)>,
        budget: &mut u32,
    ) {
        let next = self.dfa_step(t, s, b);
        if let Some(n) = next {
            let nc = c.with_top(if ignore { Frame::Ignore { s: n } } else { Frame::Tok { t, s: n } });
            out.push((nc.hash64(), nc));
        }
        if (next.is_none() || !self.g.greedy)
            && self.dfa_accepts(t, s)
            && let Some(p) = c.pop()
        {
            self.step(p, b, out, budget);
        }
    }

    /// A state as a walk state: token groups when every configuration is inside a token
    /// (at most [`MAX_GROUPS`] distinct token frames), else the state itself. Equal states get
    /// the same group list from `shared`, so their walk states are equal too and they share
    /// the groups' caches.
    fn to_walk(&self, state: State, shared: &mut SharedGroups) -> Walk {
        let hash = state.fast_key();
        if let Some(found) = shared.lists.get(&hash).and_then(|v| v.iter().find(|(s, _, _)| *s == state)) {
            return Walk::Tokens { groups: found.1.clone(), states: found.2 };
        }
        let mut groups: Vec<(u32, bool, Vec<Config>)> = Vec::new();
        let mut states = [GONE; MAX_GROUPS];
        for (_, c) in &state.configs {
            let (t, ignore, s) = match c.top {
                Frame::Tok { t, s } => (t, false, s),
                Frame::Ignore { s } => match self.g.ignore {
                    Some(i) => (i, true, s),
                    None => return Walk::full(state),
                },
                _ => return Walk::full(state),
            };
            match groups.iter().enumerate().position(|(i, g)| g.0 == t && g.1 == ignore && states[i] == s) {
                Some(i) => groups[i].2.push(c.clone()),
                None if groups.len() == MAX_GROUPS => return Walk::full(state),
                None => {
                    states[groups.len()] = s;
                    groups.push((t, ignore, vec![c.clone()]));
                }
            }
        }
        let groups: GroupList =
            Arc::new(groups.into_iter().map(|(t, ignore, configs)| shared.group(t, ignore, configs)).collect());
        add_to(&mut shared.lists, hash, (state, groups.clone(), states));
        Walk::Tokens { groups, states }
    }

    /// [`Recognizer::advance`] for walk states: while the byte only continues the tokens,
    /// one DFA step per group; where a token may end, its configurations go through the
    /// recogniser.
    fn walk_advance(&self, w: &Walk, b: u8, shared: &mut SharedGroups) -> Option<Walk> {
        let (groups, states) = match w {
            Walk::Full(full) => {
                let frontier =
                    full.frontier.get_or_init(|| self.frontier_of(full.state.configs.iter().map(|(_, c)| c.clone())));
                let mut out = Vec::new();
                self.scan_frontier(frontier, b, &mut out);
                return self.finish(out).map(|n| self.to_walk(n, shared));
            }
            Walk::Tokens { groups, states } => (groups, states),
        };
        let mut next = [GONE; MAX_GROUPS];
        let mut ending = None;
        let mut endings = 0;
        let mut alive = false;
        for (i, g) in groups.iter().enumerate() {
            let s = states[i];
            if s == GONE {
                continue;
            }
            let stepped = self.dfa_step(g.t, s, b);
            // Whether the token may end before `b` matters only when `b` does not continue
            // it, or (plain text) always; most nodes of a walk skip the check.
            match stepped {
                Some(n) if self.g.greedy || !self.dfa_accepts(g.t, s) => {
                    next[i] = n;
                    alive = true;
                }
                Some(_) => endings += 2,
                None if !self.dfa_accepts(g.t, s) => {}
                None => {
                    endings += 1;
                    ending = Some(i);
                }
            }
        }
        if endings == 0 {
            return alive.then(|| Walk::Tokens { groups: groups.clone(), states: next });
        }
        // The common boundary: one token ends (the byte does not continue it) and every other
        // group died: the result depends on the group and the byte alone.
        if let (1, false, Some(i)) = (endings, alive, ending) {
            let g = &groups[i];
            let class = self.classes.of[b as usize];
            if let Some(known) = lock(&g.after).get(class) {
                return known.clone();
            }
            let mut out = Vec::new();
            self.scan_frontier(self.frontier(g), b, &mut out);
            let w = self.finish(out).map(|n| self.to_walk(n, shared));
            lock(&g.after).insert(class, self.classes.count, w.clone());
            return w;
        }
        // Tokens end here while others go on: each group either continues with the byte or
        // (greedy: only where the byte cannot continue it) ends and hands the byte to what
        // follows it, its frontier.
        let mut out: Vec<(u64, Config)> = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            let s = states[i];
            if s == GONE {
                continue;
            }
            let stepped = self.dfa_step(g.t, s, b);
            if let Some(n) = stepped {
                let top = if g.ignore { Frame::Ignore { s: n } } else { Frame::Tok { t: g.t, s: n } };
                out.extend(g.configs.iter().map(|c| {
                    let c = c.with_top(top);
                    (c.hash64(), c)
                }));
            }
            if (stepped.is_none() || !self.g.greedy) && self.dfa_accepts(g.t, s) {
                self.scan_frontier(self.frontier(g), b, &mut out);
            }
        }
        self.finish(out).map(|n| self.to_walk(n, shared))
    }

    /// What follows group `g`'s token once it ends, expanded down to the next terminals.
    fn frontier<'g>(&self, g: &'g Group) -> &'g Frontier {
        g.frontier.get_or_init(|| self.frontier_of(g.configs.iter().filter_map(Config::pop)))
    }

    /// `configs` expanded down to their next terminals, with the bytes each can take first.
    fn frontier_of(&self, configs: impl Iterator<Item = Config>) -> Frontier {
        let configs = self.predict(configs);
        let first: Vec<ByteSet> = configs.iter().map(|c| self.first_bytes(c)).collect();
        let any = first.iter().fold([0u64; 4], |a, f| std::array::from_fn(|i| a[i] | f[i]));
        Frontier { configs, first, any }
    }

    /// [`Self::scan`] of byte `b` over a frontier, skipping the configurations that cannot
    /// take it.
    fn scan_frontier(&self, f: &Frontier, b: u8, out: &mut Vec<(u64, Config)>) {
        if !has_byte(&f.any, b) {
            return;
        }
        let mut budget = STEP_BUDGET;
        for (c, first) in f.configs.iter().zip(&f.first) {
            if has_byte(first, b) {
                self.scan(c, b, out, &mut budget);
            }
        }
    }

    /// The bytes an expanded configuration can take next: those its terminal's DFA steps on
    /// from its state, or every byte where the terminal may also end at once (the byte then
    /// goes to what follows) or the top is not a terminal.
    fn first_bytes(&self, c: &Config) -> ByteSet {
        let (t, s) = match c.top {
            Frame::Tok { t, s } => (t, s),
            Frame::Ignore { s } => match self.g.ignore {
                Some(i) => (i, s),
                None => return [0; 4],
            },
            _ => return [u64::MAX; 4],
        };
        let mut cache = lock(&self.first_bytes);
        *cache.entry(dfa_state_key(t, s)).or_insert_with(|| {
            if self.dfa_accepts(t, s) {
                return [u64::MAX; 4];
            }
            let mut set = [0u64; 4];
            for b in 0..=255u8 {
                if self.dfa_step(t, s, b).is_some() {
                    set[(b >> 6) as usize] |= 1 << (b & 63);
                }
            }
            set
        })
    }

    /// The state of the configurations a step produced: deduplicated, ordered, bounded.
    fn finish(&self, mut out: Vec<(u64, Config)>) -> Option<State> {
        if out.is_empty() {
            return None;
        }
        if out.len() > 1 {
            out.sort_by_key(|(h, _)| *h);
            out.dedup_by(|a, b| a.0 == b.0 && a.1 == b.1);
            out.truncate(MAX_CONFIGS);
        }
        Some(State { configs: out })
    }

    fn config_accepting(&self, c: &Config) -> bool {
        let mut c = c.clone();
        loop {
            let done = match c.top {
                Frame::End => return true,
                Frame::Tok { t, s } => self.dfa_accepts(t, s),
                Frame::Ignore { s } => self.g.ignore.is_some_and(|i| self.dfa_accepts(i, s)),
                Frame::Sym { alt, pos } => self.g.nullable_suffix[alt as usize][pos as usize],
            };
            if !done {
                return false;
            }
            match c.pop() {
                Some(p) => c = p,
                None => return false,
            }
        }
    }
}

impl Recognizer for GrammarRecognizer {
    type State = State;

    fn start(&self) -> State {
        let bottom = Config { top: Frame::End, below: None };
        let c = bottom.push(Frame::Sym { alt: self.g.start_alt, pos: 0 });
        State { configs: vec![(c.hash64(), c)] }
    }

    fn advance(&self, state: &State, byte: u8) -> Option<State> {
        let mut out = Vec::new();
        for (_, c) in &state.configs {
            let mut budget = STEP_BUDGET;
            self.step(c.clone(), byte, &mut out, &mut budget);
        }
        self.finish(out)
    }

    fn is_accepting(&self, state: &State) -> bool {
        state.configs.iter().any(|(_, c)| self.config_accepting(c))
    }

    fn state_key(&self, state: &State) -> u64 {
        key::of(state)
    }

    fn fill_mask(&self, state: &State, table: &TokenTable, set: &mut TokenSet) -> bool {
        let mut walks = lock(&self.walk_table);
        let start = self.to_walk(state.clone(), &mut walks.shared);
        let first = walks.intern(start.clone());
        if first != DEAD {
            table.trie().walk_ids(first, &mut Vec::new(), &mut WalkSteps { walks: &mut walks, rec: self }, set);
        }
        if walks.overflowed {
            // Too many distinct walk states to tabulate: start the table afresh for later
            // masks, and walk this one stepping the states directly.
            *walks = WalkTable::new(&self.classes);
            set.clear();
            let mut stack = Vec::new();
            let shared = &mut walks.shared;
            table.trie().walk(&start, &mut stack, |w, b| self.walk_advance(w, b, shared), |t| set.insert(t));
        }
        true
    }
}

/// A [`WalkTable`] and its grammar as the trie walk's [`IdSteps`].
struct WalkSteps<'a> {
    walks: &'a mut WalkTable,
    rec: &'a GrammarRecognizer,
}

impl IdSteps for WalkSteps<'_> {
    #[inline(always)]
    fn step(&mut self, w: u32, b: u8) -> Option<u32> {
        self.walks.next(self.rec, w, b)
    }

    #[inline(always)]
    fn loops_on(&mut self, w: u32, classes: u64) -> bool {
        // Most checks are of subtrees with a byte the state is known not to loop on: refused
        // here, without a call.
        let ascii = classes & !(NON_ASCII_CLASSES | UTF8_WHOLE);
        if self.walks.loops[w as usize].known_not_to_loop(ascii) {
            return false;
        }
        self.walks.loops_on(self.rec, w, classes)
    }
}

/// The walk states of the masks as a DFA built lazily: each distinct walk state gets an id
/// and a row of transitions, one per byte class ([`ByteClasses`]), filled in the first time
/// a trie walk takes a byte of that class from it. Most trie nodes share a walk state and a byte with others (inside an identifier every
/// node is one of the same few DFA positions), so they cost one table lookup instead of
/// stepping every token group; and masks of states seen before reuse the whole table.
struct WalkTable {
    walks: Vec<Walk>,
    shared: SharedGroups,
    ids: KeyMap<Bucket<u32>>,
    /// A row per walk state: a walk state id, [`DEAD`] or [`UNKNOWN`] per byte class.
    next: Transitions,
    /// Per walk state: the byte classes it is known to loop on, or not.
    loops: Vec<ClassLoops>,
    /// Per walk state, once known: [`Self::loops_over_utf8`].
    utf8_loops: Vec<Option<bool>>,
    /// [`GrammarRecognizer::dfa_loops_over_utf8`] by terminal and DFA state.
    utf8_by_dfa_state: KeyMap<bool>,
    /// Set when the states outgrew [`MAX_WALK_STATES`]; the walk then rejects everything
    /// and the caller walks again without the table.
    overflowed: bool,
}

const UNKNOWN: u32 = Transitions::UNKNOWN;
const DEAD: u32 = u32::MAX - 1;
/// The most walk states the table keeps (at most 256 transitions of 4 bytes each: 8 MiB).
const MAX_WALK_STATES: usize = 8192;

impl WalkTable {
    /// An empty table with a column per class of `classes`.
    fn new(classes: &ByteClasses) -> Self {
        Self {
            walks: Vec::new(),
            shared: SharedGroups::default(),
            ids: KeyMap::default(),
            next: Transitions::with_width(classes.count),
            loops: Vec::new(),
            utf8_loops: Vec::new(),
            utf8_by_dfa_state: KeyMap::default(),
            overflowed: false,
        }
    }

    /// The id of `walk`, adding it if new; [`DEAD`] once the table is full.
    fn intern(&mut self, walk: Walk) -> u32 {
        // Token groups by their shared group list and DFA states; other states by content.
        let key = match &walk {
            Walk::Tokens { groups, states } => {
                states[..groups.len()].iter().fold(Arc::as_ptr(groups) as usize as u64, |h, &s| key::mix(h, s as u64))
            }
            Walk::Full(full) => key::mix(full.state.fast_key(), 1),
        };
        let same = |a: &Walk, b: &Walk| match (a, b) {
            (Walk::Full(x), Walk::Full(y)) => x.state == y.state,
            (Walk::Tokens { groups: g, states: s }, Walk::Tokens { groups: h, states: t }) => {
                Arc::ptr_eq(g, h) && s == t
            }
            _ => false,
        };
        if let Some(ids) = self.ids.get(&key)
            && let Some(&id) = ids.iter().find(|&&id| same(&self.walks[id as usize], &walk))
        {
            return id;
        }
        if self.walks.len() == MAX_WALK_STATES {
            self.overflowed = true;
            return DEAD;
        }
        let id = self.walks.len() as u32;
        self.walks.push(walk);
        self.next.push_row();
        self.loops.push(ClassLoops::default());
        self.utf8_loops.push(None);
        add_to(&mut self.ids, key, id);
        id
    }

    /// Whether walk state `w` steps to itself on every byte of the byte classes `classes`.
    #[inline(never)]
    fn loops_on(&mut self, rec: &GrammarRecognizer, w: u32, classes: u64) -> bool {
        if classes & NON_ASCII_CLASSES != 0 {
            // Bytes of several kinds inside characters: the subtree must be whole characters
            // and every token group must go round its DFA state over each of them.
            if classes & UTF8_WHOLE == 0 || !self.loops_over_utf8(rec, w) {
                return false;
            }
        }
        let mut known = self.loops[w as usize];
        let loops = known.check(classes & !(NON_ASCII_CLASSES | UTF8_WHOLE), |b| self.next(rec, w, b) == Some(w));
        self.loops[w as usize] = known;
        loops
    }

    /// Whether every token group of walk state `w` steps from its DFA state back to it over
    /// every multi-byte UTF-8 character, staying alive (and, for plain-text tokens, not
    /// accepting) inside one, so that no token ends and the walk state stays `w`.
    fn loops_over_utf8(&mut self, rec: &GrammarRecognizer, w: u32) -> bool {
        if let Some(known) = self.utf8_loops[w as usize] {
            return known;
        }
        let loops = match &self.walks[w as usize] {
            Walk::Full(_) => false,
            Walk::Tokens { groups, states } => groups
                .iter()
                .zip(states)
                .filter(|&(_, &s)| s != GONE)
                .all(|(g, &s)| rec.dfa_loops_over_utf8(g.t, s, &mut self.utf8_by_dfa_state)),
        };
        self.utf8_loops[w as usize] = Some(loops);
        loops
    }

    /// The walk state after byte `b` from state `w`, or `None` where the byte is rejected:
    /// one table lookup where the transition is known.
    #[inline(always)]
    fn next(&mut self, rec: &GrammarRecognizer, w: u32, b: u8) -> Option<u32> {
        match self.next.get(w, rec.classes.of[b as usize]) {
            UNKNOWN => self.next_first(rec, w, b),
            DEAD => None,
            n => Some(n),
        }
    }

    /// [`Self::next`] the first time the walks take byte `b` from `w`.
    #[inline(never)]
    fn next_first(&mut self, rec: &GrammarRecognizer, w: u32, b: u8) -> Option<u32> {
        if self.overflowed {
            return None;
        }
        let n = match rec.walk_advance(&self.walks[w as usize], b, &mut self.shared) {
            Some(walk) => self.intern(walk),
            None => DEAD,
        };
        self.next.set(w, rec.classes.of[b as usize], n);
        (n != DEAD).then_some(n)
    }
}
