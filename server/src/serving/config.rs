//! Model entries: GPUStack `kind: Model` documents (one YAML document per entry) or a single
//! entry from the command line.
//!
//! ```yaml
//! apiVersion: gpustack.gg/v1alpha1
//! kind: Model
//! metadata:
//!   name: smollm2-dspark
//! spec:
//!   source: file:assets/SmolLM2-135M-Instruct.Q4_1.gguf   # or a plain path, or local_path:
//!   engine: dspark                                         # or backend: dspark
//!   replicas: 1
//!   config:
//!     dspark: true            # the one-line switch (default true)
//!     max_num_seqs: 16
//!     max_model_len: 4096
//!     sampling: {temperature: 0.7, top_p: 0.9, max_tokens: 512}
//!   backend_parameters: ["--max-num-seqs=8"]              # GPUStack style, same keys
//! ```
//!
//! Relative paths are relative to the config file's folder. Unknown keys in `config` are
//! errors naming the entry and the key, so a typo never silently falls back to a default.
//! `backend_parameters` accept the `config` keys as `--key=value` or `--key value` flags
//! (dashes or underscores), as GPUStack passes them to custom backends.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use serde::Deserialize;
use serde_json::Value;

use dspark_host::engine::backend::KvDtype;
use dspark_host::engine::{EngineConfig, PromptLookup};

use crate::openai::request::SamplingDefaults;

/// The most tokens prompt lookup may draft per step: each costs a row of compute.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// One served model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEntry {
    /// The name clients put in `model`.
    pub name: String,
    /// The GGUF file.
    pub path: PathBuf,
    /// Engine and DSpark settings.
    pub config: EntryConfig,
}

/// `spec.config` of an entry.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntryConfig {
    /// DSpark on (path tree, fast-forward, overlapped masks) or the classic path.
    #[serde(default = "yes")]
    pub dspark: bool,
    /// Sequences running at once.
    #[serde(default = "default_max_num_seqs")]
    pub max_num_seqs: usize,
    /// Longest sequence; default: the model's context length, at most 4096.
    pub max_model_len: Option<usize>,
    /// Tokens per forward pass.
    #[serde(default = "default_batched_tokens")]
    pub max_num_batched_tokens: usize,
    /// KV cache size in tokens (default: max_num_seqs x max_model_len within 2 GiB).
    pub kv_cache_tokens: Option<usize>,
    /// Share KV blocks of common prefixes.
    #[serde(default = "yes")]
    pub prefix_caching: bool,
    /// Requests admitted at once (running plus queued) before 429.
    #[serde(default = "default_max_queue")]
    pub max_queue: usize,
    /// Defaults for sampling parameters a request leaves out.
    #[serde(default)]
    pub sampling: SamplingDefaults,
    /// Compute every row as if it were alone (no dense batch path, K-quants row by row), so
    /// greedy answers do not depend on what else is in the batch, nor on whether forced
    /// tokens came as a fast-forward chunk or one per step (vLLM's batch-invariant mode).
    /// Costs prefill and large-batch speed.
    #[serde(default)]
    pub batch_invariant: bool,
    /// With `dspark`, feed the token the path tree expects next (the one taken from the same
    /// constraint state the last times) as one more row of a sequence's step, and keep it if
    /// sampling draws it: a step saved when right, one row of compute lost when wrong.
    /// Outputs are the same either way.
    #[serde(default = "yes")]
    pub speculate: bool,
    /// With `dspark`, compute a constrained row's logits only where its mask allows tokens
    /// (the output projection waits for the mask, which overlaps the rest of the pass).
    /// Outputs are the same either way.
    #[serde(default = "yes")]
    pub masked_logits: bool,
    /// Prompt lookup (vLLM's `ngram` speculative method): per step, draft up to this many
    /// tokens from what followed the sequence's last tokens where they occurred before in its
    /// prompt or output (an extraction answer copies ids and names from its prompt), feed
    /// them as more rows and keep those sampling draws. Outputs are the same either way.
    /// `0` is off; unset: 1 with `dspark` and `speculate` ([`PromptLookup`]'s default), off
    /// without, so `dspark: false` stays the classic path. Drafts ride only in steps that
    /// sample one sequence: on two CPU cores an extra row costs about a third of a decode
    /// step, which drawn drafts repay with one sequence running and not with four
    /// (measured with `dspark bench`).
    pub num_speculative_tokens: Option<usize>,
    /// The longest suffix prompt lookup matches.
    #[serde(default = "default_prompt_lookup_max")]
    pub prompt_lookup_max: usize,
    /// The shortest suffix prompt lookup matches (at least 1).
    #[serde(default = "default_prompt_lookup_min")]
    pub prompt_lookup_min: usize,
    /// With prompt lookup on, a request drafts by it in any step, not only in steps that
    /// sample one request, once this many of its sampled tokens in a row were what lookup
    /// proposed (checked without feeding rows): a request looping on repeated text then
    /// keeps pace beside requests that fast-forward. `0` is never. Outputs are the same
    /// either way.
    #[serde(default = "default_confident_lookup_hits")]
    pub confident_lookup_hits: usize,
    /// With `dspark`, while an unconstrained request is decoding, the most rows beyond one
    /// per request that constrained requests get per step in total (fast-forward chunks,
    /// fed over several steps when they do not fit, and drafts). Each extra row slows the
    /// whole step on a CPU, so the default, 0, keeps unconstrained requests as fast beside
    /// constrained ones as beside each other; with only constrained requests running there
    /// is no limit. Raise it where extra rows are cheap (a GPU).
    #[serde(default)]
    pub extra_rows_beside_unconstrained: usize,
    /// The KV cache's element type: `auto` (the default: `bf16` where the CPU has AVX-512
    /// BF16, whose dot products make attention about 1.6x faster, `f16` elsewhere), `f16`,
    /// `bf16`, `f32` (twice the memory; with it the engine reproduces candle-transformers'
    /// models bit for bit) or `int8` (bytes with a scale per 32 elements, llama.cpp's `q8_0`
    /// cache: a little over half the memory of the 2-byte types, 8-bit rounding). As vLLM's
    /// `--kv-cache-dtype`.
    #[serde(default)]
    pub kv_cache_dtype: KvCacheDtype,
}

/// `kv_cache_dtype` of an entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// The fastest 2-byte type on this CPU ([`KvDtype::fastest`]).
    #[default]
    Auto,
    /// Half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// Single precision.
    F32,
    /// Signed bytes with a scale per 32 elements (llama.cpp's `q8_0` cache type): a little over
    /// half the memory of the 2-byte types.
    Int8,
}

impl KvCacheDtype {
    /// The engine's element type.
    pub fn resolve(self) -> KvDtype {
        match self {
            KvCacheDtype::Auto => KvDtype::fastest(),
            KvCacheDtype::F16 => KvDtype::F16,
            KvCacheDtype::Bf16 => KvDtype::Bf16,
            KvCacheDtype::F32 => KvDtype::F32,
            KvCacheDtype::Int8 => KvDtype::Int8,
        }
    }
}

fn yes() -> bool {
    true
}
fn default_max_num_seqs() -> usize {
    16
}
fn default_batched_tokens() -> usize {
    512
}
fn default_max_queue() -> usize {
    256
}
fn default_prompt_lookup_max() -> usize {
    PromptLookup::default().max_ngram
}
fn default_prompt_lookup_min() -> usize {
    PromptLookup::default().min_ngram
}
fn default_confident_lookup_hits() -> usize {
    EngineConfig::default().confident_lookup_hits.unwrap_or(0)
}

impl EntryConfig {
    /// Checks the values serde cannot: positive limits, a sane prompt-lookup window.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.max_num_seqs == 0 || self.max_num_batched_tokens == 0 || self.max_queue == 0 {
            bail!("spec.config: max_num_seqs, max_num_batched_tokens and max_queue must be positive");
        }
        if self.prompt_lookup_min == 0 || self.prompt_lookup_max < self.prompt_lookup_min {
            bail!(
                "spec.config: prompt_lookup_min ({}) must be at least 1 and at most prompt_lookup_max ({})",
                self.prompt_lookup_min,
                self.prompt_lookup_max
            );
        }
        if self.num_speculative_tokens.is_some_and(|n| n > MAX_SPECULATIVE_TOKENS) {
            bail!("spec.config: num_speculative_tokens must be at most {MAX_SPECULATIVE_TOKENS}");
        }
        Ok(())
    }

    /// The prompt-lookup settings this entry asks for (see
    /// [`EntryConfig::num_speculative_tokens`]), `None` when off.
    pub fn prompt_lookup(&self) -> Option<PromptLookup> {
        let default = if self.dspark && self.speculate { PromptLookup::default().max_draft } else { 0 };
        let max_draft = self.num_speculative_tokens.unwrap_or(default);
        (max_draft > 0).then_some(PromptLookup {
            max_draft,
            max_ngram: self.prompt_lookup_max,
            min_ngram: self.prompt_lookup_min,
        })
    }

    /// [`EntryConfig::confident_lookup_hits`] for the engine: `None` when `0`.
    pub fn confident_lookup(&self) -> Option<usize> {
        (self.confident_lookup_hits > 0).then_some(self.confident_lookup_hits)
    }
}

impl Default for EntryConfig {
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).unwrap_or_else(|_| unreachable!("all fields default"))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    api_version: Option<String>,
    kind: Option<String>,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    name: String,
}

#[derive(Debug, Deserialize)]
struct Spec {
    source: Option<String>,
    local_path: Option<String>,
    engine: Option<String>,
    backend: Option<String>,
    replicas: Option<u32>,
    #[serde(default)]
    config: serde_json::Map<String, Value>,
    #[serde(default)]
    backend_parameters: Vec<String>,
}

/// Reads every entry of a config file.
pub fn load_file(path: &Path) -> anyhow::Result<Vec<ModelEntry>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&text, base).with_context(|| format!("in {}", path.display()))
}

/// Parses YAML documents; relative model paths are taken from `base`.
pub fn parse(text: &str, base: &Path) -> anyhow::Result<Vec<ModelEntry>> {
    let mut entries: Vec<ModelEntry> = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml_ng::Value::deserialize(document).with_context(|| format!("document {}", index + 1))?;
        if value.is_null() {
            continue;
        }
        let doc: Document =
            serde_yaml_ng::from_value(value).with_context(|| format!("document {} is not a Model", index + 1))?;
        let name = doc.metadata.name.trim().to_string();
        let entry = entry_from(doc, base).with_context(|| format!("model `{name}`"))?;
        if entries.iter().any(|e| e.name == entry.name) {
            bail!("model `{}` is defined twice", entry.name);
        }
        entries.push(entry);
    }
    Ok(entries)
}

fn entry_from(doc: Document, base: &Path) -> anyhow::Result<ModelEntry> {
    if let Some(kind) = &doc.kind
        && kind != "Model"
    {
        bail!("kind `{kind}` is not supported (expected Model)");
    }
    if let Some(api) = &doc.api_version
        && !api.starts_with("gpustack.gg/")
    {
        bail!("apiVersion `{api}` is not supported (expected gpustack.gg/v1alpha1)");
    }
    let name = doc.metadata.name.trim().to_string();
    if name.is_empty() {
        bail!("metadata.name is empty");
    }
    let engine = doc.spec.engine.as_deref().or(doc.spec.backend.as_deref()).unwrap_or("dspark");
    if !engine.eq_ignore_ascii_case("dspark") {
        bail!("spec.engine `{engine}` is not dspark");
    }
    if doc.spec.replicas.is_some_and(|r| r != 1) {
        bail!("spec.replicas must be 1 (one dspark process serves one replica)");
    }
    let source = doc
        .spec
        .source
        .as_deref()
        .or(doc.spec.local_path.as_deref())
        .ok_or_else(|| anyhow!("spec.source (or spec.local_path) is missing"))?;
    let source = source.strip_prefix("file://").or_else(|| source.strip_prefix("file:")).unwrap_or(source);
    if source.contains("://") {
        bail!("spec.source `{source}` is remote; dspark serves local GGUF files (file:PATH or a path)");
    }
    let path = base.join(source);
    let mut config = doc.spec.config;
    for (key, value) in parse_backend_parameters(&doc.spec.backend_parameters)? {
        config.insert(key, value);
    }
    let config: EntryConfig = serde_json::from_value(Value::Object(config.clone())).map_err(|e| {
        // serde names the bad value, not its key: find the key whose value alone fails.
        let key = config.iter().find(|(k, v)| {
            let one = serde_json::Map::from_iter([((*k).clone(), (*v).clone())]);
            serde_json::from_value::<EntryConfig>(Value::Object(one)).is_err()
        });
        match key {
            Some((k, _)) => anyhow!("spec.config.{k}: {e}"),
            None => anyhow!("spec.config: {e}"),
        }
    })?;
    config.validate()?;
    Ok(ModelEntry { name, path, config })
}

/// `["--max-num-seqs=8", "--dspark", "false"]` to config keys and values.
fn parse_backend_parameters(params: &[String]) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < params.len() {
        let arg = params[i].trim();
        let flag = arg.strip_prefix("--").ok_or_else(|| anyhow!("backend parameter `{arg}` is not a --flag"))?;
        let (key, raw) = match flag.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => match params.get(i + 1).filter(|next| !next.starts_with("--")) {
                Some(next) => {
                    i += 1;
                    (flag.to_string(), Some(next.clone()))
                }
                None => (flag.to_string(), None),
            },
        };
        let value = match raw {
            None => Value::Bool(true),
            Some(v) => serde_json::from_str(&v).unwrap_or(Value::String(v)),
        };
        out.push((key.replace('-', "_"), value));
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
apiVersion: gpustack.gg/v1alpha1
kind: Model
metadata:
  name: smollm2-dspark
spec:
  source: file:models/smol.gguf
  engine: dspark
  replicas: 1
  config:
    dspark: true
    max_num_seqs: 16
    max_model_len: 4096
    sampling: {temperature: 0.5}
---
apiVersion: gpustack.gg/v1alpha1
kind: Model
metadata:
  name: smollm2-classic
spec:
  source: /abs/smol.gguf
  backend_parameters: ["--dspark=false", "--max-num-seqs", "4"]
"#;

    #[test]
    fn gpustack_documents_become_entries() {
        let entries = parse(TWO, Path::new("/etc/dspark")).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].name, "smollm2-dspark");
        assert_eq!(entries[0].path, Path::new("/etc/dspark/models/smol.gguf"));
        assert!(entries[0].config.dspark);
        assert_eq!(entries[0].config.max_model_len, Some(4096));
        assert_eq!(entries[0].config.sampling.temperature, Some(0.5));
        assert_eq!(entries[1].path, Path::new("/abs/smol.gguf"));
        assert!(!entries[1].config.dspark);
        assert_eq!(entries[1].config.max_num_seqs, 4);
        assert_eq!(entries[1].config.max_num_batched_tokens, 512);
    }

    #[test]
    fn the_cache_type_is_auto_unless_named() {
        let entry = |config: &str| {
            let doc = format!("metadata: {{name: m}}\nspec: {{source: a, config: {{{config}}}}}\n");
            parse(&doc, Path::new(".")).map(|mut e| e.remove(0).config.kv_cache_dtype)
        };
        assert_eq!(entry("dspark: true").unwrap(), KvCacheDtype::Auto);
        assert_eq!(entry("kv_cache_dtype: bf16").unwrap(), KvCacheDtype::Bf16);
        assert_eq!(entry("kv_cache_dtype: f32").unwrap().resolve(), KvDtype::F32);
        assert_eq!(entry("kv_cache_dtype: int8").unwrap().resolve(), KvDtype::Int8);
        assert!(matches!(KvCacheDtype::Auto.resolve(), KvDtype::F16 | KvDtype::Bf16));
        let err = format!("{:#}", entry("kv_cache_dtype: fp8").unwrap_err());
        assert!(err.contains("model `m`") && err.contains("fp8") && err.contains("bf16"), "{err}");
    }

    #[test]
    fn mistakes_name_the_entry_and_key() {
        let bad = "kind: Model\nmetadata: {name: m}\nspec: {source: x.gguf, config: {max_num_seq: 3}}\n";
        let err = format!("{:#}", parse(bad, Path::new(".")).unwrap_err());
        assert!(err.contains("model `m`") && err.contains("max_num_seq"), "{err}");
        let dup = "metadata: {name: m}\nspec: {source: a}\n---\nmetadata: {name: m}\nspec: {source: b}\n";
        assert!(format!("{:#}", parse(dup, Path::new(".")).unwrap_err()).contains("defined twice"));
        let remote = "metadata: {name: m}\nspec: {source: 'hf://x/y'}\n";
        assert!(format!("{:#}", parse(remote, Path::new(".")).unwrap_err()).contains("remote"));
    }

    #[test]
    fn prompt_lookup_is_on_with_dspark_and_bounded() {
        let entries = parse(TWO, Path::new(".")).unwrap();
        assert_eq!(
            entries[0].config.prompt_lookup(),
            Some(PromptLookup { max_draft: 1, max_ngram: 3, min_ngram: 3 }),
            "DSpark drafts by default"
        );
        assert_eq!(entries[1].config.prompt_lookup(), None, "the classic path does not");
        let entry = |config: &str| {
            let doc = format!("metadata: {{name: m}}\nspec: {{source: a, config: {{{config}}}}}\n");
            parse(&doc, Path::new(".")).map(|mut e| e.remove(0).config.prompt_lookup())
        };
        assert_eq!(entries[0].config.confident_lookup(), Some(4), "the engine's default");
        let confident = |config: &str| {
            let doc = format!("metadata: {{name: m}}\nspec: {{source: a, config: {{{config}}}}}\n");
            parse(&doc, Path::new(".")).unwrap().remove(0).config.confident_lookup()
        };
        assert_eq!(confident("confident_lookup_hits: 0"), None, "0 is never");
        assert_eq!(confident("confident_lookup_hits: 7"), Some(7));
        assert_eq!(entry("speculate: false").unwrap(), None);
        assert_eq!(entry("num_speculative_tokens: 0").unwrap(), None);
        assert_eq!(
            entry("dspark: false, num_speculative_tokens: 6, prompt_lookup_max: 5, prompt_lookup_min: 1").unwrap(),
            Some(PromptLookup { max_draft: 6, max_ngram: 5, min_ngram: 1 })
        );
        let err = |config: &str| format!("{:#}", entry(config).unwrap_err());
        assert_eq!(
            err("prompt_lookup_min: 0"),
            "model `m`: spec.config: prompt_lookup_min (0) must be at least 1 and at most prompt_lookup_max (3)"
        );
        assert!(err("prompt_lookup_min: 4").contains("at most prompt_lookup_max (3)"));
        assert_eq!(
            err("prompt_lookup_max: 2"),
            "model `m`: spec.config: prompt_lookup_min (3) must be at least 1 and at most prompt_lookup_max (2)"
        );
        assert_eq!(
            err("num_speculative_tokens: 17"),
            "model `m`: spec.config: num_speculative_tokens must be at most 16"
        );
    }

    #[test]
    fn extra_rows_beside_unconstrained_defaults_to_0_and_a_bad_value_names_its_key() {
        let entry = |config: &str| {
            let doc = format!("metadata: {{name: m}}\nspec: {{source: a, config: {{{config}}}}}\n");
            parse(&doc, Path::new(".")).map(|mut e| e.remove(0).config.extra_rows_beside_unconstrained)
        };
        assert_eq!(entry("dspark: true").unwrap(), 0);
        assert_eq!(entry("extra_rows_beside_unconstrained: 8").unwrap(), 8);
        let err = format!("{:#}", entry("dspark: true, extra_rows_beside_unconstrained: -1").unwrap_err());
        assert_eq!(
            err,
            "model `m`: spec.config.extra_rows_beside_unconstrained: invalid value: integer `-1`, expected usize"
        );
    }
}
