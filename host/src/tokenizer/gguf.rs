//! The model's tokenizer: from a `tokenizer.json` beside the GGUF file when there is one,
//! otherwise rebuilt from the GGUF metadata (`tokenizer.ggml.*`).
//!
//! Only byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`, which covers Llama-3,
//! Qwen2, SmolLM2, DeepSeek) can be rebuilt from metadata: the vocabulary and merges become a
//! `tokenizers` BPE model, the pre-tokeniser is chosen by `tokenizer.ggml.pre` (the same
//! regular expressions llama.cpp and the original `tokenizer.json` files use), control tokens
//! (`token_type` 3) become special added tokens and user-defined ones (4) plain added tokens.
//! A SentencePiece GGUF needs its `tokenizer.json` beside it; the error says so.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use super::{HfTokenizer, WELL_KNOWN_EOS};
use crate::engine::chat::ChatTemplate;
use crate::engine::gguf::GgufFile;

/// GPT-2's pre-tokeniser expression.
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama-3's: case-insensitive contractions, digits in groups of up to three.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's: as Llama-3's with single digits.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer of a model with the facts the engine needs around it.
pub struct ModelTokenizer {
    /// The tokenizer and its byte table.
    pub tokenizer: Arc<HfTokenizer>,
    /// The BOS token, if the vocabulary has one.
    pub bos: Option<u32>,
    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
    /// Tokens that end generation.
    pub eos: Vec<u32>,
    /// The Jinja chat template, if the file has one.
    pub chat_template: Option<String>,
}

impl ModelTokenizer {
    /// Loads the tokenizer for the model at `model_path` whose header is `file`.
    pub fn load(model_path: &Path, file: &GgufFile) -> anyhow::Result<Self> {
        let eos = eos_tokens(file)?;
        let beside = model_path.with_file_name("tokenizer.json");
        let tokenizer = if beside.is_file() {
            HfTokenizer::from_file(&beside, eos.clone())?
        } else {
            HfTokenizer::new(from_metadata(file)?, eos.clone())?
        };
        let eos = tokenizer.table().eos_tokens().to_vec();
        let bos = file.opt_u32("tokenizer.ggml.bos_token_id")?;
        Ok(Self {
            tokenizer: Arc::new(tokenizer),
            bos,
            add_bos: file.opt_bool("tokenizer.ggml.add_bos_token").unwrap_or(false) && bos.is_some(),
            eos,
            chat_template: file.string("tokenizer.chat_template").ok().map(str::to_string),
        })
    }

    /// Token ids of `text`, with BOS first when the model wants it. Special tokens written in
    /// the text (e.g. `<|im_start|>` from a chat template) are recognised.
    pub fn encode(&self, text: &str) -> anyhow::Result<Vec<u32>> {
        let encoding = self.tokenizer.inner().encode(text, false).map_err(|e| anyhow!("tokenizer: {e}"))?;
        let mut ids = Vec::with_capacity(encoding.len() + 1);
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(encoding.get_ids());
        Ok(ids)
    }

    /// The model's chat template compiled with its BOS and EOS strings, if it has one.
    pub fn compile_chat_template(&self) -> Option<anyhow::Result<ChatTemplate>> {
        let source = self.chat_template.as_deref()?;
        let bos = self.bos.map(|b| self.token_text(b)).unwrap_or_default();
        let eos = self.eos.first().map(|&e| self.token_text(e)).unwrap_or_default();
        Some(ChatTemplate::new(source, &bos, &eos))
    }

    /// The text of a token id, as the vocabulary spells it (for logs and `--verbose`).
    pub fn token_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.tokenizer.table().token_bytes(id)).into_owned()
    }
}

/// EOS ids: the file's `eos`, `eot` and `eom` ids plus the well-known end-of-text tokens of
/// the vocabulary (an instruct model may end with either `<|im_end|>` or `<|endoftext|>`).
fn eos_tokens(file: &GgufFile) -> anyhow::Result<Option<Vec<u32>>> {
    let mut eos = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        eos.extend(file.opt_u32(key)?);
    }
    if let Ok(tokens) = file.strings("tokenizer.ggml.tokens") {
        for (id, token) in tokens.iter().enumerate() {
            if WELL_KNOWN_EOS.contains(token) {
                eos.push(id as u32);
            }
        }
    }
    eos.sort_unstable();
    eos.dedup();
    Ok(if eos.is_empty() { None } else { Some(eos) })
}

/// Builds a byte-level BPE tokenizer from `tokenizer.ggml.*`.
pub fn from_metadata(file: &GgufFile) -> anyhow::Result<Tokenizer> {
    let model = file.string("tokenizer.ggml.model")?;
    if model != "gpt2" {
        bail!(
            "{}: tokenizer model `{model}` cannot be rebuilt from GGUF metadata; put the model's \
             tokenizer.json beside the GGUF file",
            file.path().display()
        );
    }
    let tokens = file.strings("tokenizer.ggml.tokens")?;
    let merges = file.strings("tokenizer.ggml.merges")?;
    let types = file.opt_integers("tokenizer.ggml.token_type")?.unwrap_or_default();
    let pre = file.string("tokenizer.ggml.pre").unwrap_or("default");

    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, token) in tokens.iter().enumerate() {
        if !vocab.contains_key(*token) {
            vocab.insert(token.to_string(), json!(id));
        }
        match types.get(id) {
            Some(3) | Some(4) => added.push(json!({
                "id": id, "content": token, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": types.get(id) == Some(&3),
            })),
            _ => {}
        }
    }
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    let (pre_tokenizer, ignore_merges): (Value, bool) = match pre {
        "llama-bpe" | "llama3" | "llama-v3" => {
            (json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_PATTERN), byte_level(false)]}), true)
        }
        "qwen2" | "deepseek-r1-qwen" => {
            (json!({"type": "Sequence", "pretokenizers": [split(QWEN2_PATTERN), byte_level(false)]}), false)
        }
        "smollm" | "starcoder" => (
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, split(GPT2_PATTERN), byte_level(false)]}),
            false,
        ),
        "gpt2" | "default" => {
            (json!({"type": "Sequence", "pretokenizers": [split(GPT2_PATTERN), byte_level(false)]}), false)
        }
        other => bail!(
            "{}: pre-tokenizer `{other}` is not known; put the model's tokenizer.json beside the GGUF file",
            file.path().display()
        ),
    };
    let document = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges,
        },
    });
    let text = serde_json::to_string(&document)?;
    text.parse::<Tokenizer>()
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("{}: cannot build a tokenizer from its metadata", file.path().display()))
}
