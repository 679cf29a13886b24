//! [`StateTable`]: a recogniser's states as a DFA built lazily while masks walk the token trie.
//!
//! The plain trie walk calls [`Recognizer::advance`] at every node it visits, and the nodes of
//! one mask share few distinct (state, byte) pairs: inside a number, a key that has left every
//! declared name, or a string, thousands of nodes step the same few states. The table interns
//! states by their key (the contract's promise: equal keys, equal futures), gives each a row
//! of 256 transitions filled the first time a walk takes that byte from it, and keeps them
//! across masks, so a node costs one lookup. With [`TokenTrie::walk_looping`] it also knows
//! which byte classes a state loops on, and takes whole subtrees of those without stepping
//! into them.

use crate::bitset::TokenSet;
use crate::key::KeyMap;
use crate::recognizer::Recognizer;
use crate::table::TokenTable;
use crate::trie::{IdSteps, NON_ASCII_CLASSES, TokenTrie, UTF8_WHOLE, Utf8Step, class_bytes};

/// What a [`StateTable`] needs of a state machine over bytes: its steps and its state keys
/// (equal keys, equal futures). Every [`Recognizer`] has it; a plugin can also implement it
/// for a short-lived machine of its own (e.g. one that borrows its automata).
pub trait Steps {
    /// A state.
    type State: Clone;

    /// The state after `byte`, or `None` where the byte is rejected.
    fn step(&self, state: &Self::State, byte: u8) -> Option<Self::State>;

    /// The state's key.
    fn key(&self, state: &Self::State) -> u64;
}

impl<R: Recognizer> Steps for R {
    type State = R::State;

    fn step(&self, state: &R::State, byte: u8) -> Option<R::State> {
        self.advance(state, byte)
    }

    fn key(&self, state: &R::State) -> u64 {
        self.state_key(state)
    }
}

/// What is known of the byte classes a state loops on (steps to itself on every byte of).
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassLoops {
    known: u64,
    looping: u64,
}

impl ClassLoops {
    /// Whether one of `classes` is already known not to loop: the quick refusal a walk can
    /// make inline before calling [`Self::check`].
    #[inline(always)]
    pub fn known_not_to_loop(&self, classes: u64) -> bool {
        classes & self.known & !self.looping != 0
    }

    /// Whether the state loops on every class in `classes`, asking `to_self(byte)` (does the
    /// byte step the state to itself?) for the classes not known yet and remembering the
    /// answers.
    pub fn check(&mut self, classes: u64, mut to_self: impl FnMut(u8) -> bool) -> bool {
        if classes & self.known & !self.looping != 0 {
            return false;
        }
        let mut unknown = classes & !self.known;
        while unknown != 0 {
            let class = unknown.trailing_zeros();
            unknown &= unknown - 1;
            let loops = class_bytes(class).all(&mut to_self);
            self.known |= 1 << class;
            if !loops {
                return false;
            }
            self.looping |= 1 << class;
        }
        true
    }
}

const UNKNOWN: u32 = Transitions::UNKNOWN;
const DEAD: u32 = u32::MAX - 1;

/// States per block of [`Transitions`] (64 KiB of transitions at the full width of 256).
const ROWS_PER_BLOCK: usize = 64;

/// A lazily filled transition table: a row per state with an entry per byte (or per byte
/// class, for a table made [`Transitions::with_width`] fewer columns), every entry
/// [`Transitions::UNKNOWN`] until set. Rows live in fixed blocks, so adding a state never
/// moves the rows already there: a doubling `Vec` copied up to megabytes inside whichever
/// mask happened to add the state that filled it.
pub struct Transitions {
    blocks: Vec<Box<[u32]>>,
    rows: usize,
    width: usize,
}

impl Default for Transitions {
    /// A table with a column per byte.
    fn default() -> Self {
        Self::with_width(256)
    }
}

impl Transitions {
    /// The entry of a transition not computed yet.
    pub const UNKNOWN: u32 = u32::MAX;

    /// A table with `width` columns (at least 1, at most 256): for a machine whose bytes fall
    /// into `width` classes that it treats alike, so that a row is that much smaller to
    /// fill and to keep in cache.
    pub fn with_width(width: usize) -> Self {
        Self { blocks: Vec::new(), rows: 0, width: width.clamp(1, 256) }
    }

    /// The number of columns of a row.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The number of rows.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether the table has no row.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Adds a row of unknown transitions; returns its index.
    pub fn push_row(&mut self) -> usize {
        if self.rows == self.blocks.len() * ROWS_PER_BLOCK {
            self.blocks.push(vec![Self::UNKNOWN; ROWS_PER_BLOCK * self.width].into_boxed_slice());
        }
        self.rows += 1;
        self.rows - 1
    }

    /// The entry for column `col` (a byte, or a byte class) in row `row`.
    ///
    /// # Panics
    /// Where `row` is not a row of the table or `col` not a column.
    #[inline(always)]
    pub fn get(&self, row: u32, col: u8) -> u32 {
        let row = row as usize;
        debug_assert!((col as usize) < self.width);
        self.blocks[row / ROWS_PER_BLOCK][row % ROWS_PER_BLOCK * self.width + col as usize]
    }

    /// Sets the entry for column `col` in row `row`.
    ///
    /// # Panics
    /// Where `row` is not a row of the table or `col` not a column.
    pub fn set(&mut self, row: u32, col: u8, value: u32) {
        let row = row as usize;
        assert!((col as usize) < self.width, "column {col} of a table {} wide", self.width);
        self.blocks[row / ROWS_PER_BLOCK][row % ROWS_PER_BLOCK * self.width + col as usize] = value;
    }
}

/// The most states a table keeps (each with 1 KiB of transitions); past it the table starts
/// afresh.
pub const MAX_TABLE_STATES: usize = 8192;

/// A recogniser's states met by mask walks and their transitions. Keep one per compiled
/// constraint (behind a lock) so that its matchers share it.
pub struct StateTable<S> {
    states: Vec<S>,
    ids: KeyMap<u32>,
    /// A row per state: a state id, [`DEAD`] or [`UNKNOWN`] per byte.
    next: Transitions,
    /// Per state: the byte classes it is known to loop on, or not.
    loops: Vec<ClassLoops>,
    /// Per state, once known: whether it steps back to itself over every multi-byte UTF-8
    /// character, alive inside each.
    utf8: Vec<Option<bool>>,
    /// Set when the states outgrew [`MAX_TABLE_STATES`] during a walk.
    overflowed: bool,
}

impl<S> Default for StateTable<S> {
    fn default() -> Self {
        Self {
            states: Vec::new(),
            ids: KeyMap::default(),
            next: Transitions::default(),
            loops: Vec::new(),
            utf8: Vec::new(),
            overflowed: false,
        }
    }
}

impl<S: Clone> StateTable<S> {
    /// The number of states the table holds.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether the table holds no state.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Inserts into `set` every token of `table` whose bytes `rec` accepts from `start`: the
    /// same tokens as the plain trie walk with [`Recognizer::advance`].
    pub fn fill<R: Steps<State = S>>(&mut self, rec: &R, start: &S, table: &TokenTable, set: &mut TokenSet) {
        self.fill_trie(rec, start, table.trie(), set);
    }

    /// [`Self::fill`] over the tokens of `trie` (e.g. a trie of part of the vocabulary).
    pub fn fill_trie<R: Steps<State = S>>(&mut self, rec: &R, start: &S, trie: &TokenTrie, set: &mut TokenSet) {
        let first = self.intern(rec, start.clone());
        if first != DEAD {
            trie.walk_ids(first, &mut Vec::new(), &mut TableSteps { table: self, rec }, set);
        }
        if self.overflowed {
            // Too many states to tabulate: start afresh for later masks and walk this one
            // plainly.
            *self = Self::default();
            let mut stack = Vec::new();
            trie.walk(start, &mut stack, |s, b| rec.step(s, b), |t| set.insert(t));
        }
    }

    fn intern<R: Steps<State = S>>(&mut self, rec: &R, state: S) -> u32 {
        let key = rec.key(&state);
        if let Some(&id) = self.ids.get(&key) {
            return id;
        }
        if self.states.len() == MAX_TABLE_STATES {
            self.overflowed = true;
            return DEAD;
        }
        let id = self.states.len() as u32;
        self.states.push(state);
        self.next.push_row();
        self.loops.push(ClassLoops::default());
        self.utf8.push(None);
        self.ids.insert(key, id);
        id
    }

    /// The state after byte `b` from state `w`, or `None` where the byte is rejected: one
    /// table lookup where the transition is known.
    #[inline(always)]
    fn step<R: Steps<State = S>>(&mut self, rec: &R, w: u32, b: u8) -> Option<u32> {
        match self.next.get(w, b) {
            UNKNOWN => self.step_first(rec, w, b),
            DEAD => None,
            n => Some(n),
        }
    }

    /// [`Self::step`] the first time a walk takes byte `b` from `w`.
    #[inline(never)]
    fn step_first<R: Steps<State = S>>(&mut self, rec: &R, w: u32, b: u8) -> Option<u32> {
        if self.overflowed {
            return None;
        }
        let n = match rec.step(&self.states[w as usize], b) {
            Some(s) => self.intern(rec, s),
            None => DEAD,
        };
        if self.overflowed {
            return None;
        }
        self.next.set(w, b, n);
        (n != DEAD).then_some(n)
    }

    /// Whether state `w` steps to itself on every byte of the classes `classes` (and, where
    /// they include bytes above 0x7f, over every whole UTF-8 character).
    fn loops_on<R: Steps<State = S>>(&mut self, rec: &R, w: u32, classes: u64) -> bool {
        if classes & NON_ASCII_CLASSES != 0 && (classes & UTF8_WHOLE == 0 || !self.loops_over_utf8(rec, w)) {
            return false;
        }
        let mut known = self.loops[w as usize];
        let loops = known.check(classes & !(NON_ASCII_CLASSES | UTF8_WHOLE), |b| self.step(rec, w, b) == Some(w));
        self.loops[w as usize] = known;
        loops && !self.overflowed
    }

    /// Whether `w` comes back to itself after every multi-byte UTF-8 character and stays
    /// alive inside each: a search over (state, decoder state) pairs.
    fn loops_over_utf8<R: Steps<State = S>>(&mut self, rec: &R, w: u32) -> bool {
        if let Some(known) = self.utf8[w as usize] {
            return known;
        }
        let mut loops = true;
        let mut seen = std::collections::HashSet::new();
        let mut todo = vec![(w, Utf8Step::BOUNDARY)];
        'search: while let Some((q, u)) = todo.pop() {
            let bytes = if u == Utf8Step::BOUNDARY { 0xc2..=0xf4 } else { u.lo..=u.hi };
            for b in bytes {
                let Some(next_u) = u.next(b) else { continue };
                let next_q = self.step(rec, q, b);
                let ok = match next_q {
                    None => false,
                    Some(n) if next_u == Utf8Step::BOUNDARY => n == w,
                    Some(n) => {
                        if seen.insert((n, next_u)) {
                            todo.push((n, next_u));
                        }
                        true
                    }
                };
                if !ok {
                    loops = false;
                    break 'search;
                }
            }
        }
        if self.overflowed {
            return false;
        }
        self.utf8[w as usize] = Some(loops);
        loops
    }
}

/// A [`StateTable`] and its recogniser as the trie walk's [`IdSteps`].
struct TableSteps<'a, S, R> {
    table: &'a mut StateTable<S>,
    rec: &'a R,
}

impl<S: Clone, R: Steps<State = S>> IdSteps for TableSteps<'_, S, R> {
    #[inline(always)]
    fn step(&mut self, state: u32, byte: u8) -> Option<u32> {
        self.table.step(self.rec, state, byte)
    }

    fn loops_on(&mut self, state: u32, classes: u64) -> bool {
        self.table.loops_on(self.rec, state, classes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key;

    /// `[a-z]+` then `=` then digits: state 0 start, 1 in the name, 2 after `=`, 3 in digits.
    /// Also accepts `"` ... `"` with any UTF-8 inside: 4 in the string, 5 closed.
    struct Toy;

    impl Recognizer for Toy {
        type State = u8;
        fn start(&self) -> u8 {
            0
        }
        fn advance(&self, &s: &u8, b: u8) -> Option<u8> {
            match (s, b) {
                (0 | 1, b'a'..=b'z') => Some(1),
                (1, b'=') => Some(2),
                (2 | 3, b'0'..=b'9') => Some(3),
                (0, b'"') => Some(4),
                (4, b'"') => Some(5),
                (4, 0x20..=0x7e) => Some(4),
                // Inside a character: 6 + bytes still expected (a loose UTF-8 model).
                (4, 0xc2..=0xdf) => Some(7),
                (4, 0xe0..=0xef) => Some(8),
                (8, 0x80..=0xbf) => Some(7),
                (7, 0x80..=0xbf) => Some(4),
                _ => None,
            }
        }
        fn is_accepting(&self, &s: &u8) -> bool {
            s == 3 || s == 5
        }
        fn state_key(&self, s: &u8) -> u64 {
            key::of(s)
        }
    }

    #[test]
    fn transitions_keep_their_rows_as_blocks_are_added() {
        let mut t = Transitions::default();
        assert!(t.is_empty());
        for row in 0..3 * ROWS_PER_BLOCK as u32 + 5 {
            assert_eq!(t.push_row(), row as usize);
            t.set(row, (row % 256) as u8, row);
        }
        assert_eq!(t.len(), 3 * ROWS_PER_BLOCK + 5);
        for row in 0..t.len() as u32 {
            assert_eq!(t.get(row, (row % 256) as u8), row);
            assert_eq!(t.get(row, (row % 256) as u8 ^ 1), Transitions::UNKNOWN);
        }
    }

    #[test]
    fn narrow_transitions_keep_one_entry_per_column() {
        let mut t = Transitions::with_width(3);
        assert_eq!(t.width(), 3);
        for row in 0..ROWS_PER_BLOCK as u32 + 2 {
            t.push_row();
            t.set(row, (row % 3) as u8, row);
        }
        for row in 0..t.len() as u32 {
            for col in 0..3u8 {
                let want = if col as u32 == row % 3 { row } else { Transitions::UNKNOWN };
                assert_eq!(t.get(row, col), want, "row {row} column {col}");
            }
        }
        assert_eq!(Transitions::with_width(0).width(), 1);
        assert_eq!(Transitions::with_width(999).width(), 256);
    }

    #[test]
    fn table_walks_agree_with_the_plain_walk_and_are_reused() {
        let mut words: Vec<String> = Vec::new();
        for w in
            ["ab", "abc", "abcd", "abcde", "x", "xy", "a=", "ab=1", "=12", "12", "123", "\"", "\"ab", "\"é", "\"éé"]
        {
            words.push(w.to_string());
            words.push(format!("{w}é"));
            words.push(format!("{w}\""));
        }
        // Letters and non-ASCII only below `qq`: the name state loops over the letters, not
        // over `é`; the string state loops over both.
        for w in ["qq", "qqa", "qqé", "qqéé", "qqab", "qqabé", "\"qq", "\"qqé", "\"qqéé", "\"qqab"] {
            words.push(w.to_string());
        }
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        let table = TokenTable::byte_level_for_tests(&refs);
        let mut tab = StateTable::default();
        for start in [0u8, 1, 2, 3, 4, 7, 8] {
            let mut fast = TokenSet::new(table.vocab_size());
            tab.fill(&Toy, &start, &table, &mut fast);
            let mut plain = TokenSet::new(table.vocab_size());
            table.trie().walk(&start, &mut Vec::new(), |s, b| Toy.advance(s, b), |t| plain.insert(t));
            assert_eq!(fast.words(), plain.words(), "from state {start}");
        }
        let states = tab.len();
        let mut again = TokenSet::new(table.vocab_size());
        tab.fill(&Toy, &4, &table, &mut again);
        assert_eq!(tab.len(), states, "a second walk from a known state adds no state");
    }
}
