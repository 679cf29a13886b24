//! The fast mask inside JSON strings.
//!
//! Inside an unconstrained string almost every token is allowed, and the generic trie walk
//! would visit the whole vocabulary. Instead, once per tokenizer table, the tokens are split
//! into: pure string content (valid from the plain in-string state, no unescaped quote), and
//! tokens that close the string (valid content, then an unescaped `"`, then anything). A mask
//! is then the content bitset OR-ed in, plus the closing tokens checked one by one against
//! what may follow the string.

use std::sync::{Arc, Mutex};

use dspark_guest::{Recognizer, TokenSet, TokenTable, TokenTrie};

pub use crate::recognizer::classes::PatternClassCache;

use crate::graph::Node;
use crate::recognizer::SchemaRecognizer;
use crate::recognizer::classes::ClassKey;
use crate::recognizer::frame::{Chars, Frame};
use crate::recognizer::state::State;
use crate::recognizer::unique::extend_text;

/// Token classes of one table.
pub struct StringSets {
    content: TokenSet,
    content_noesc: TokenSet,
    /// Content tokens with a backslash (checked one by one under patterns or length bounds).
    content_esc: Vec<u32>,
    closing: Vec<u32>,
    closing_noesc: Vec<u32>,
    /// Escape-free content tokens by character count: `by_len[c]` for c in 1..=16.
    by_len: Vec<TokenSet>,
    /// Escape-free content tokens of more than 16 characters.
    long: Vec<(u32, u32)>,
    /// Characters per token (content tokens; saturating at 255).
    chars: Vec<u8>,
    /// `closing`, `closing_noesc` and `content_esc` as tries: the tokens a mask must check
    /// one by one are walked together from the string's state, so their common prefixes are
    /// stepped once and a dead prefix drops all the tokens that share it.
    closing_trie: TokenTrie,
    closing_noesc_trie: TokenTrie,
    content_esc_trie: TokenTrie,
    /// The closing tokens by their tail (the closing quote and what follows it).
    tails: TailIndex,
    /// The closing tokens with a `}` in their tail: inside an item whose bytes are captured
    /// (an object under an exact `uniqueItems`), that `}` may end the item, and whether it
    /// repeats an earlier one depends on the content before the quote too.
    closing_brace: Vec<u32>,
}

/// Closing tokens grouped by tail: where the content before the quote cannot change what
/// happens (a string with no pattern and its minimum length reached, a key that cannot match
/// a pattern), a closing token is allowed exactly when its tail is, and walking the distinct
/// tails (about as many as the tokens, but sharing their first bytes, and every walk starts
/// at the quote) skips the content prefixes entirely.
struct TailIndex {
    /// A trie whose "token ids" are tail indices.
    trie: TokenTrie,
    /// The closing tokens of tail `i`: `tokens[start[i]..start[i + 1]]`.
    start: Vec<u32>,
    tokens: Vec<u32>,
    /// Per closing token (by position in `tokens`), the length of the content before its quote.
    prefix_len: Vec<u16>,
}

impl TailIndex {
    fn build(table: &TokenTable, closing: &[u32]) -> Self {
        let quote_at = |t: u32| {
            // The first unescaped quote: the same scan as the classification.
            let mut c = Chars::default();
            for (i, &b) in table.token_bytes(t).iter().enumerate() {
                if c.is_plain() && b == b'"' {
                    return i;
                }
                c = crate::recognizer::frame::advance_chars(c, b).unwrap_or_default();
            }
            0
        };
        let mut by_tail: std::collections::BTreeMap<&[u8], Vec<(u32, u16)>> = std::collections::BTreeMap::new();
        for &t in closing {
            let q = quote_at(t);
            by_tail.entry(&table.token_bytes(t)[q..]).or_default().push((t, q as u16));
        }
        let tails: Vec<&[u8]> = by_tail.keys().copied().collect();
        let trie = TokenTrie::build(tails.len(), |i| tails[i]);
        let (mut start, mut tokens, mut prefix_len) = (vec![0u32], Vec::new(), Vec::new());
        for group in by_tail.values() {
            for &(t, q) in group {
                tokens.push(t);
                prefix_len.push(q);
            }
            start.push(tokens.len() as u32);
        }
        Self { trie, start, tokens, prefix_len }
    }

    /// Inserts the closing tokens whose tails `walk` accepts and whose content prefix `keep`
    /// agrees to (given the token's bytes and the prefix length).
    fn fill(&self, set: &mut TokenSet, walk: SubTrieWalk<'_>, keep: impl Fn(u32, usize) -> bool) {
        let mut ok = TokenSet::new(self.start.len() - 1);
        walk(&self.trie, &mut ok);
        for tail in ok.iter() {
            let (a, b) = (self.start[tail as usize] as usize, self.start[tail as usize + 1] as usize);
            for i in a..b {
                if keep(self.tokens[i], self.prefix_len[i] as usize) {
                    set.insert(self.tokens[i]);
                }
            }
        }
    }
}

/// A trie over the tokens `ids` of `table` only.
fn sub_trie(table: &TokenTable, ids: &[u32]) -> TokenTrie {
    let mut member = vec![false; table.vocab_size()];
    for &t in ids {
        member[t as usize] = true;
    }
    TokenTrie::build(table.vocab_size(), |id| if member[id] { table.token_bytes(id as u32) } else { &[] })
}

impl StringSets {
    fn build(table: &TokenTable) -> Self {
        let n = table.vocab_size();
        let mut s = StringSets {
            content: TokenSet::new(n),
            content_noesc: TokenSet::new(n),
            content_esc: Vec::new(),
            closing: Vec::new(),
            closing_noesc: Vec::new(),
            by_len: (0..=16).map(|_| TokenSet::new(n)).collect(),
            long: Vec::new(),
            chars: vec![0; n],
            closing_trie: TokenTrie::build(0, |_| &[]),
            closing_noesc_trie: TokenTrie::build(0, |_| &[]),
            content_esc_trie: TokenTrie::build(0, |_| &[]),
            tails: TailIndex {
                trie: TokenTrie::build(0, |_| &[]),
                start: vec![0],
                tokens: Vec::new(),
                prefix_len: Vec::new(),
            },
            closing_brace: Vec::new(),
        };
        for id in 0..n as u32 {
            if table.is_special(id) {
                continue;
            }
            let bytes = table.token_bytes(id);
            if bytes.is_empty() {
                continue;
            }
            let mut c = Chars::default();
            let mut chars = 0u32;
            let mut backslash = false;
            let mut closes = false;
            let mut valid = true;
            for &b in bytes {
                if c.is_plain() && b == b'"' {
                    closes = true;
                    break;
                }
                backslash |= b == b'\\';
                if c.is_plain() {
                    chars += 1;
                }
                match crate::recognizer::frame::advance_chars(c, b) {
                    Some(next) => c = next,
                    None => {
                        valid = false;
                        break;
                    }
                }
            }
            match (valid, closes, backslash) {
                (true, true, false) => {
                    s.closing.push(id);
                    s.closing_noesc.push(id);
                }
                (true, true, true) => s.closing.push(id),
                (true, false, false) => {
                    s.chars[id as usize] = chars.min(255) as u8;
                    s.content.insert(id);
                    s.content_noesc.insert(id);
                    if chars as usize <= 16 {
                        s.by_len[chars as usize].insert(id);
                    } else {
                        s.long.push((id, chars));
                    }
                }
                (true, false, true) => {
                    s.content.insert(id);
                    s.content_esc.push(id);
                }
                _ => {}
            }
        }
        s.closing_trie = sub_trie(table, &s.closing);
        s.closing_noesc_trie = sub_trie(table, &s.closing_noesc);
        s.content_esc_trie = sub_trie(table, &s.content_esc);
        s.tails = TailIndex::build(table, &s.closing);
        for i in 0..s.tails.tokens.len() {
            let t = s.tails.tokens[i];
            if table.token_bytes(t)[s.tails.prefix_len[i] as usize..].contains(&b'}') {
                s.closing_brace.push(t);
            }
        }
        s
    }
}

/// The sets of each table seen, by the table's address and size (one table per plugin
/// instance in practice).
static CACHE: Mutex<Vec<(usize, usize, Arc<StringSets>)>> = Mutex::new(Vec::new());

fn sets_for(table: &TokenTable) -> Arc<StringSets> {
    let id = (table as *const TokenTable as usize, table.vocab_size());
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, _, s)) = cache.iter().find(|(a, n, _)| (*a, *n) == id) {
        return s.clone();
    }
    let s = Arc::new(StringSets::build(table));
    if cache.len() >= 8 {
        cache.remove(0);
    }
    cache.push((id.0, id.1, s.clone()));
    s
}

/// Builds (or finds) the token classes of `table`.
pub fn warm_up(table: &TokenTable) {
    sets_for(table);
}

/// Fills `set` with the tokens `state` allows, using the fast path for each configuration
/// that is inside a string or an undeclared key and the trie walk for the others; `false`
/// when no configuration is inside a string (the caller walks the trie as usual).
pub fn fill_string_mask(rec: &SchemaRecognizer, state: &State, table: &TokenTable, set: &mut TokenSet) -> bool {
    let configs = state.split();
    if !configs.iter().any(|c| eligible(rec, c)) {
        return false;
    }
    for c in &configs {
        if eligible(rec, c) && c.single().is_some_and(|s| s.capture_len().is_some()) {
            // Inside a captured item the tails are judged without the token's own content,
            // which a `}` ending the item needs: those tokens are decided whole, on a set of
            // this configuration's own (another may allow what this one refuses).
            let walk = |trie: &TokenTrie, set: &mut TokenSet| rec.fill_trie_by_table(c, trie, set);
            let mut own = TokenSet::new(table.vocab_size());
            fill_one(rec, c, table, &mut own, &walk, false);
            for &t in &sets_for(table).closing_brace {
                if accepts(rec, c, table.token_bytes(t)) {
                    own.insert(t);
                } else {
                    own.remove(t);
                }
            }
            or_into(set, &own);
        } else if eligible(rec, c) {
            let walk = |trie: &TokenTrie, set: &mut TokenSet| rec.fill_trie_by_table(c, trie, set);
            fill_one(rec, c, table, set, &walk, false);
        } else {
            rec.fill_by_table(c, table, set);
        }
    }
    true
}

/// Walks a sub-trie of the vocabulary from one state, inserting the tokens it accepts.
pub type SubTrieWalk<'a> = &'a dyn Fn(&TokenTrie, &mut TokenSet);

/// The fast path for a recogniser embedded in a larger one (the tool-call plugin's arguments):
/// fills `set` for a single-configuration state inside a string and returns `true`, else
/// returns `false`. Tokens that leave the string may run past the end of this document into
/// what the outer recogniser expects next, so they are walked with `outer_walk` (the outer
/// recogniser's walk from the same state); tokens that stay inside the string are decided
/// here.
pub fn fill_embedded_string_mask(
    rec: &SchemaRecognizer,
    state: &State,
    table: &TokenTable,
    set: &mut TokenSet,
    outer_walk: SubTrieWalk<'_>,
) -> bool {
    // Inside a captured item (see `fill_string_mask`) the outer walk decides.
    if state.single().is_none_or(|c| c.capture_len().is_some()) || !eligible(rec, state) {
        return false;
    }
    fill_one(rec, state, table, set, outer_walk, true);
    true
}

/// Whether a single-configuration state is inside a string or an undeclared key, where
/// [`fill_embedded_string_mask`] takes its fast path.
pub fn is_string_state(state: &State) -> bool {
    state.single().is_some() && eligible_config(state)
}

fn eligible(_rec: &SchemaRecognizer, state: &State) -> bool {
    eligible_config(state)
}

fn eligible_config(state: &State) -> bool {
    match state.single().and_then(|c| c.top()) {
        Some(Frame::Str { chars, .. }) => chars.is_plain(),
        Some(Frame::FreeKey { chars, .. }) => chars.is_plain(),
        _ => false,
    }
}

/// Fills the mask of one in-string state; the tokens that need checking (escapes, closing
/// quotes) are decided by walking their sub-tries with `walk` (the outer recogniser's walk
/// when `embedded`).
fn fill_one(
    rec: &SchemaRecognizer,
    state: &State,
    table: &TokenTable,
    set: &mut TokenSet,
    walk: SubTrieWalk<'_>,
    embedded: bool,
) {
    let sets = sets_for(table);
    let g = rec.graph();
    match state.single().and_then(|c| c.top()) {
        Some(Frame::Str { node, len, dfa, .. }) => {
            let Node::String(s) = g.node(*node) else { return };
            if s.patterns.is_empty() && s.max_len == u32::MAX {
                or_into(set, &sets.content);
                // The untracked copy is made only for a tracked item (the common string has none).
                let tracked = state.tracked_text().and_then(|t| Some((t, state.untracked_text()?)));
                match tracked {
                    // An item under an exact `uniqueItems`: a closing token is allowed when its
                    // tail is (judged as for any string) and its text repeats no item.
                    Some(((h, items), free)) if !embedded && *len >= s.min_len => {
                        let fresh = |t: u32, prefix: usize| {
                            let bytes = table.token_bytes(t);
                            // A tail that also closes the next item (`","a"`) is judged whole.
                            if bytes[prefix + 1..].iter().filter(|&&b| b == b'"').count() >= 2 {
                                return accepts(rec, state, bytes);
                            }
                            match extend_text(h, &bytes[..prefix]) {
                                Some(h) => items.as_ref().is_none_or(|items| items.binary_search(&h.get()).is_err()),
                                None => false,
                            }
                        };
                        let walk_free = |trie: &TokenTrie, ok: &mut TokenSet| rec.fill_trie_by_table(&free, trie, ok);
                        sets.tails.fill(set, &walk_free, fresh);
                    }
                    None if *len >= s.min_len => sets.tails.fill(set, walk, |_, _| true),
                    _ => walk(&sets.closing_trie, set),
                }
                return;
            }
            // Escape-free content that keeps every pattern alive (and completable in the room
            // left), else cut to the length left by character counts.
            let left = if s.max_len == u32::MAX { u32::MAX } else { s.max_len.saturating_sub(*len) };
            if !s.patterns.is_empty() {
                let mut key = ClassKey { patterns: [(0, 0); 4], n: 0, any: false, left };
                for (k, &p) in s.patterns.iter().enumerate().take(2) {
                    key.patterns[k] = (p, dfa[k]);
                    key.n += 1;
                }
                or_into(set, &rec.content_class(key, table));
            } else if left == u32::MAX {
                or_into(set, &sets.content_noesc);
            } else {
                // A tracked item (under an exact `uniqueItems`) that a token fills to its
                // `maxLength` must not repeat an earlier item: those tokens are checked.
                let filled = state.tracked_text().filter(|(_, items)| items.as_ref().is_some_and(|i| !i.is_empty()));
                let repeats = |t: u32| {
                    filled.as_ref().is_some_and(|(h, items)| {
                        extend_text(*h, table.token_bytes(t))
                            .is_some_and(|h| items.as_ref().is_some_and(|i| i.binary_search(&h.get()).is_ok()))
                    })
                };
                for c in 1..=left.min(16) as usize {
                    if c as u32 == left && filled.is_some() {
                        for t in sets.by_len[c].iter().filter(|&t| !repeats(t)) {
                            set.insert(t);
                        }
                    } else {
                        or_into(set, &sets.by_len[c]);
                    }
                }
                for &(t, c) in &sets.long {
                    if c <= left && !(c == left && repeats(t)) {
                        set.insert(t);
                    }
                }
                // Closing tokens of a tracked item: by their tails, where the content before
                // the quote fits the room left and its text repeats no item.
                let tracked = state.tracked_text().and_then(|t| Some((t, state.untracked_text()?)));
                if let Some(((h, items), free)) =
                    tracked.filter(|_| !embedded && s.patterns.is_empty() && *len >= s.min_len)
                {
                    walk(&sets.content_esc_trie, set);
                    let fresh = |t: u32, prefix: usize| {
                        let bytes = table.token_bytes(t);
                        if bytes[prefix + 1..].iter().filter(|&&b| b == b'"').count() >= 2 {
                            return accepts(rec, state, bytes);
                        }
                        content_chars(&bytes[..prefix]) <= left
                            && extend_text(h, &bytes[..prefix]).is_some_and(|h| {
                                items.as_ref().is_none_or(|items| items.binary_search(&h.get()).is_err())
                            })
                    };
                    let walk_free = |trie: &TokenTrie, ok: &mut TokenSet| rec.fill_trie_by_table(&free, trie, ok);
                    sets.tails.fill(set, &walk_free, fresh);
                    return;
                }
            }
            walk(&sets.content_esc_trie, set);
            walk(&sets.closing_trie, set);
        }
        Some(Frame::FreeKey { obj, dfa, trie, .. }) => {
            let Node::Object(o) = g.node(*obj) else { return };
            if o.patterns.is_empty() {
                // Any key text is fine while it lasts (escapes included).
                or_into(set, &sets.content);
                if o.additional == crate::graph::NEVER {
                    walk(&sets.closing_trie, set);
                    return;
                }
                // What follows the key does not depend on its text, except that a key that
                // completes a declared name is not an additional property (that name's own
                // configuration takes it).
                let declared = |t: u32, prefix: usize| {
                    let Some(mut node) = *trie else { return false };
                    for &b in &table.token_bytes(t)[..prefix] {
                        match o.keys.child(node, b) {
                            Some(n) => node = n,
                            None => return false,
                        }
                    }
                    o.keys.child(node, b'"').is_some_and(|e| o.keys.terminal[e as usize].is_some())
                };
                // The tails are judged from the key with its text off the declared names (the
                // quote's verdict at the current text is `declared` with no prefix), and
                // each token's own text decides whether it completes a declared name.
                match state.off_declared_names() {
                    Some(free) if trie.is_some() => sets.tails.fill(
                        set,
                        &|trie: &TokenTrie, ok: &mut TokenSet| rec.fill_trie_by_table(&free, trie, ok),
                        |t, prefix| !declared(t, prefix),
                    ),
                    _ => sets.tails.fill(set, walk, |t, prefix| !declared(t, prefix)),
                }
                return;
            } else if o.additional != crate::graph::NEVER {
                // The patterns decide the value's schema only when the key closes.
                or_into(set, &sets.content_noesc);
            } else {
                let mut key = ClassKey { patterns: [(0, 0); 4], n: 0, any: true, left: u32::MAX };
                for (k, &p) in o.patterns.iter().enumerate().take(4) {
                    key.patterns[k] = (p, dfa[k]);
                    key.n += 1;
                }
                or_into(set, &rec.content_class(key, table));
            }
            walk(&sets.closing_noesc_trie, set);
        }
        _ => {}
    }
}

/// The characters of string content `bytes` (counted at their first byte, as the recogniser
/// counts them against `maxLength`).
fn content_chars(bytes: &[u8]) -> u32 {
    let (mut c, mut n) = (Chars::default(), 0u32);
    for &b in bytes {
        if c.is_plain() {
            n += 1;
        }
        c = crate::recognizer::frame::advance_chars(c, b).unwrap_or_default();
    }
    n
}

/// Whether `state` takes all of `bytes`.
fn accepts(rec: &SchemaRecognizer, state: &State, bytes: &[u8]) -> bool {
    let mut s = state.clone();
    for &b in bytes {
        match rec.advance(&s, b) {
            Some(next) => s = next,
            None => return false,
        }
    }
    true
}

fn or_into(set: &mut TokenSet, bits: &TokenSet) {
    for (w, b) in set.words_mut().iter_mut().zip(bits.words()) {
        *w |= *b;
    }
}
