//! The matcher the SDK builds from a [`Recognizer`].
//!
//! A plugin author who can say, byte by byte, whether a prefix can still become a match
//! implements [`Recognizer`]; [`RecognizerMatcher`] turns that into everything the contract
//! asks of a matcher: token masks (by walking the token trie), forced spans (by following the
//! bytes that are the only way on, then tokenising them canonically), rollback, drafts, forks
//! and state keys.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::api::{CommitResult, CompiledConstraint, Matcher};
use crate::bitset::{Mask, TokenSet};
use crate::error::{ConstraintError, ErrorCode, Warning};
use crate::key;
use crate::recognizer::Recognizer;
use crate::table::TokenTable;
use crate::walk::StateTable;

/// Forced spans longer than this many bytes are cut (the rest is forced at the next commit).
pub const MAX_FORCED_BYTES: usize = 4096;

/// The most continuations a forced span's tail is re-tokenised with to learn whether it
/// merges with what follows (see [`RecognizerMatcher`]'s forced spans); past this the tail
/// is held back unasked. Before a JSON string, `":"` has about 450 in Llama-3's vocabulary
/// (the tokens that start with `"` and go on with string bytes), and asking would not help:
/// before an empty string, `":""` tokenises otherwise (a maximum of 1,024 was measured: 0.1
/// points more tokens forced over JSONSchemaBench, 15% more wall time).
pub const MAX_MERGE_PROBES: usize = 32;

/// One entry of a matcher's history: the state after a token, or the EOS that ended it.
#[derive(Clone)]
enum Step<S> {
    Token(S),
    Eos,
}

/// Masks by state key, shared by the matchers of one compiled constraint. The state-key
/// promise (equal keys, equal masks) makes this sound; it is the plugin-side half of the
/// host's path tree, and makes a state seen before cost a copy instead of a trie walk.
/// Beside the masks, how many of a forced span's questioned tail tokens are certain, by
/// (state key after the span, tail bytes): see [`RecognizerMatcher`]'s `certain_tokens`.
#[derive(Default)]
pub struct MaskCache {
    inner: Mutex<MaskCacheInner>,
}

#[derive(Default)]
struct MaskCacheInner {
    masks: HashMap<u64, Arc<Mask>>,
    words: usize,
    tails: HashMap<(u64, u64), usize>,
}

/// The most tail verdicts a [`MaskCache`] holds before they are cleared.
const TAIL_CACHE_ENTRIES: usize = 1 << 16;

/// The most 32-bit words the cache holds before it is cleared (16 MiB).
const MASK_CACHE_WORDS: usize = 4 << 20;

impl MaskCache {
    fn get(&self, key: u64) -> Option<Arc<Mask>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).masks.get(&key).cloned()
    }

    fn insert(&self, key: u64, mask: Arc<Mask>) {
        let size = match &*mask {
            Mask::All => 1,
            Mask::Allow(v) | Mask::Bitset(v) => v.len() + 1,
            Mask::Ranges(r) => 2 * r.len() + 1,
        };
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.words + size > MASK_CACHE_WORDS {
            inner.masks.clear();
            inner.words = 0;
        }
        inner.words += size;
        inner.masks.insert(key, mask);
    }

    fn tail(&self, key: (u64, u64)) -> Option<usize> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).tails.get(&key).copied()
    }

    fn insert_tail(&self, key: (u64, u64), kept: usize) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.tails.len() >= TAIL_CACHE_ENTRIES {
            inner.tails.clear();
        }
        inner.tails.insert(key, kept);
    }
}

/// The matcher the SDK derives from a [`Recognizer`].
pub struct RecognizerMatcher<R: Recognizer> {
    rec: Arc<R>,
    table: Arc<TokenTable>,
    cache: Arc<MaskCache>,
    walks: Arc<Mutex<StateTable<R::State>>>,
    start: R::State,
    history: Vec<Step<R::State>>,
    set: TokenSet,
}

impl<R: Recognizer> Clone for RecognizerMatcher<R> {
    fn clone(&self) -> Self {
        Self {
            rec: self.rec.clone(),
            table: self.table.clone(),
            cache: self.cache.clone(),
            walks: self.walks.clone(),
            start: self.start.clone(),
            history: self.history.clone(),
            set: TokenSet::new(self.table.vocab_size()),
        }
    }
}

impl<R: Recognizer> RecognizerMatcher<R> {
    /// A matcher at the recogniser's start state, with its own mask cache and state table.
    pub fn new(rec: Arc<R>, table: Arc<TokenTable>) -> Self {
        Self::with_cache(rec, table, Arc::default(), Arc::default())
    }

    /// A matcher sharing `cache` and `walks` with the other matchers of its constraint.
    pub fn with_cache(
        rec: Arc<R>,
        table: Arc<TokenTable>,
        cache: Arc<MaskCache>,
        walks: Arc<Mutex<StateTable<R::State>>>,
    ) -> Self {
        let start = rec.start();
        let set = TokenSet::new(table.vocab_size());
        Self { rec, table, cache, walks, start, history: Vec::new(), set }
    }

    /// The current recogniser state, or `None` after EOS.
    pub fn state(&self) -> Option<&R::State> {
        match self.history.last() {
            None => Some(&self.start),
            Some(Step::Token(s)) => Some(s),
            Some(Step::Eos) => None,
        }
    }

    /// The number of tokens advanced over.
    pub fn len(&self) -> usize {
        self.history.len()
    }

    /// Whether no token has been advanced over.
    pub fn is_empty(&self) -> bool {
        self.history.is_empty()
    }

    /// The allowed tokens as a set (the same as [`Matcher::compute_mask`], uncompressed).
    pub fn allowed_tokens(&mut self) -> &TokenSet {
        self.set.clear();
        if let Some(state) = self.state().cloned() {
            let rec = &*self.rec;
            let set = &mut self.set;
            if (!self.rec.is_accepting(&state) || self.rec.can_extend(&state))
                && !rec.fill_mask(&state, &self.table, set)
            {
                let mut walks = self.walks.lock().unwrap_or_else(|p| p.into_inner());
                walks.fill(rec, &state, &self.table, set);
            }
            if self.rec.is_accepting(&state) {
                for &t in self.table.eos_tokens() {
                    self.set.insert(t);
                }
            }
        }
        &self.set
    }

    /// The state after `token` from `state`, or why not.
    fn step(&self, state: &R::State, token: u32) -> Result<Step<R::State>, ConstraintError> {
        let reject = |why: &str| {
            ConstraintError::new(ErrorCode::RejectedToken, format!("token {token} is not allowed here: {why}"))
        };
        if self.table.is_eos(token) {
            return if self.rec.is_accepting(state) {
                Ok(Step::Eos)
            } else {
                Err(reject("the output is not complete"))
            };
        }
        if token as usize >= self.table.vocab_size() {
            return Err(reject("the id is outside the vocabulary"));
        }
        if self.table.is_special(token) {
            return Err(reject("it is a special token"));
        }
        let bytes = self.table.token_bytes(token);
        if bytes.is_empty() {
            return Err(reject("it has no bytes"));
        }
        let mut s = state.clone();
        for &b in bytes {
            s = self.rec.advance(&s, b).ok_or_else(|| reject("its bytes leave the language"))?;
        }
        Ok(Step::Token(s))
    }

    /// The forced span after the current state: the bytes that are the only way on, as
    /// canonical tokens, without the tail that could merge with what follows.
    fn forced_tokens(&self) -> Vec<u32> {
        let Some(mut s) = self.state().cloned() else { return Vec::new() };
        let mut bytes = Vec::new();
        while bytes.len() < MAX_FORCED_BYTES && !self.rec.is_accepting(&s) {
            let Some(b) = self.rec.forced_byte(&s) else { break };
            match self.rec.advance(&s, b) {
                Some(next) => s = next,
                None => break,
            }
            bytes.push(b);
        }
        if bytes.is_empty() {
            return Vec::new();
        }
        let mut tokens = self.table.tokenize(&bytes);
        if bytes.len() >= MAX_FORCED_BYTES {
            tokens.pop();
        } else if self.rec.can_extend(&s) {
            // The tail could merge with free bytes that follow (`"` + `,` -> `",`, or over two
            // tokens: `":` + `{` + `"` -> `":{"`): hold back what might.
            let keep = self.certain_tokens(&tokens, &bytes, &s);
            tokens.truncate(keep);
        }
        tokens
    }

    /// How many of `tokens` (the tokenization of the forced `bytes`, which end at state
    /// `after`) the tokenizer would produce whatever follows.
    ///
    /// The vocabulary alone gives a safe answer ([`Self::certain_by_vocabulary`]): a token
    /// is held back where some token could merge it with a byte the recogniser allows next.
    /// That is often too careful, because the tokenizer's pre-tokenizer splits the text
    /// before merging: Llama-3 has `:t`, yet `":` before `true` never becomes `":t`. So where
    /// the vocabulary sees a merge, the tokenizer is asked about the questioned tail (the
    /// tokens from the first one held back): every token that could cross the span's end
    /// (it extends a suffix of the tail, and the recogniser accepts all of its bytes past the
    /// end) gives one continuation, and the tail keeps the tokens that the tokenization of
    /// the tail plus each continuation starts with. A merge needs a token across the end, so
    /// these continuations are all the ways one can form. Where more than
    /// [`MAX_MERGE_PROBES`] continuations exist, the vocabulary's answer stands.
    ///
    /// Two caches keep this off the hot path: per constraint, the answer by (state key after
    /// the span, tail bytes); per vocabulary ([`TokenTable::merge_verdict`]), by the tail
    /// and its continuations, so the tokenizer is asked once about `":"` before a free
    /// string whatever the key and the schema.
    fn certain_tokens(&self, tokens: &[u32], bytes: &[u8], after: &R::State) -> usize {
        let safe = self.certain_by_vocabulary(tokens, bytes, after);
        if safe == tokens.len() {
            return safe;
        }
        let questioned = &tokens[safe..];
        let tail_len: usize = questioned.iter().map(|&t| self.table.token_bytes(t).len()).sum();
        let tail = &bytes[bytes.len() - tail_len.min(bytes.len())..];
        let key = (self.rec.state_key(after), key::of(tail));
        if let Some(kept) = self.cache.tail(key) {
            return safe + kept.min(questioned.len());
        }
        let kept = self.tail_tokens_kept(questioned, tail, after);
        self.cache.insert_tail(key, kept);
        safe + kept
    }

    /// How many of `questioned` (the tokens of the span's `tail`, which ends at `after`) the
    /// tokenizer keeps before every continuation that could merge with them (see
    /// [`Self::certain_tokens`]); 0 when there are too many continuations to ask about.
    fn tail_tokens_kept(&self, questioned: &[u32], tail: &[u8], after: &R::State) -> usize {
        let Some(continuations) = self.merge_continuations(tail, after) else { return 0 };
        let verdict_key = key::mix(key::of(tail), key::of(&continuations));
        if let Some(kept) = self.table.merge_verdict(verdict_key) {
            return kept.min(questioned.len());
        }
        // The tail must tokenise alone as it does in the span, or asking about it alone
        // says nothing about the span.
        let mut kept = if self.table.tokenize(tail) == questioned { questioned.len() } else { 0 };
        let mut probe = tail.to_vec();
        for ext in &continuations {
            if kept == 0 {
                break;
            }
            probe.truncate(tail.len());
            probe.extend_from_slice(ext);
            let retokenized = self.table.tokenize(&probe);
            kept = kept.min(questioned.iter().zip(&retokenized).take_while(|(a, b)| a == b).count());
        }
        self.table.remember_merge_verdict(verdict_key, kept);
        kept
    }

    /// The continuations after `tail` (ending at state `after`) that complete a token
    /// across the end: for each suffix of the tail, the rest of each longer token that starts
    /// with it, where the recogniser accepts that rest. `None` when there are more than
    /// [`MAX_MERGE_PROBES`].
    fn merge_continuations(&self, tail: &[u8], after: &R::State) -> Option<Vec<Vec<u8>>> {
        let trie = self.table.trie();
        let mut out: Vec<Vec<u8>> = Vec::new();
        let mut stack = Vec::new();
        let mut too_many = false;
        for start in 0..tail.len() {
            let suffix = &tail[start..];
            trie.walk_extensions(
                suffix,
                after,
                &mut stack,
                |s, b| self.rec.advance(s, b),
                |t| {
                    let ext = &self.table.token_bytes(t)[suffix.len()..];
                    if !out.iter().any(|e| e.as_slice() == ext) {
                        if out.len() == MAX_MERGE_PROBES {
                            too_many = true;
                            return false;
                        }
                        out.push(ext.to_vec());
                    }
                    true
                },
            );
            if too_many {
                return None;
            }
        }
        Some(out)
    }

    /// [`Self::certain_tokens`] from the vocabulary alone: those before the earliest token
    /// from which the rest of the bytes could merge with a byte the recogniser allows next.
    /// Checked from each token boundary within the longest token's length of the end; the
    /// last token also from inside it (see [`Self::may_merge`]).
    fn certain_by_vocabulary(&self, tokens: &[u32], bytes: &[u8], after: &R::State) -> usize {
        let trie = self.table.trie();
        let reach = trie.max_token_len();
        let mut allowed: [Option<bool>; 256] = [None; 256];
        let mut keep = tokens.len();
        let mut start = bytes.len();
        for (i, &t) in tokens.iter().enumerate().rev() {
            start -= self.table.token_bytes(t).len().min(start);
            if bytes.len() - start > reach {
                break;
            }
            let merges = if i + 1 == tokens.len() {
                self.may_merge(t, after)
            } else {
                let mut merges = false;
                trie.continuations(&bytes[start..], |b| {
                    merges |= *allowed[b as usize].get_or_insert_with(|| self.rec.advance(after, b).is_some());
                });
                merges
            };
            if merges {
                keep = i;
            }
        }
        keep
    }

    /// Whether token `last`, ending at state `after`, could merge with bytes that follow into
    /// another token: some token extends the last token's bytes, or one of their suffixes, by
    /// a byte the recogniser allows next. Where none does, the tokenizer has nothing to merge
    /// it with, so the last token is as canonical as the others and is forced too (the
    /// heuristic llguidance also uses, extended to suffixes for merges that start inside it).
    fn may_merge(&self, last: u32, after: &R::State) -> bool {
        let bytes = self.table.token_bytes(last);
        let trie = self.table.trie();
        let mut allowed: [Option<bool>; 256] = [None; 256];
        let mut merges = false;
        for start in 0..bytes.len() {
            trie.continuations(&bytes[start..], |b| {
                let ok = allowed[b as usize].get_or_insert_with(|| self.rec.advance(after, b).is_some());
                merges |= *ok;
            });
            if merges {
                return true;
            }
        }
        false
    }
}

impl<R: Recognizer> Matcher for RecognizerMatcher<R> {
    fn compute_mask(&mut self) -> Result<Mask, ConstraintError> {
        let key = self.state_key();
        if let Some(mask) = self.cache.get(key) {
            return Ok((*mask).clone());
        }
        let mask = self.allowed_tokens().to_mask();
        self.cache.insert(key, Arc::new(mask.clone()));
        Ok(mask)
    }

    fn commit(&mut self, tokens: &[u32]) -> Result<CommitResult, ConstraintError> {
        let before = self.history.len();
        for (i, &t) in tokens.iter().enumerate() {
            let Some(state) = self.state() else {
                self.history.truncate(before);
                return Err(ConstraintError::new(ErrorCode::InvalidState, "commit after EOS: the sequence has ended"));
            };
            match self.step(state, t) {
                Ok(next) => self.history.push(next),
                Err(mut e) => {
                    self.history.truncate(before);
                    e.message = format!("{} (token {} of {} in this commit)", e.message, i + 1, tokens.len());
                    return Err(e);
                }
            }
        }
        let mut forced = self.forced_tokens();
        // Advance over the span; a tokenizer that disagrees with the forced bytes cuts it.
        for (k, &t) in forced.iter().enumerate() {
            let next = self.state().and_then(|s| self.step(s, t).ok());
            match next {
                Some(next) => self.history.push(next),
                None => {
                    forced.truncate(k);
                    break;
                }
            }
        }
        Ok(CommitResult { forced, stop: self.is_stopped() })
    }

    fn rollback(&mut self, n: u32) -> Result<(), ConstraintError> {
        let n = n as usize;
        if n > self.history.len() {
            return Err(ConstraintError::new(
                ErrorCode::InvalidState,
                format!("cannot roll back {n} tokens: only {} were committed", self.history.len()),
            ));
        }
        self.history.truncate(self.history.len() - n);
        Ok(())
    }

    fn validate_draft(&self, tokens: &[u32]) -> u32 {
        let mut state = self.state().cloned();
        let mut accepted = 0;
        for &t in tokens {
            let Some(s) = &state else { break };
            match self.step(s, t) {
                Ok(Step::Token(next)) => state = Some(next),
                Ok(Step::Eos) => state = None,
                Err(_) => break,
            }
            accepted += 1;
        }
        accepted
    }

    fn fork(&self) -> Box<dyn Matcher> {
        Box::new(self.clone())
    }

    fn is_accepting(&self) -> bool {
        self.state().is_some_and(|s| self.rec.is_accepting(s))
    }

    fn is_stopped(&self) -> bool {
        match self.state() {
            None => true,
            Some(s) => self.rec.is_accepting(s) && !self.rec.can_extend(s),
        }
    }

    fn state_key(&self) -> u64 {
        match self.state() {
            None => key::EOS_KEY,
            Some(s) => self.rec.state_key(s),
        }
    }
}

/// A compiled constraint made of a recogniser: every matcher shares the recogniser and table.
pub struct RecognizerConstraint<R: Recognizer> {
    rec: Arc<R>,
    table: Arc<TokenTable>,
    warnings: Vec<Warning>,
    cache: Arc<MaskCache>,
    walks: Arc<Mutex<StateTable<R::State>>>,
}

impl<R: Recognizer> RecognizerConstraint<R> {
    /// Wraps `rec` for `table`, with the warnings its compilation produced.
    pub fn new(rec: R, table: &Arc<TokenTable>, warnings: Vec<Warning>) -> Arc<Self> {
        Arc::new(Self {
            rec: Arc::new(rec),
            table: table.clone(),
            warnings,
            cache: Arc::default(),
            walks: Arc::default(),
        })
    }

    /// A concrete matcher (for native tests that want [`RecognizerMatcher`]'s extra methods).
    pub fn matcher(&self) -> RecognizerMatcher<R> {
        RecognizerMatcher::with_cache(self.rec.clone(), self.table.clone(), self.cache.clone(), self.walks.clone())
    }
}

impl<R: Recognizer> CompiledConstraint for RecognizerConstraint<R> {
    fn warnings(&self) -> Vec<Warning> {
        self.warnings.clone()
    }

    fn new_matcher(&self) -> Box<dyn Matcher> {
        Box::new(self.matcher())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Tokenize;

    /// Recognises exactly the strings of `words`; state = the prefix so far.
    struct Words(Vec<&'static str>);

    impl Recognizer for Words {
        type State = String;
        fn start(&self) -> String {
            String::new()
        }
        fn advance(&self, s: &String, b: u8) -> Option<String> {
            let mut n = s.clone();
            n.push(b as char);
            self.0.iter().any(|w| w.starts_with(n.as_str())).then_some(n)
        }
        fn is_accepting(&self, s: &String) -> bool {
            self.0.contains(&s.as_str())
        }
        fn state_key(&self, s: &String) -> u64 {
            key::of(s)
        }
    }

    fn setup() -> (Arc<TokenTable>, Arc<RecognizerConstraint<Words>>) {
        let table = Arc::new(TokenTable::byte_level_for_tests(&["he", "hel", "llo", "help", "lo"]));
        let c = RecognizerConstraint::new(Words(vec!["hello", "help"]), &table, vec![]);
        (table, c)
    }

    #[test]
    fn mask_allows_exactly_the_tokens_that_keep_a_match_possible() {
        let (table, c) = setup();
        let mut m = c.matcher();
        let allowed: Vec<u32> = m.allowed_tokens().iter().collect();
        let he = 256;
        let hel = 257;
        let help = 259;
        assert_eq!(allowed, vec![b'h' as u32, he, hel, help]);
        let eos = table.eos_tokens()[0];
        assert!(!m.allowed_tokens().contains(eos));
    }

    #[test]
    fn a_forced_tail_that_could_merge_over_two_tokens_is_held_back() {
        // "abcde" is forced, then `x` or `y`; "cd" + "e" + "x" is the token "cdex", so the
        // tokenizer's choice for "cde" depends on what follows: only "ab" is certain.
        let table = Arc::new(TokenTable::byte_level_for_tests(&["ab", "cd", "cdex"]));
        let c = RecognizerConstraint::new(Words(vec!["abcdex", "abcdey"]), &table, vec![]);
        let mut m = c.matcher();
        let r = m.commit(&[]).unwrap();
        assert_eq!(r.forced, vec![256], "only `ab` is forced");
        // Without such a token, the whole span is forced ("e" merges with nothing).
        let table = Arc::new(TokenTable::byte_level_for_tests(&["ab", "cd"]));
        let c = RecognizerConstraint::new(Words(vec!["abcdex", "abcdey"]), &table, vec![]);
        let r = c.matcher().commit(&[]).unwrap();
        assert_eq!(r.forced, vec![256, 257, b'e' as u32]);
    }

    /// A table over `extra` tokenised by `tokenize` (given the table's greedy tokenizer).
    fn table_with(extra: &[&str], tokenize: fn(&TokenTable, &[u8]) -> Vec<u32>) -> Arc<TokenTable> {
        let greedy = Arc::new(TokenTable::byte_level_for_tests(extra));
        let inner = greedy.clone();
        Arc::new(
            TokenTable::byte_level_for_tests(extra)
                .with_tokenize(Tokenize::Custom(Arc::new(move |text| tokenize(&inner, text)))),
        )
    }

    #[test]
    fn a_tail_the_tokenizer_never_merges_is_forced_though_the_vocabulary_could() {
        // `":` is forced, then `true` or `false`. The vocabulary has `:t`, so `:` could merge
        // with the `t` that follows; a pre-tokenizer that splits punctuation from letters (as
        // Llama-3's does) never lets it, and then `":` is certain.
        let words = || Words(vec!["\":true", "\":false"]);
        let vocab = ["\":", ":t", "true", "false"];
        let pre_split = |t: &TokenTable, text: &[u8]| {
            let cut = text.iter().position(|b| b.is_ascii_alphabetic()).unwrap_or(text.len());
            let mut out = t.tokenize_greedy(&text[..cut]);
            out.extend(t.tokenize_greedy(&text[cut..]));
            out
        };
        let table = table_with(&vocab, pre_split);
        let c = RecognizerConstraint::new(words(), &table, vec![]);
        let quote_colon = 256;
        assert_eq!(c.matcher().commit(&[]).unwrap().forced, vec![quote_colon]);
        // A tokenizer that does merge `:t` (the first `:` followed by `t` becomes `:t`) keeps it
        // back: it would write `"` `:t` `rue`.
        let merging = |t: &TokenTable, text: &[u8]| match text.windows(2).position(|w| w == b":t") {
            Some(at) => {
                let mut out = t.tokenize_greedy(&text[..at]);
                out.push(257);
                out.extend(t.tokenize_greedy(&text[at + 2..]));
                out
            }
            None => t.tokenize_greedy(text),
        };
        let table = table_with(&vocab, merging);
        let c = RecognizerConstraint::new(words(), &table, vec![]);
        assert_eq!(c.matcher().commit(&[]).unwrap().forced, Vec::<u32>::new());
    }

    #[test]
    fn commit_returns_the_forced_span_and_holds_back_nothing_at_the_end() {
        let (table, c) = setup();
        let mut m = c.matcher();
        // After "h" the only continuation is "el" (forced); "hel" then branches (l|p).
        let r = m.commit(&[b'h' as u32]).unwrap();
        assert_eq!(r.forced, vec![b'e' as u32], "the greedy span 'el' holds back its last token");
        assert!(!r.stop);
        let r = m.commit(&[b'l' as u32]).unwrap();
        assert!(r.forced.is_empty(), "after 'hel' both 'l' and 'p' are possible");
        let r = m.commit(&[b'l' as u32]).unwrap();
        // "hell" -> only "o" can follow and then nothing: the whole span is kept, and stop.
        assert_eq!(r.forced, vec![b'o' as u32]);
        assert!(r.stop && m.is_accepting() && m.is_stopped());
        assert_eq!(m.compute_mask().unwrap(), Mask::Allow(table.eos_tokens().to_vec()));
        m.commit(&table.eos_tokens()[..1]).unwrap();
        assert_eq!(m.compute_mask().unwrap(), Mask::Allow(vec![]));
        assert_eq!(m.commit(&[b'x' as u32]).unwrap_err().code, ErrorCode::InvalidState);
    }

    #[test]
    fn rejected_commit_leaves_the_matcher_unchanged_and_rollback_restores_keys() {
        let (_table, c) = setup();
        let mut m = c.matcher();
        let k0 = m.state_key();
        let err = m.commit(&[b'h' as u32, b'x' as u32]).unwrap_err();
        assert_eq!(err.code, ErrorCode::RejectedToken);
        assert_eq!(m.len(), 0);
        let r = m.commit(&[b'h' as u32]).unwrap();
        m.rollback(1 + r.forced.len() as u32).unwrap();
        assert_eq!(m.state_key(), k0);
        assert_eq!(m.rollback(1).unwrap_err().code, ErrorCode::InvalidState);
    }

    #[test]
    fn drafts_and_forks_are_independent() {
        let (_table, c) = setup();
        let m = c.matcher();
        assert_eq!(m.validate_draft(&[b'h' as u32, b'e' as u32, b'x' as u32]), 2);
        assert_eq!(m.len(), 0);
        let mut f = m.fork();
        f.commit(&[259]).unwrap();
        assert!(f.is_accepting() && !m.is_accepting());
    }
}
