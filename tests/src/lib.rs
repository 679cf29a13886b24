//! Shared fixtures of dspark's end-to-end tests: where the built plugins and fetched assets
//! are, throwaway registries and state directories, and a small tokenizer.
//!
//! Tests need real artifacts: the plugins built by `scripts/build-plugins.sh` and the
//! tokenizers fetched by `scripts/fetch-assets.sh` (both run by `scripts/test.sh`). A missing
//! one fails the test with the command to run; nothing is skipped silently.

pub mod http;
pub mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dspark_host::plugin::registry::Registry;
use dspark_host::plugin::{PluginRuntime, RuntimeConfig};
use dspark_host::tokenizer::{CanonicalTokenizer, TokenTable};

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// `path` (relative to the repository root) if it exists; otherwise fails the test, saying
/// which script makes it.
pub fn require(path: &str, made_by: &str) -> PathBuf {
    let p = repo_root().join(path);
    assert!(p.exists(), "missing {}: run `{made_by}` first (scripts/test.sh does)", p.display());
    p
}

/// The folder of a built-in plugin (`plugins/<name>`).
pub fn builtin_plugin(name: &str) -> PathBuf {
    require(&format!("plugins/{name}/plugin.wasm"), "scripts/build-plugins.sh");
    repo_root().join("plugins").join(name)
}

/// The folder of a test-only plugin (`build/test-plugins/<name>`).
pub fn test_plugin(name: &str) -> PathBuf {
    require(&format!("build/test-plugins/{name}/plugin.wasm"), "scripts/build-plugins.sh");
    repo_root().join("build/test-plugins").join(name)
}

/// The folder of an example plugin (`build/example-plugins/<name>`, from `examples/`).
pub fn example_plugin(name: &str) -> PathBuf {
    require(&format!("build/example-plugins/{name}/plugin.wasm"), "scripts/build-plugins.sh");
    repo_root().join("build/example-plugins").join(name)
}

/// A fetched tokenizer (`assets/tokenizers/<name>/tokenizer.json`).
pub fn tokenizer_json(name: &str) -> PathBuf {
    require(&format!("assets/tokenizers/{name}/tokenizer.json"), "scripts/fetch-assets.sh")
}

/// The Llama-3 vocabulary as the guest SDK's token table, the way the host hands it to a
/// plugin (special tokens marked, forced spans tokenised by the real tokenizer), and the
/// tokenizer itself: for native runs of the plugins' libraries.
pub fn llama3_guest_table() -> (Arc<dspark_guest::TokenTable>, Arc<dspark_host::tokenizer::HfTokenizer>) {
    let tok = Arc::new(
        dspark_host::tokenizer::HfTokenizer::from_file(&tokenizer_json("llama3"), None)
            .expect("load the Llama-3 tokenizer"),
    );
    let t = tok.table();
    let mut bytes = Vec::new();
    let mut offsets = vec![0u32];
    for i in 0..t.vocab_size() as u32 {
        bytes.extend_from_slice(t.token_bytes(i));
        offsets.push(bytes.len() as u32);
    }
    let canonical = tok.clone();
    let table = dspark_guest::TokenTable::new(bytes, offsets, t.special_tokens(), t.eos_tokens())
        .expect("the Llama-3 vocabulary is a valid token table")
        .with_tokenize(dspark_guest::Tokenize::Custom(Arc::new(move |b: &[u8]| canonical.tokenize(b))));
    (Arc::new(table), tok)
}

/// Copies a plugin folder into `registry` (so a test may change or break it freely).
pub fn install(plugin_dir: &Path, registry: &Path) -> PathBuf {
    let name = plugin_dir.file_name().expect("plugin folder has a name");
    let dest = registry.join(name);
    std::fs::create_dir_all(&dest).expect("create plugin folder");
    for f in ["plugin.toml", "plugin.wasm"] {
        std::fs::copy(plugin_dir.join(f), dest.join(f)).expect("copy plugin file");
    }
    dest
}

/// A throwaway registry and state directory with the given plugins installed and scanned.
pub struct Fixture {
    /// The registry's directory.
    pub plugins: tempfile::TempDir,
    /// The runtime's state directory (cache, quarantine).
    pub state: tempfile::TempDir,
    /// The runtime.
    pub runtime: Arc<PluginRuntime>,
    /// The registry, scanned once.
    pub registry: Arc<Registry>,
}

impl Fixture {
    /// Installs `plugin_dirs` into a fresh registry; `configure` adjusts the runtime's limits.
    pub fn new(plugin_dirs: &[PathBuf], configure: impl FnOnce(&mut RuntimeConfig)) -> Self {
        let plugins = tempfile::tempdir().expect("temp dir");
        let state = tempfile::tempdir().expect("temp dir");
        for d in plugin_dirs {
            install(d, plugins.path());
        }
        let mut config = RuntimeConfig::new(state.path());
        configure(&mut config);
        let runtime = PluginRuntime::new(config).expect("runtime starts");
        let registry = Arc::new(Registry::new(plugins.path(), runtime.clone()).expect("registry"));
        let report = registry.scan();
        assert!(report.failed.is_empty(), "plugins failed to load: {:?}", report.failed);
        Self { plugins, state, runtime, registry }
    }
}

/// A small byte-level vocabulary: the 256 bytes, a few words, and `<eos>` (special) last.
pub struct ByteTokenizer {
    table: Arc<TokenTable>,
    words: Vec<Vec<u8>>,
}

impl ByteTokenizer {
    /// The bytes, then `extra`, then `<eos>`.
    pub fn new(extra: &[&str]) -> Arc<Self> {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.extend(extra.iter().map(|w| w.as_bytes().to_vec()));
        words.push(b"<eos>".to_vec());
        let eos = words.len() as u32 - 1;
        let table = Arc::new(TokenTable::new(&words, vec![eos], vec![eos]).expect("valid table"));
        Arc::new(Self { table, words })
    }

    /// The table.
    pub fn table(&self) -> Arc<TokenTable> {
        self.table.clone()
    }

    /// The EOS id.
    pub fn eos(&self) -> u32 {
        self.words.len() as u32 - 1
    }
}

impl CanonicalTokenizer for ByteTokenizer {
    /// Longest match.
    fn tokenize(&self, text: &[u8]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut pos = 0;
        let eos = self.eos() as usize;
        while pos < text.len() {
            let (id, len) = self.words[..eos]
                .iter()
                .enumerate()
                .filter(|(_, w)| text[pos..].starts_with(w))
                .map(|(i, w)| (i as u32, w.len()))
                .max_by_key(|&(_, l)| l)
                .unwrap_or((text[pos] as u32, 1));
            out.push(id);
            pos += len;
        }
        out
    }
}

/// The default model, SmolLM2-135M-Instruct (Q4_1 GGUF, `llama` architecture).
pub fn smollm2() -> PathBuf {
    require("assets/SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/fetch-assets.sh")
}

/// Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, `qwen2` architecture, 152k vocabulary).
pub fn qwen25() -> PathBuf {
    require("assets/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "scripts/fetch-assets.sh")
}

/// Walks `tokens` through a fresh matcher of `c` the way `maskbench` does: one timed mask
/// per sampled token, forced spans taken where the tokens agree with them and rolled back
/// where not. Calls `timed(i, µs)` with each mask's time before token `i`. Returns `Err(i)`
/// where token `i` is refused, else whether the matcher ends accepting. For the native mask
/// benchmarks.
pub fn walk_timing_masks(
    c: &dyn dspark_guest::CompiledConstraint,
    tokens: &[u32],
    mut timed: impl FnMut(usize, f64),
) -> Result<bool, usize> {
    let mut m = c.new_matcher();
    let mut i = 0;
    let start = m.commit(&[]).expect("start");
    if tokens.starts_with(&start.forced) {
        i = start.forced.len();
    } else {
        m.rollback(start.forced.len() as u32).expect("rollback");
    }
    while i < tokens.len() {
        let t0 = std::time::Instant::now();
        let mask = m.compute_mask().expect("mask");
        timed(i, t0.elapsed().as_secs_f64() * 1e6);
        if !mask.allows(tokens[i]) {
            return Err(i);
        }
        let step = m.commit(&tokens[i..i + 1]).expect("commit");
        i += 1;
        if !step.forced.is_empty() {
            if tokens.get(i..i + step.forced.len()) == Some(&step.forced[..]) {
                i += step.forced.len();
            } else {
                m.rollback(step.forced.len() as u32).expect("rollback");
            }
        }
    }
    Ok(m.is_accepting())
}
