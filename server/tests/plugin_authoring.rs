//! A plugin author's path, as the guide tells it: from an empty folder outside the repository,
//! `dspark plugins new`, `dspark plugins build --install`, then requests through `dspark serve`
//! on the Qwen2.5 model (152k vocabulary) and a check with the Llama-3 tokenizer. Then the
//! ways it goes wrong: a bad update keeps the working version serving, a plugin that failed to
//! load is named with the reason.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use dspark_tests::http::{get, post_json};
use dspark_tests::server::Server;
use dspark_tests::{qwen25, tokenizer_json};
use serde_json::{Value, json};

fn dspark(args: &[&str], cwd: &Path, target_dir: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_dspark"))
        .args(args)
        .current_dir(cwd)
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .expect("run dspark");
    eprintln!(
        "$ dspark {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Where the authored crate's build goes: beside the workspace's build when CI names one
/// (repeated runs reuse it), else inside the crate.
fn target_dir(crate_dir: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d).join("authored-plugins"),
        None => crate_dir.join("target"),
    }
}

fn wait_for(addr: std::net::SocketAddr, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let plugins = get(addr, "/v1/plugins").json();
        if ok(&plugins) {
            return plugins;
        }
        assert!(Instant::now() < deadline, "{what}: {plugins}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn plugin<'a>(plugins: &'a Value, name: &str) -> Option<&'a Value> {
    plugins["data"].as_array()?.iter().find(|p| p["name"] == name)
}

#[test]
fn a_new_plugin_from_an_empty_folder_to_served_answers() {
    let llama3 = tokenizer_json("llama3");
    let qwen_tokenizer = tokenizer_json("qwen2.5");
    let qwen = qwen25();
    let work = tempfile::tempdir().unwrap();
    let registry = work.path().join("registry");
    let crate_dir = work.path().join("isodate");
    let target = target_dir(&crate_dir);

    // 1. The crate: the SDK is inside it, nothing points into the repository.
    let out = dspark(&["plugins", "new", "isodate", "--kind", "iso-date"], work.path(), &target);
    assert!(out.status.success());
    assert_eq!(stdout(&out).lines().next(), Some("wrote ./isodate: a plugin serving `iso-date`"));
    let cargo_toml = std::fs::read_to_string(crate_dir.join("Cargo.toml")).unwrap();
    assert!(cargo_toml.contains("path = \"vendor/dspark-guest\""), "{cargo_toml}");
    assert!(!cargo_toml.contains(env!("CARGO_MANIFEST_DIR")));

    // 2. Built with the plugin profile, initialised with both vocabularies, installed.
    let (llama3_arg, qwen_arg) = (llama3.to_str().unwrap(), qwen_tokenizer.to_str().unwrap());
    let registry_arg = registry.to_str().unwrap();
    let out = dspark(
        &["plugins", "build", "--install", registry_arg, "--tokenizer", llama3_arg, "--tokenizer", qwen_arg],
        &crate_dir,
        &target,
    );
    assert!(out.status.success());
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("built ") && lines[0].contains("wasm32-wasip2/plugin/dspark-plugins/isodate"),
        "{text}"
    );
    assert!(lines[1].starts_with("ok: isodate 0.1.0 serves iso-date (sha256 "), "{text}");
    for (line, vocab) in [(lines[2], "(128256 tokens)"), (lines[3], "(151646 tokens)")] {
        assert!(line.starts_with("ok: init with ") && line.contains(vocab), "{text}");
        assert!(line.ends_with("MiB of linear memory of its 256 MiB limit"), "{text}");
    }
    assert_eq!(lines[4], format!("installed {}", registry.join("isodate").display()));
    let manifest = std::fs::read_to_string(registry.join("isodate/plugin.toml")).unwrap();
    assert!(manifest.contains("kinds = [\"iso-date\"]"), "{manifest}");

    // 3. The Llama-3 tokenizer through a real matcher.
    let registry_flag = ["--plugins-dir", registry_arg];
    let check = |text: &str| {
        let mut args = vec!["constraint", "check", "--plugin", "isodate", "--kind", "iso-date", "--source", ""];
        args.extend(registry_flag);
        args.extend(["--options", r#"{"max_len": 8}"#, "--tokenizer", llama3_arg, "--text", text]);
        dspark(&args, work.path(), &target)
    };
    let accepted = check("hello");
    assert!(accepted.status.success() && stdout(&accepted).ends_with("result: accepted\n"));
    let refused = check("Hello");
    assert!(!refused.status.success() && stdout(&refused).contains("REJECTED"));

    // 4. Served on the Qwen2.5 model: the answer obeys the plugin.
    let server = Server::start_with_plugins(
        Path::new(env!("CARGO_BIN_EXE_dspark")),
        &registry,
        &["--model", qwen.to_str().unwrap(), "--served-model-name", "qwen"],
    );
    let addr = server.addr;
    let ask = |plugin: &str| {
        let body = json!({
            "model": "qwen", "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "user", "content": "Name a fruit in one lowercase word."}],
            "response_format": {"type": "plugin", "plugin": plugin, "kind": "iso-date", "source": "", "options": {"max_len": 8}},
        });
        post_json(addr, "/v1/chat/completions", &body)
    };
    let r = ask("isodate");
    assert_eq!(r.status, 200, "{}", r.body);
    let answer = r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    assert!((1..=8).contains(&answer.len()) && answer.bytes().all(|b| b.is_ascii_lowercase()), "{answer:?}");

    // 5. A bad update (kinds that differ from the component's) is refused, and the working
    // version keeps serving and says so.
    let installed = registry.join("isodate/plugin.toml");
    std::fs::write(&installed, manifest.replace("kinds = [\"iso-date\"]", "kinds = [\"iso-time\"]")).unwrap();
    let plugins = wait_for(addr, "the refused update is reported", |p| {
        plugin(p, "isodate").is_some_and(|p| p.get("update_error").is_some())
    });
    let entry = plugin(&plugins, "isodate").unwrap();
    assert_eq!(entry["status"], "ready");
    let why = entry["update_error"].as_str().unwrap();
    assert!(why.contains("declares kinds [\"iso-time\"] but the component serves [\"iso-date\"]"), "{why}");
    let r = ask("isodate");
    assert_eq!(r.status, 200, "the last good version serves: {}", r.body);
    assert_eq!(r.json()["choices"][0]["message"]["content"].as_str(), Some(answer.as_str()));

    // 6. A plugin that never loaded is named with the check that failed.
    let broken = registry.join("broken");
    std::fs::create_dir(&broken).unwrap();
    std::fs::copy(registry.join("isodate/plugin.wasm"), broken.join("plugin.wasm")).unwrap();
    let sha = manifest.lines().find_map(|l| l.strip_prefix("sha256 = ")).unwrap().trim_matches('"').to_string();
    let stale = manifest.replace("name = \"isodate\"", "name = \"broken\"").replace(&sha, &"0".repeat(64));
    std::fs::write(broken.join("plugin.toml"), stale).unwrap();
    wait_for(addr, "the broken plugin is listed", |p| plugin(p, "broken").is_some());
    let r = ask("broken");
    assert_eq!(r.status, 503, "{}", r.body);
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert_eq!(
        message,
        format!(
            "plugin `broken` is installed but failed to load: plugin `broken`: plugin.wasm has sha256 {sha}, the \
             manifest says {}; fix or replace it in the plugin directory",
            "0".repeat(64)
        )
    );
}

/// The tutorial of docs/plugins.md, as written: its Rust blocks joined are the `src/lib.rs` of
/// a crate from `plugins new`; its tests pass and it builds into a plugin that loads.
#[test]
fn the_tutorial_builds_and_its_tests_pass() {
    let doc = std::fs::read_to_string(dspark_tests::repo_root().join("docs/plugins.md")).unwrap();
    let start = doc.find("## Tutorial: a plugin from nothing").expect("the tutorial");
    let end = doc[start..].find("### 5. Build and install").expect("its build section") + start;
    let mut code = String::new();
    for block in doc[start..end].split("```rust\n").skip(1) {
        code.push_str(block.split("```").next().unwrap());
        code.push('\n');
    }
    assert!(code.contains("impl Recognizer for HexColor") && code.contains("mod tests"), "{code}");

    let work = tempfile::tempdir().unwrap();
    let crate_dir = work.path().join("hexcolor");
    let target = target_dir(&crate_dir);
    assert!(dspark(&["plugins", "new", "hexcolor", "--kind", "hexcolor"], work.path(), &target).status.success());
    std::fs::write(crate_dir.join("src/lib.rs"), code).unwrap();

    let out = Command::new("cargo")
        .arg("test")
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo test");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for test in ["colours", "no_prefix_is_a_dead_end", "options_name_the_field"] {
        assert!(text.contains(&format!("test tests::{test} ... ok")), "{text}");
    }

    let llama3 = tokenizer_json("llama3");
    let out = dspark(&["plugins", "build", "--tokenizer", llama3.to_str().unwrap()], &crate_dir, &target);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.contains("ok: hexcolor 0.1.0 serves hexcolor (sha256 "), "{text}");
    assert!(text.contains("(128256 tokens)"), "{text}");
}
