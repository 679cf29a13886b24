//! [`TokenTable`]: the tokenizer's vocabulary as the host gives it to a plugin, with the token
//! trie built over it and the canonical tokenisation used for forced spans.

use std::fmt;
use std::sync::Arc;

use crate::bitset::TokenSet;
use crate::error::{ConstraintError, ErrorCode};
use crate::trie::TokenTrie;

/// A tokenisation function supplied by native tests.
pub type TokenizeFn = Arc<dyn Fn(&[u8]) -> Vec<u32> + Send + Sync>;

/// How forced bytes are turned into tokens.
#[derive(Clone)]
pub enum Tokenize {
    /// Longest match through the token trie: always a valid tokenisation, not always the one a
    /// BPE tokenizer would produce. The native default.
    Greedy,
    /// A tokenizer supplied by native tests.
    Custom(TokenizeFn),
}

/// The vocabulary: bytes of every token, special tokens, EOS tokens, and the trie over the
/// tokens that match text.
pub struct TokenTable {
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    special: TokenSet,
    eos: Vec<u32>,
    trie: TokenTrie,
    tokenize: Tokenize,
    /// [`Self::by_char_count`], made on first use.
    by_chars: std::sync::OnceLock<Vec<(u32, u32)>>,
    /// What the tokenizer said about forced-span tails ([`Self::merge_verdict`]).
    merge_verdicts: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
}

impl fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenTable").field("vocab_size", &self.vocab_size()).field("eos", &self.eos).finish()
    }
}

impl TokenTable {
    /// Builds a table from the contract's layout, checking it: `offsets` has `vocab + 1`
    /// non-decreasing entries ending at `bytes.len()`, and every special/EOS id is in range.
    pub fn new(
        bytes: Vec<u8>,
        offsets: Vec<u32>,
        special_tokens: &[u32],
        eos_tokens: &[u32],
    ) -> Result<Self, ConstraintError> {
        let bad = |m: String| ConstraintError::new(ErrorCode::InvalidState, m);
        if offsets.is_empty() || offsets[0] != 0 {
            return Err(bad("token-offsets must start with 0".into()));
        }
        if offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(bad("token-offsets must be non-decreasing".into()));
        }
        if *offsets.last().unwrap_or(&0) as usize != bytes.len() {
            return Err(bad(format!(
                "the last token offset ({}) must equal the length of token-bytes ({})",
                offsets.last().unwrap_or(&0),
                bytes.len()
            )));
        }
        let vocab = offsets.len() - 1;
        let mut special = TokenSet::new(vocab);
        for &t in special_tokens.iter().chain(eos_tokens) {
            if t as usize >= vocab {
                return Err(bad(format!("special/EOS token id {t} is outside the vocabulary of {vocab}")));
            }
            special.insert(t);
        }
        let trie = TokenTrie::build_indexed(vocab, |id| {
            let (s, e) = (offsets[id] as usize, offsets[id + 1] as usize);
            if special.contains(id as u32) { &[][..] } else { &bytes[s..e] }
        });
        Ok(Self {
            bytes,
            offsets,
            special,
            eos: eos_tokens.to_vec(),
            trie,
            tokenize: Tokenize::Greedy,
            by_chars: std::sync::OnceLock::new(),
            merge_verdicts: Default::default(),
        })
    }

    /// A table from a list of token byte strings (id = position); for native tests.
    pub fn from_tokens<B: AsRef<[u8]>>(tokens: &[B], special_tokens: &[u32], eos_tokens: &[u32]) -> Self {
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for t in tokens {
            bytes.extend_from_slice(t.as_ref());
            offsets.push(bytes.len() as u32);
        }
        let mut table = Self::new(bytes, offsets, special_tokens, eos_tokens)
            .unwrap_or_else(|e| panic!("from_tokens: invalid test table: {e}"));
        table.tokenize = Tokenize::Greedy;
        table
    }

    /// A small byte-level test vocabulary: the 256 single bytes (ids 0..256), then `extra`
    /// multi-byte tokens, then an EOS token `<eos>` (special) as the last id.
    pub fn byte_level_for_tests(extra: &[&str]) -> Self {
        let mut tokens: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        tokens.extend(extra.iter().map(|s| s.as_bytes().to_vec()));
        tokens.push(b"<eos>".to_vec());
        let eos = tokens.len() as u32 - 1;
        Self::from_tokens(&tokens, &[], &[eos])
    }

    /// Replaces the tokenisation used for forced spans.
    pub fn with_tokenize(mut self, tokenize: Tokenize) -> Self {
        self.tokenize = tokenize;
        self.merge_verdicts = Default::default();
        self
    }

    /// The number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The bytes of `token` (empty for ids out of range).
    #[inline]
    pub fn token_bytes(&self, token: u32) -> &[u8] {
        let i = token as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// Whether `token` is special (never matches text).
    #[inline]
    pub fn is_special(&self, token: u32) -> bool {
        self.special.contains(token)
    }

    /// The EOS token ids.
    pub fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }

    /// Whether `token` ends a sequence.
    #[inline]
    pub fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }

    /// The trie over the non-special tokens.
    pub fn trie(&self) -> &TokenTrie {
        &self.trie
    }

    /// Every token as (characters, id), most characters first: a token's characters are its
    /// bytes that start a UTF-8 character (what a length bound counts). For constraints that
    /// must treat the few long tokens apart; computed once per table.
    pub fn by_char_count(&self) -> &[(u32, u32)] {
        self.by_chars.get_or_init(|| {
            let mut by_chars: Vec<(u32, u32)> = (0..self.vocab_size() as u32)
                .map(|t| (self.token_bytes(t).iter().filter(|&&b| b & 0xC0 != 0x80).count() as u32, t))
                .collect();
            by_chars.sort_unstable_by(|a, b| b.cmp(a));
            by_chars
        })
    }

    /// Tokenises `text` the canonical way (see [`Tokenize`]).
    pub fn tokenize(&self, text: &[u8]) -> Vec<u32> {
        match &self.tokenize {
            Tokenize::Custom(f) => f(text),
            Tokenize::Greedy => self.tokenize_greedy(text),
        }
    }

    /// What this table's tokenizer was found to do with a forced span's tail before a set of
    /// continuations (the SDK's recogniser matcher asks it, keyed by a hash of both): how
    /// many of the tail's tokens it keeps whichever follows. A cache for every constraint of
    /// the vocabulary, since the answer depends on the tokenizer and those bytes only.
    pub fn merge_verdict(&self, key: u64) -> Option<usize> {
        self.merge_verdicts.lock().unwrap_or_else(|p| p.into_inner()).get(&key).copied()
    }

    /// Records a [`Self::merge_verdict`] (the cache is cleared past 65,536 entries).
    pub fn remember_merge_verdict(&self, key: u64, kept: usize) {
        let mut verdicts = self.merge_verdicts.lock().unwrap_or_else(|p| p.into_inner());
        if verdicts.len() >= 1 << 16 {
            verdicts.clear();
        }
        verdicts.insert(key, kept);
    }

    /// Longest-match tokenisation through the trie. Bytes that no token covers are skipped.
    pub fn tokenize_greedy(&self, text: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < text.len() {
            match self.trie.longest_prefix(&text[pos..]) {
                Some((token, len)) => {
                    out.push(token);
                    pos += len;
                }
                None => pos += 1,
            }
        }
        out
    }
}
