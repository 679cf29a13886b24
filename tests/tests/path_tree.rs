//! DSpark's path tree over the real json-schema plugin (wasm, in wasmtime) and the real
//! Llama-3 tokenizer: with the tree and without it, the masks and forced spans are identical
//! over whole generations, a tree too small for the walk (evicting all the time) included;
//! and a path walked before is answered without calling the plugin.

use std::sync::{Arc, Mutex};

use dspark_host::constraint::path_tree::{Mask, PathTree, SharedTree, StateSource, TreeWalker, lock};
use dspark_host::plugin::{CompiledHandle, MatcherHandle, PluginInstance, TokenMask};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};
use dspark_tests::{Fixture, builtin_plugin, tokenizer_json};

fn bits(mask: TokenMask, width: usize) -> Option<Mask> {
    match mask {
        TokenMask::All => None,
        other => Some(other.to_bitset(width).into()),
    }
}

/// A matcher of the instance, made at its first commit, counting the calls made through it.
struct Direct<'a> {
    instance: &'a mut PluginInstance,
    compiled: &'a CompiledHandle,
    matcher: Option<MatcherHandle>,
    width: usize,
    calls: usize,
}

/// The instance and the matcher, borrowed apart.
fn parts<'a>(d: &'a mut Direct<'_>) -> anyhow::Result<(&'a mut PluginInstance, &'a MatcherHandle)> {
    let m = d.matcher.as_ref().ok_or_else(|| anyhow::anyhow!("the matcher was used before its start"))?;
    Ok((&mut *d.instance, m))
}

impl StateSource for Direct<'_> {
    fn commit(&mut self, tokens: &[u32]) -> anyhow::Result<(Vec<u32>, bool)> {
        self.calls += 1;
        if self.matcher.is_none() {
            self.matcher = Some(self.instance.new_matcher(self.compiled)?);
        }
        let (instance, m) = parts(self)?;
        let outcome = instance.commit(m, tokens)?;
        Ok((outcome.forced, outcome.stop))
    }
    fn mask(&mut self) -> anyhow::Result<Option<Mask>> {
        self.calls += 1;
        let width = self.width;
        let (instance, m) = parts(self)?;
        Ok(bits(instance.compute_mask(m)?, width))
    }
    fn state_key(&mut self) -> anyhow::Result<u64> {
        self.calls += 1;
        let (instance, m) = parts(self)?;
        Ok(instance.state_key(m)?)
    }
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n as u64) as usize
    }
}

fn allowed(mask: &Option<Mask>, vocab: usize) -> Vec<u32> {
    (0..vocab as u32).filter(|&t| mask.as_ref().is_none_or(|m| m[t as usize / 32] >> (t % 32) & 1 == 1)).collect()
}

/// What one walk saw at each step: the mask, then the token and the span and stop after it.
type Trace = Vec<(Option<Mask>, u32, Vec<u32>, bool)>;

/// A random generation (seeded) under the plugin directly, and the same token choices through
/// the walker over `tree`; returns both traces and the walker's plugin calls.
fn generation(
    instance: &mut PluginInstance,
    compiled: &CompiledHandle,
    tree: &SharedTree,
    vocab: usize,
    seed: u64,
) -> (Trace, Trace, usize) {
    let reference = instance.new_matcher(compiled).unwrap();
    let mut rng = Rng(seed);
    let mut direct_trace = Trace::new();
    let start = instance.commit(&reference, &[]).unwrap();
    let mut stopped = start.stop;
    while !stopped && direct_trace.len() < 120 {
        let mask = bits(instance.compute_mask(&reference).unwrap(), vocab);
        let choices = allowed(&mask, vocab);
        let token = choices[rng.below(choices.len())];
        let outcome = instance.commit(&reference, &[token]).unwrap();
        stopped = outcome.stop || instance.is_stopped(&reference).unwrap();
        direct_trace.push((mask, token, outcome.forced, outcome.stop));
    }
    instance.drop_matcher(reference).unwrap();

    let mut source = Direct { instance, compiled, matcher: None, width: vocab, calls: 0 };
    let mut walker = TreeWalker::new(tree.clone());
    let edge = walker.start(&mut source).unwrap();
    assert_eq!((&edge.forced[..], edge.stop), (&start.forced[..], start.stop), "start span");
    let mut tree_trace = Trace::new();
    for (_, token, _, _) in &direct_trace {
        let mask = walker.mask(&mut source).unwrap();
        let edge = walker.commit(&mut source, *token).unwrap();
        tree_trace.push((mask, *token, edge.forced.to_vec(), edge.stop));
    }
    let calls = source.calls;
    if let Some(m) = source.matcher.take() {
        source.instance.drop_matcher(m).unwrap();
    }
    (direct_trace, tree_trace, calls)
}

const SCHEMAS: &[&str] = &[
    r##"{"type":"object","properties":{"orders":{"type":"array","items":{"type":"object","properties":{
        "order_id":{"type":"string","pattern":"^ORD-[0-9]{4}$"},"product":{"type":"string"},
        "quantity":{"type":"integer","minimum":1},"unit_price":{"type":"number"},
        "status":{"enum":["pending","shipped","delivered","cancelled"]}},
        "required":["order_id","product","quantity","unit_price","status"],"additionalProperties":false}}},
        "required":["orders"],"additionalProperties":false}"##,
    r##"{"$defs":{"node":{"type":"object","properties":{"name":{"type":"string","maxLength":8},
        "children":{"type":"array","items":{"$ref":"#/$defs/node"},"maxItems":2}},"required":["name"]}},
        "$ref":"#/$defs/node"}"##,
    r##"{"anyOf":[{"type":"boolean"},{"type":"null"},{"type":"array","items":{"enum":[1,22,333]}},
        {"type":"object","additionalProperties":{"type":"number"}}]}"##,
];

/// The json-schema plugin instantiated over the Llama-3 tokenizer (its fixture kept alive with
/// it) and the vocabulary size.
fn json_schema_instance() -> (Fixture, PluginInstance, usize) {
    let fixture = Fixture::new(&[builtin_plugin("json-schema")], |_| {});
    let tok = Arc::new(HfTokenizer::from_file(&tokenizer_json("llama3"), None).unwrap());
    let vocab = tok.table().vocab_size();
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    let plugin = fixture.registry.get("json-schema").unwrap();
    let instance = plugin.instantiate(tok.table().clone(), canonical).unwrap();
    (fixture, instance, vocab)
}

#[test]
fn masks_and_spans_are_identical_with_and_without_the_tree() {
    let (_fixture, mut instance, vocab) = json_schema_instance();
    for (i, schema) in SCHEMAS.iter().enumerate() {
        let compiled = instance.compile("json-schema", schema, "").unwrap();
        let roomy: SharedTree = Arc::new(Mutex::new(PathTree::new(256 << 20)));
        // Room for a handful of 16 KB masks: most nodes are evicted before they are reused.
        let tiny: SharedTree = Arc::new(Mutex::new(PathTree::new(64 << 10)));
        let mut steps = 0;
        for seed in 1..=12u64 {
            let seed = seed * 7919 + i as u64;
            for tree in [&roomy, &tiny] {
                let (direct, walked, _) = generation(&mut instance, &compiled, tree, vocab, seed);
                assert_eq!(direct.len(), walked.len());
                for (step, (d, w)) in direct.iter().zip(&walked).enumerate() {
                    assert_eq!(d, w, "schema {i}, seed {seed}, step {step}: plugin and tree disagree");
                }
                steps += direct.len();
            }
        }
        // The same generations again: the roomy tree answers them all without the plugin.
        for seed in 1..=12u64 {
            let seed = seed * 7919 + i as u64;
            let (direct, walked, calls) = generation(&mut instance, &compiled, &roomy, vocab, seed);
            assert_eq!(direct, walked);
            assert_eq!(calls, 0, "schema {i}, seed {seed}: a known path called the plugin {calls} times");
        }
        assert!(steps > 100, "schema {i}: only {steps} steps walked");
        let tiny = lock(&tiny);
        assert!(tiny.stats().evicted_nodes > 0, "schema {i}: the tiny tree never evicted");
        assert!(tiny.bytes() <= 64 << 10 || tiny.len() == 1);
        instance.drop_compiled(compiled).unwrap();
    }
}

#[test]
fn the_tree_knows_the_masks_after_a_walked_path() {
    // What lets the engine compute only the allowed logits of drafted rows: after a path was
    // walked, the tree gives the masks of the states down a draft of its tokens, exactly as
    // they were, and nothing past a token or span it has not seen.
    let (_fixture, mut instance, vocab) = json_schema_instance();
    let compiled = instance.compile("json-schema", SCHEMAS[0], "").unwrap();
    let tree: SharedTree = Arc::new(Mutex::new(PathTree::new(256 << 20)));
    let mut known = 0;
    for seed in 1..=4u64 {
        let (trace, _, _) = generation(&mut instance, &compiled, &tree, vocab, seed);
        let mut source = Direct { instance: &mut instance, compiled: &compiled, matcher: None, width: vocab, calls: 0 };
        let mut walker = TreeWalker::new(tree.clone());
        walker.start(&mut source).unwrap();
        for i in 0..trace.len() {
            let draft: Vec<(u32, &[u32])> =
                trace[i..(i + 3).min(trace.len())].iter().map(|s| (s.1, &s.2[..])).collect();
            let expected: Vec<Option<Mask>> = (0..draft.len())
                .take_while(|&j| i + j + 1 < trace.len() && !trace[i + j].3)
                .map(|j| trace[i + j + 1].0.clone())
                .collect();
            // Past the trace's last step (the length cap) the state may be known from another
            // walk that reached it.
            let got = walker.masks_after(draft.iter().copied());
            assert!(got.len() >= expected.len() && got.len() <= draft.len(), "seed {seed}, step {i}: {}", got.len());
            assert!(got[..expected.len()] == expected[..], "seed {seed}, step {i}: other masks");
            known += expected.len();
            // A span other than the one the tree saw, or a token never taken: nothing known.
            let (token, forced) = draft[0];
            let other_span: Vec<u32> = if forced.is_empty() { vec![token] } else { Vec::new() };
            assert!(walker.masks_after([(token, &other_span[..])]).is_empty(), "seed {seed}, step {i}");
            let untaken =
                allowed(&trace[i].0, vocab).into_iter().find(|&t| lock(&tree).edge(walker.key(), t).is_none());
            if let Some(t) = untaken {
                assert!(walker.masks_after([(t, &[][..])]).is_empty(), "seed {seed}, step {i}");
            }
            walker.mask(&mut source).unwrap();
            walker.commit(&mut source, trace[i].1).unwrap();
        }
        assert_eq!(source.calls, 0, "the walk was known");
    }
    assert!(known > 100, "only {known} masks known down drafts");
    instance.drop_compiled(compiled).unwrap();
}
