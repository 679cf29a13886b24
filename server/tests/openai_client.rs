//! The official `openai` Python client against `dspark serve` (tests/python/openai_client.py).
//! The client is installed by scripts/test.sh into build/venv from PyPI.

use std::path::Path;
use std::process::Command;

use dspark_tests::server::Server;
use dspark_tests::{qwen25, repo_root, require, smollm2};

#[test]
fn the_official_openai_client_works() {
    let python = require("build/venv/bin/python", "scripts/test.sh (it installs the openai client)");
    let model = smollm2();
    let server = Server::start(
        Path::new(env!("CARGO_BIN_EXE_dspark")),
        &["--model", model.to_str().unwrap(), "--served-model-name", "smol"],
    );
    let output = Command::new(python)
        .arg(repo_root().join("tests/python/openai_client.py"))
        .env("DSPARK_URL", format!("http://{}", server.addr))
        .env("DSPARK_MODEL", "smol")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the openai client checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}

/// Tool calling with the official client on Qwen2.5 (Hermes `<tool_call>` syntax): every
/// `tool_choice` mode, parallel calls, streaming and a multi-turn conversation
/// (tests/python/openai_tools.py); then the server's own argument check counted no failure.
#[test]
fn the_official_openai_client_calls_tools() {
    let python = require("build/venv/bin/python", "scripts/test.sh (it installs the openai client)");
    let model = qwen25();
    let server = Server::start(
        Path::new(env!("CARGO_BIN_EXE_dspark")),
        &["--model", model.to_str().unwrap(), "--served-model-name", "qwen"],
    );
    let output = Command::new(python)
        .arg(repo_root().join("tests/python/openai_tools.py"))
        .env("DSPARK_URL", format!("http://{}", server.addr))
        .env("DSPARK_MODEL", "qwen")
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the openai tool checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
    let metrics = dspark_tests::http::get(server.addr, "/metrics").body;
    let failures: f64 = metrics
        .lines()
        .find(|l| l.starts_with("dspark_validation_failures_total{model_name=\"qwen\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no validation failure counter in /metrics:\n{metrics}"));
    assert_eq!(failures, 0.0, "the server found tool arguments that do not validate");
}
