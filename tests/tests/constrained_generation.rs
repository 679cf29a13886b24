//! Constrained generation through the host alone: the constraint runtime builds a plugin
//! constraint, the engine decodes under it, with no server in between. Both modes must give
//! answers that satisfy the constraint, and with batch-invariant kernels the same answer.

use std::sync::Arc;

use dspark_host::constraint::{BuildError, ConstraintMode, ConstraintRequest, ConstraintRuntime, TreeStats};
use dspark_host::engine::chat::ChatTemplate;
use dspark_host::engine::{
    BackendChoice, EngineConfig, FinishReason, GenerationRequest, LoadedModel, ModelTokenizer, SamplingParams, load,
};
use dspark_tests::{Fixture, builtin_plugin, smollm2};
use serde_json::{Value, json};

/// Counts the path-tree walks reported to it.
#[derive(Default)]
struct Walks(std::sync::Mutex<Vec<TreeStats>>);

impl dspark_host::constraint::ConstraintObserver for Walks {
    fn walked(&self, stats: TreeStats) {
        self.0.lock().unwrap().push(stats);
    }
}

fn chat_prompt(tokenizer: &ModelTokenizer, message: &str) -> Vec<u32> {
    let template = ChatTemplate::new(tokenizer.chat_template.as_deref().expect("chat template"), "", "").unwrap();
    let text = template.render(&[json!({"role": "user", "content": message})], None, true).unwrap();
    tokenizer.encode(&text).unwrap()
}

/// Greedy answer under `request` in `mode`: its text, forced-token count and finish reason.
fn answer(
    model: &Arc<dyn LoadedModel>,
    tokenizer: &Arc<ModelTokenizer>,
    fixture: &Fixture,
    mode: ConstraintMode,
    request: &ConstraintRequest,
    observer: Arc<Walks>,
) -> (String, usize, FinishReason) {
    let dspark = mode == ConstraintMode::DSpark;
    let config = EngineConfig {
        max_num_seqs: 1,
        overlap_masks: dspark,
        masked_logits: dspark,
        guesses: dspark,
        ..EngineConfig::default()
    };
    let mut engine = model.clone().engine(tokenizer.clone(), &config).unwrap();
    let runtime = ConstraintRuntime::new(tokenizer.clone(), model.config().vocab_size, mode).with_observer(observer);
    let built = runtime.build(&fixture.registry, request).expect("the constraint compiles");
    assert!(built.warnings.is_empty(), "nothing is approximated: {:?}", built.warnings);
    let mut generation = GenerationRequest::new(chat_prompt(tokenizer, "Give the name and age of a person as JSON."));
    generation.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
    generation.max_tokens = Some(60);
    generation.constraint = Some(Box::new(built.constraint));
    engine.add_request(generation).unwrap();
    let (mut text, mut forced, mut finish) = (String::new(), 0, None);
    while engine.has_work() {
        for update in engine.step().unwrap() {
            text.push_str(&update.text);
            forced += update.tokens.iter().filter(|t| t.forced).count();
            finish = update.finish.or(finish);
        }
    }
    (text, forced, finish.expect("the request finishes"))
}

#[test]
fn the_host_alone_decodes_under_a_json_schema_in_both_modes() {
    let fixture = Fixture::new(&[builtin_plugin("json-schema")], |_| {});
    let (model, tokenizer) = load(BackendChoice::CpuBatchInvariant, &smollm2()).unwrap();
    let tokenizer = Arc::new(tokenizer);
    let schema = json!({
        "type": "object", "additionalProperties": false, "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}
    });
    let request = ConstraintRequest::new("json-schema", schema.to_string());
    let validator = jsonschema::validator_for(&schema).unwrap();

    let dspark_walks = Arc::new(Walks::default());
    let (dspark, dspark_forced, dspark_finish) =
        answer(&model, &tokenizer, &fixture, ConstraintMode::DSpark, &request, dspark_walks.clone());
    let (classic, classic_forced, classic_finish) =
        answer(&model, &tokenizer, &fixture, ConstraintMode::Classic, &request, Arc::new(Walks::default()));

    assert_eq!(dspark_finish, FinishReason::Stop, "the schema's end ends the answer: {dspark}");
    let value: Value = serde_json::from_str(&dspark).unwrap_or_else(|e| panic!("{dspark:?} is not JSON: {e}"));
    assert!(validator.is_valid(&value), "{dspark} does not validate");
    assert_eq!(dspark, classic, "batch-invariant kernels give one answer in both modes");
    assert_eq!(classic_finish, FinishReason::Stop);
    // `{"name":"` is forced at the start in DSpark mode; the classic path samples every token.
    assert!(dspark_forced >= 3, "DSpark fast-forwards the keys: {dspark_forced} forced");
    assert_eq!(classic_forced, 0, "the classic path forces nothing");
    let walks = dspark_walks.0.lock().unwrap();
    assert_eq!(walks.len(), 1, "the one sequence's walk is reported when its constraint is dropped");
    assert!(walks[0].misses > 0, "a fresh path tree asks the plugin");
}

#[test]
fn build_errors_name_what_is_wrong() {
    let fixture = Fixture::new(&[builtin_plugin("regex")], |_| {});
    let (model, tokenizer) = load(BackendChoice::Cpu, &smollm2()).unwrap();
    let runtime = ConstraintRuntime::new(Arc::new(tokenizer), model.config().vocab_size, ConstraintMode::DSpark);
    let error = |request: ConstraintRequest| match runtime.build(&fixture.registry, &request) {
        Ok(_) => panic!("{request:?} must not build"),
        Err(e) => e,
    };
    let e = error(ConstraintRequest::new("regex", "(unclosed"));
    assert!(matches!(e, BuildError::Invalid { ref kind, .. } if kind == "regex"), "{e:?}");
    assert!(e.to_string().starts_with("invalid regex constraint"), "{e}");
    let e = error(ConstraintRequest::new("grammar", "root ::= \"x\""));
    assert_eq!(e.to_string(), "no installed plugin serves `grammar` constraints");
    let e = error(ConstraintRequest { plugin: Some("nope".into()), ..ConstraintRequest::new("regex", "x") });
    assert_eq!(e.to_string(), "no plugin named `nope` is installed");
    let e = error(ConstraintRequest { plugin: Some("regex".into()), ..ConstraintRequest::new("choice", "[\"a\"]") });
    assert_eq!(e.to_string(), "plugin `regex` does not serve kind `choice`");

    // A plugin that is installed but failed to load is named with the check that failed, by
    // name and by kind.
    let broken = dspark_tests::install(&builtin_plugin("choice"), fixture.plugins.path());
    let manifest = std::fs::read_to_string(broken.join("plugin.toml")).unwrap();
    let sha = manifest.lines().find_map(|l| l.strip_prefix("sha256 = ")).unwrap().trim_matches('"').to_string();
    std::fs::write(broken.join("plugin.toml"), manifest.replace(&sha, &"0".repeat(64))).unwrap();
    assert_eq!(fixture.registry.scan().failed.len(), 1);
    let why = format!("plugin.wasm has sha256 {sha}, the manifest says {}", "0".repeat(64));
    let e = error(ConstraintRequest { plugin: Some("choice".into()), ..ConstraintRequest::new("choice", "[\"a\"]") });
    assert!(matches!(e, BuildError::PluginFailed { .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        format!(
            "plugin `choice` is installed but failed to load: plugin `choice`: {why}; fix or replace it in the plugin \
             directory"
        )
    );
    let e = error(ConstraintRequest::new("choice", "[\"a\"]"));
    assert_eq!(
        e.to_string(),
        format!("no ready plugin serves `choice` constraints: plugin `choice` failed to load: plugin `choice`: {why}")
    );
}
