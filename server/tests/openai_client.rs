//! The official `openai` Python client against `dspark serve` (tests/python/openai_client.py).
//! The client is installed by scripts/test.sh into build/venv from PyPI.

use std::path::Path;
use std::process::Command;

use dspark_tests::server::Server;
use dspark_tests::{repo_root, require, smollm2};

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
