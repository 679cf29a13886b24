//! The fixed costs of the plugin sandbox, through the real `testkit` component:
//!
//! - `empty_call`: one matcher call that does no work (`is-accepting`);
//! - `full_bitset_mask_152k`: `compute-mask` returning an incompressible bitset for a 152k
//!   vocabulary (Qwen2.5's size), lifted into the host and validated;
//! - `instantiate`: a new Store instantiated from the cached `InstancePre`.
//!
//! Run: `scripts/build-plugins.sh && cargo bench -p dspark-host --bench plugin_calls`.
//! Targets (2-core CI machine): empty call <= 1 µs, full-bitset mask <= 3 µs, instantiate <=
//! 50 µs.

use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use dspark_host::plugin::{PluginRuntime, RuntimeConfig};
use dspark_host::tokenizer::{CanonicalTokenizer, TokenTable};

struct NoTokens;

impl CanonicalTokenizer for NoTokens {
    fn tokenize(&self, _text: &[u8]) -> Vec<u32> {
        Vec::new()
    }
}

/// Qwen2.5's vocabulary size.
const VOCAB: usize = 151_936;

fn bench(c: &mut Criterion) {
    let testkit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../build/test-plugins/testkit");
    assert!(
        testkit.join("plugin.wasm").exists(),
        "run scripts/build-plugins.sh first: {} is missing",
        testkit.display()
    );
    let state = std::env::temp_dir().join(format!("dspark-bench-{}", std::process::id()));
    let runtime = PluginRuntime::new(RuntimeConfig::new(&state)).expect("runtime");
    let plugin = runtime.load(&testkit).expect("testkit loads");
    let tokens: Vec<Vec<u8>> = (0..VOCAB).map(|i| i.to_string().into_bytes()).collect();
    let table = Arc::new(TokenTable::new(&tokens, vec![], vec![VOCAB as u32 - 1]).expect("table"));
    let mut inst = plugin.instantiate(table, Arc::new(NoTokens)).expect("instance");
    let compiled = inst.compile("bitset", "", "{}").expect("compiles");
    let matcher = inst.new_matcher(&compiled).expect("matcher");

    c.bench_function("empty_call", |b| b.iter(|| inst.is_accepting(&matcher).expect("call")));
    c.bench_function("full_bitset_mask_152k", |b| {
        b.iter(|| {
            let mask = inst.compute_mask(&matcher).expect("mask");
            std::hint::black_box(mask);
        })
    });
    c.bench_function("instantiate", |b| b.iter(|| plugin.instantiate_bare().expect("instantiate")));
    let _ = std::fs::remove_dir_all(&state);
}

criterion_group!(benches, bench);
criterion_main!(benches);
