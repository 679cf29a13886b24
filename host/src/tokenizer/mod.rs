//! The tokenizer as plugins see it: a byte table of the vocabulary ([`TokenTable`]) and the
//! canonical tokenisation of byte strings ([`CanonicalTokenizer`]), built from a Hugging Face
//! `tokenizer.json` with the `tokenizers` crate.
//!
//! Token bytes: byte-level BPE vocabularies (GPT-2, Llama-3, Qwen2, DeepSeek-V3, SmolLM2)
//! store tokens through the GPT-2 byte-to-unicode map, which is inverted here; SentencePiece
//! vocabularies use `▁` for a space and `<0xNN>` for raw bytes. Added tokens marked special
//! are control tokens: they never match text. EOS ids come from the caller (the GGUF
//! metadata) or, for a bare `tokenizer.json`, from the well-known end-of-text names.
//!
//! [`gguf`] loads a model's tokenizer ([`ModelTokenizer`]) from its GGUF file or a
//! `tokenizer.json` beside it, with the facts the engine needs around it (EOS ids, the chat
//! template).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use tokenizers::Tokenizer;

use crate::plugin::bindings_types::WitTokenTable;

pub mod gguf;

pub use gguf::ModelTokenizer;

/// Turns bytes into the token ids the model's tokenizer would produce for them.
pub trait CanonicalTokenizer: Send + Sync + 'static {
    /// The canonical tokens of `text` (no special tokens added).
    fn tokenize(&self, text: &[u8]) -> Vec<u32>;
}

/// A tokenizer that knows nothing; used only where no call can reach it (probing a
/// component's kinds).
pub(crate) struct NoTokenizer;

impl CanonicalTokenizer for NoTokenizer {
    fn tokenize(&self, _text: &[u8]) -> Vec<u32> {
        Vec::new()
    }
}

/// The vocabulary in the contract's layout.
#[derive(Clone, Debug)]
pub struct TokenTable {
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    special: Vec<u32>,
    eos: Vec<u32>,
}

impl TokenTable {
    /// A table from token byte strings (id = position), special ids and EOS ids.
    pub fn new(tokens: &[Vec<u8>], special: Vec<u32>, eos: Vec<u32>) -> anyhow::Result<Self> {
        let vocab = tokens.len();
        if let Some(bad) = special.iter().chain(&eos).find(|&&t| t as usize >= vocab) {
            bail!("special/EOS token id {bad} is outside the vocabulary of {vocab}");
        }
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(vocab + 1);
        offsets.push(0u32);
        for t in tokens {
            bytes.extend_from_slice(t);
            offsets.push(u32::try_from(bytes.len()).context("the vocabulary's bytes exceed 4 GiB")?);
        }
        Ok(Self { bytes, offsets, special, eos })
    }

    /// The number of token ids.
    pub fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The bytes of `token`.
    pub fn token_bytes(&self, token: u32) -> &[u8] {
        let i = token as usize;
        if i + 1 >= self.offsets.len() {
            return &[];
        }
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }

    /// The EOS ids.
    pub fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }

    /// The special ids (EOS not necessarily included).
    pub fn special_tokens(&self) -> &[u32] {
        &self.special
    }

    /// Whether `token` is special or EOS.
    pub fn is_special(&self, token: u32) -> bool {
        self.special.contains(&token) || self.eos.contains(&token)
    }

    pub(crate) fn to_wit(&self) -> WitTokenTable {
        WitTokenTable {
            token_bytes: self.bytes.clone(),
            token_offsets: self.offsets.clone(),
            special_tokens: self.special.clone(),
            eos_tokens: self.eos.clone(),
        }
    }
}

/// Names of end-of-sequence tokens in common vocabularies, used when the caller gives none.
pub const WELL_KNOWN_EOS: &[&str] = &[
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|endoftext|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
    "<|end|>",
];

/// A Hugging Face tokenizer with its byte table.
pub struct HfTokenizer {
    tokenizer: Tokenizer,
    table: Arc<TokenTable>,
}

impl HfTokenizer {
    /// Loads `tokenizer.json`. `eos` overrides the EOS ids; when `None`, every token named in
    /// [`WELL_KNOWN_EOS`] that the vocabulary has is an EOS.
    pub fn from_file(path: &Path, eos: Option<Vec<u32>>) -> anyhow::Result<Self> {
        let tokenizer = Tokenizer::from_file(path)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("cannot load the tokenizer {}", path.display()))?;
        Self::new(tokenizer, eos)
    }

    /// Wraps a loaded tokenizer.
    pub fn new(tokenizer: Tokenizer, eos: Option<Vec<u32>>) -> anyhow::Result<Self> {
        let vocab = tokenizer.get_vocab(true);
        let size = vocab.values().copied().max().map_or(0, |m| m as usize + 1);
        let byte_level = vocab.keys().any(|k| k.starts_with('Ġ') || k.starts_with('Ċ'));
        let decode_byte_level = byte_level_decoder();
        let mut tokens: Vec<Vec<u8>> = vec![Vec::new(); size];
        for (text, &id) in &vocab {
            tokens[id as usize] = if byte_level {
                text.chars()
                    .map(|c| decode_byte_level.get(&c).copied())
                    .collect::<Option<Vec<u8>>>()
                    .unwrap_or_else(|| text.as_bytes().to_vec())
            } else {
                sentencepiece_bytes(text)
            };
        }
        let mut special = Vec::new();
        for (id, added) in tokenizer.get_added_tokens_decoder() {
            if (id as usize) < size {
                if added.special {
                    special.push(id);
                }
                // Added tokens are stored as plain text, not through the byte map.
                tokens[id as usize] = added.content.as_bytes().to_vec();
            }
        }
        special.sort_unstable();
        let eos = match eos {
            Some(e) => e,
            None => WELL_KNOWN_EOS.iter().filter_map(|n| vocab.get(*n).copied()).collect(),
        };
        let table = Arc::new(TokenTable::new(&tokens, special, eos)?);
        Ok(Self { tokenizer, table })
    }

    /// The byte table plugins get.
    pub fn table(&self) -> &Arc<TokenTable> {
        &self.table
    }

    /// The underlying tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Greedy longest-match tokenisation over the byte table: the fallback for byte strings
    /// that are not UTF-8 (the `tokenizers` crate takes `&str`).
    fn greedy(&self, text: &[u8]) -> Vec<u32> {
        let mut by_bytes: HashMap<&[u8], u32> = HashMap::new();
        let mut max_len = 0;
        for id in 0..self.table.vocab_size() as u32 {
            let b = self.table.token_bytes(id);
            if !b.is_empty() && !self.table.is_special(id) {
                by_bytes.entry(b).or_insert(id);
                max_len = max_len.max(b.len());
            }
        }
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < text.len() {
            let longest = (1..=max_len.min(text.len() - pos))
                .rev()
                .find_map(|l| by_bytes.get(&text[pos..pos + l]).map(|&id| (id, l)));
            match longest {
                Some((id, l)) => {
                    out.push(id);
                    pos += l;
                }
                None => pos += 1,
            }
        }
        out
    }
}

impl CanonicalTokenizer for HfTokenizer {
    fn tokenize(&self, text: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(text) {
            Ok(s) => match self.tokenizer.encode(s, false) {
                Ok(enc) => enc.get_ids().to_vec(),
                Err(_) => self.greedy(text),
            },
            Err(_) => self.greedy(text),
        }
    }
}

/// The inverse of GPT-2's byte-to-unicode map.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + n);
            n += 1;
        }
    }
    printable.into_iter().zip(chars).filter_map(|(b, c)| char::from_u32(c).map(|c| (c, b as u8))).collect()
}

/// SentencePiece token text to bytes: `▁` is a space, `<0xNN>` a raw byte.
fn sentencepiece_bytes(text: &str) -> Vec<u8> {
    if text.len() == 6
        && text.starts_with("<0x")
        && text.ends_with('>')
        && let Ok(b) = u8::from_str_radix(&text[3..5], 16)
    {
        return vec![b];
    }
    text.replace('▁', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_map_inverts_gpt2() {
        let d = byte_level_decoder();
        assert_eq!(d.len(), 256);
        assert_eq!(d[&'Ġ'], b' ');
        assert_eq!(d[&'Ċ'], b'\n');
        assert_eq!(d[&'a'], b'a');
    }

    #[test]
    fn sentencepiece_bytes_decode() {
        assert_eq!(sentencepiece_bytes("▁the"), b" the");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
    }

    #[test]
    fn table_offsets_and_specials() {
        let t = TokenTable::new(&[b"a".to_vec(), b"bc".to_vec(), b"<s>".to_vec()], vec![2], vec![2]).unwrap();
        assert_eq!(t.vocab_size(), 3);
        assert_eq!(t.token_bytes(1), b"bc");
        assert!(t.is_special(2) && !t.is_special(0));
        assert!(TokenTable::new(&[b"a".to_vec()], vec![], vec![5]).is_err());
    }
}
