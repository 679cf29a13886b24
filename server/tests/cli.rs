//! The `dspark` binary's plugin and constraint commands, run as a user would.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn need(rel: &str, script: &str) -> PathBuf {
    let p = root().join(rel);
    assert!(p.exists(), "missing {}: run `{script}` first (scripts/test.sh does)", p.display());
    p
}

fn dspark(args: &[&str], state: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dspark"))
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .current_dir(root())
        .output()
        .expect("dspark runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn constraint_check_accepts_a_match_and_shows_forced_spans() {
    need("plugins/choice/plugin.wasm", "scripts/build-plugins.sh");
    let tok = need("assets/tokenizers/llama3/tokenizer.json", "scripts/fetch-assets.sh");
    let state = tempfile::tempdir().unwrap();
    let o = dspark(
        &[
            "constraint",
            "check",
            "--plugin",
            "choice",
            "--kind",
            "choice",
            "--source",
            r#"["Paris is the capital of France","London"]"#,
            "--tokenizer",
            tok.to_str().unwrap(),
            "--text",
            "Paris is the capital of France",
        ],
        state.path(),
    );
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains(r#"#0      60704 "Paris"                  allowed (8 tokens allowed)"#), "{out}");
    assert!(
        out.contains(r#"forced span of 5 tokens matches the text: " is" " the" " capital" " of" " France""#),
        "{out}"
    );
    assert!(out.trim_end().ends_with("result: accepted"), "{out}");
}

#[test]
fn constraint_check_fails_on_a_rejected_token_an_incomplete_text_and_a_bad_source() {
    need("plugins/regex/plugin.wasm", "scripts/build-plugins.sh");
    let tok = need("assets/tokenizers/llama3/tokenizer.json", "scripts/fetch-assets.sh");
    let tok = tok.to_str().unwrap();
    let state = tempfile::tempdir().unwrap();
    let re = r"\d{4}-\d{2}-\d{2}";
    let check = |text: &str, source: &str| {
        dspark(
            &[
                "constraint",
                "check",
                "--plugin",
                "regex",
                "--kind",
                "regex",
                "--source",
                source,
                "--tokenizer",
                tok,
                "--text",
                text,
            ],
            state.path(),
        )
    };
    let ok = check("2024-05-17", re);
    assert!(ok.status.success(), "{}", stdout(&ok));
    let rejected = check("2024-05-1x", re);
    assert_eq!(rejected.status.code(), Some(1));
    assert!(
        stdout(&rejected).contains("REJECTED") && stdout(&rejected).contains("result: rejected at token"),
        "{}",
        stdout(&rejected)
    );
    let partial = check("2024-05", re);
    assert_eq!(partial.status.code(), Some(1));
    assert!(stdout(&partial).contains("result: not accepted (the text is an incomplete match)"));
    let bad = check("x", "(");
    assert_eq!(bad.status.code(), Some(1));
    assert!(stdout(&bad).starts_with("compile error: invalid-source:"), "{}", stdout(&bad));
    let missing = dspark(
        &["constraint", "check", "--plugin", "nope", "--kind", "k", "--source", "s", "--tokenizer", tok, "--text", "x"],
        state.path(),
    );
    assert_eq!(missing.status.code(), Some(2));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("no plugin `nope` in plugins (found: choice, grammar, json-schema, regex, tool-call)"),
        "{err}"
    );
}

#[test]
fn plugins_list_and_validate() {
    need("plugins/regex/plugin.wasm", "scripts/build-plugins.sh");
    let state = tempfile::tempdir().unwrap();
    let o = dspark(&["plugins", "list", "--json"], state.path());
    assert!(o.status.success());
    let rows: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let names: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["choice", "grammar", "json-schema", "regex", "tool-call"]);
    assert!(rows.as_array().unwrap().iter().all(|r| r["status"] == "ready"));
    let v = dspark(&["plugins", "validate", "plugins/regex"], state.path());
    assert!(v.status.success());
    assert!(stdout(&v).starts_with("ok: regex 0.1.0 serves regex (sha256 "), "{}", stdout(&v));
    let bad = dspark(&["plugins", "validate", "guest-sdk"], state.path());
    assert_eq!(bad.status.code(), Some(1));
    assert!(stdout(&bad).starts_with("invalid: cannot read"), "{}", stdout(&bad));
}

#[test]
fn maskbench_reports_the_maskbench_figures_as_json() {
    need("plugins/json-schema/plugin.wasm", "scripts/build-plugins.sh");
    let tok = need("assets/tokenizers/llama3/tokenizer.json", "scripts/fetch-assets.sh");
    let data = root().join("tests/data/jsonschemabench-sample/Github_easy");
    let state = tempfile::tempdir().unwrap();
    let o = dspark(
        &[
            "constraint",
            "maskbench",
            "--tokenizer",
            tok.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--limit",
            "4",
            "--json",
        ],
        state.path(),
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["schemas"], 4);
    assert_eq!(r["compiled"], 4, "{r}");
    for key in ["mean", "p50", "p90", "p99", "max"] {
        assert!(r["mask_us"][key].as_f64().is_some_and(|v| v >= 0.0), "mask_us.{key} in {r}");
    }
    for key in ["mean", "p50", "p99", "max"] {
        assert!(r["compile_ms"][key].is_number(), "compile_ms.{key} in {r}");
    }
    let valid = r["valid_accepted"].as_u64().unwrap() + r["valid_rejected"].as_u64().unwrap();
    assert!(valid > 0 && r["valid_rejected"] == 0, "{r}");
    assert_eq!(r["invalid_accepted"], 0, "{r}");
    assert!(r["ff_share"].as_f64().is_some() && r["wall_s"].as_f64().is_some());
}

/// `dspark generate` with a constraint drives the host's constraint runtime with no server:
/// the answer matches the constraint in DSpark and classic mode alike (SmolLM2, the default
/// model; `tests/tests/constrained_generation.rs` checks that the two answers are the same
/// with batch-invariant kernels).
#[test]
fn generate_takes_a_constraint_in_both_modes() {
    need("plugins/json-schema/plugin.wasm", "scripts/build-plugins.sh");
    let model = need("assets/SmolLM2-135M-Instruct.Q4_1.gguf", "scripts/fetch-assets.sh");
    let state = tempfile::tempdir().unwrap();
    let schema_file = state.path().join("person.json");
    let schema = serde_json::json!({
        "type": "object", "additionalProperties": false, "required": ["name", "age"],
        "properties": {"name": {"type": "string", "maxLength": 20},
                       "age": {"type": "integer", "minimum": 0, "maximum": 120}}
    });
    std::fs::write(&schema_file, schema.to_string()).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", model.to_str().unwrap(), "--max-tokens", "60"];
        args.extend_from_slice(&["--chat", "Give the name and age of a person as JSON."]);
        args.extend_from_slice(extra);
        let o = dspark(&args, state.path());
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "{}\n{err}", stdout(&o));
        (stdout(&o).trim().to_string(), err)
    };
    let (dspark_answer, dspark_log) = run(&["--json-schema", schema_file.to_str().unwrap()]);
    let validator = jsonschema::validator_for(&schema).unwrap();
    let valid = |answer: &str| {
        let value: serde_json::Value =
            serde_json::from_str(answer).unwrap_or_else(|e| panic!("{answer:?} is not JSON: {e}"));
        validator.is_valid(&value)
    };
    assert!(valid(&dspark_answer), "{dspark_answer}");
    assert!(dspark_log.contains("finish: Some(Stop)"), "{dspark_log}");
    assert!(dspark_log.contains("(dspark mode)"), "{dspark_log}");
    let (classic_answer, classic_log) = run(&["--json-schema", schema_file.to_str().unwrap(), "--no-dspark"]);
    assert!(valid(&classic_answer), "{classic_answer}");
    assert!(classic_log.contains("(classic mode), 0 tokens forced"), "{classic_log}");

    let (choice, _) = run(&["--choice", "yes", "--choice", "no"]);
    assert!(choice == "yes" || choice == "no", "{choice:?}");
    let o = dspark(
        &["generate", "--model", model.to_str().unwrap(), "--prompt", "x", "--regex", "(unclosed"],
        state.path(),
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the regex constraint") && err.contains("invalid regex constraint"), "{err}");
}
