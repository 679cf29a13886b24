//! Bounded work, on the real binary: a slow or idle client is cut off, connections are capped,
//! a request takes its room in the queue before its constraint is compiled, batches are
//! capped, and CORS is sent only when configured.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use dspark_tests::http::{self, get};
use dspark_tests::server::Server;
use dspark_tests::smollm2;
use serde_json::{Value, json};

fn start(extra: &[&str]) -> Server {
    let model = smollm2();
    let mut args = vec!["--model", model.to_str().unwrap(), "--served-model-name", "smol"];
    args.extend_from_slice(extra);
    Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &args)
}

/// Reads until the server closes the connection; what it sent.
fn read_to_close(stream: &mut TcpStream) -> String {
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn metric(addr: SocketAddr, line_start: &str) -> f64 {
    let text = get(addr, "/metrics").body;
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()?.parse().ok()).unwrap_or(0.0)
}

#[test]
fn slow_and_idle_clients_are_cut_off_and_connections_are_capped() {
    let server = start(&["--header-timeout", "1", "--body-timeout", "1", "--max-connections", "2"]);
    let addr = server.addr;

    // A head that never ends: the connection is closed after the header timeout.
    let started = Instant::now();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
    let answer = read_to_close(&mut slow);
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(20), "{took:?}");

    // A body that never ends: 408 in the OpenAI shape.
    let mut trickle = TcpStream::connect(addr).unwrap();
    trickle
        .write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"model\"")
        .unwrap();
    let answer = read_to_close(&mut trickle);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("the request body did not arrive within 1 s"), "{answer:?}");

    // Two idle connections fill the cap: a third is served only once the header timeout
    // has closed them.
    let idle: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    assert_eq!(get(addr, "/health").status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "served before a connection was free: {:?}",
        started.elapsed()
    );
    drop(idle);
    let started = Instant::now();
    assert_eq!(get(addr, "/health").status, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn room_in_the_queue_comes_before_compilation_and_batches_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("models.yaml");
    let yaml = format!(
        "kind: Model\nmetadata: {{name: smol}}\nspec:\n  source: {}\n  config: {{max_queue: 4, max_num_seqs: 1}}\n",
        smollm2().display()
    );
    std::fs::write(&config, yaml).unwrap();
    let server = Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &["--config", config.to_str().unwrap()]);
    let addr = server.addr;
    let prompts: Vec<String> = (0..257).map(|i| format!("p{i}")).collect();
    let r = http::post_json(addr, "/v1/completions", &json!({"model": "smol", "prompt": prompts, "max_tokens": 1}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "prompt");
    assert_eq!(r.json()["error"]["message"], "`prompt` batches 257 prompts; at most 256 are accepted per request");
    // Three prompts of two choices each could never fit a queue of 4: a 400, not a 429.
    let r = http::post_json(
        addr,
        "/v1/completions",
        &json!({"model": "smol", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 1}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "n");
    assert_eq!(r.json()["error"]["message"], "this request asks for 6 sequences; this model runs at most 4 at once");

    // A compilation is counted (so the count below is a real reading).
    let warm = json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}}});
    assert_eq!(http::post_json(addr, "/v1/chat/completions", &warm).status, 200);
    assert!(metric(addr, "dspark_constraint_compile_seconds_count{") >= 1.0);

    // Fill the queue, then ask with a schema never seen: 429 at once, and no compilation.
    let long =
        |i: usize| json!({"model": "smol", "prompt": format!("Count {i}:"), "max_tokens": 400, "ignore_eos": true});
    let running: Vec<_> = (0..4)
        .map(|i| {
            let body = long(i);
            std::thread::spawn(move || http::post_json(addr, "/v1/completions", &body).status)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(addr, "vllm:num_requests_running{") + metric(addr, "vllm:num_requests_waiting{") < 4.0 {
        assert!(Instant::now() < deadline, "the queue never filled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let compiles = metric(addr, "dspark_constraint_compile_seconds_count{");
    let schema = json!({"type": "object", "properties": {"fresh": {"type": "integer"}}, "required": ["fresh"]});
    let r = http::post_json(
        addr,
        "/v1/chat/completions",
        &json!({"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
    );
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(metric(addr, "dspark_constraint_compile_seconds_count{"), compiles, "nothing was compiled for it");
    drop(server);
    for t in running {
        let _ = t.join();
    }
}

#[test]
fn cors_only_when_configured() {
    let server = start(&["--cors-allow-origin", "https://app.example"]);
    let r = http::send(server.addr, "GET", "/v1/models", &[("origin", "https://app.example")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"));
    let preflight = http::send(
        server.addr,
        "OPTIONS",
        "/v1/chat/completions",
        &[
            ("origin", "https://app.example"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization,content-type"),
        ],
        b"",
    );
    assert_eq!(preflight.status, 200, "{}", preflight.body);
    assert_eq!(preflight.header("access-control-allow-origin"), Some("https://app.example"));
    let other = http::send(server.addr, "GET", "/v1/models", &[("origin", "https://evil.example")], b"");
    assert_eq!(other.header("access-control-allow-origin"), None);
    drop(server);

    let plain = start(&[]);
    let r = http::send(plain.addr, "GET", "/v1/models", &[("origin", "https://app.example")], b"");
    assert_eq!(r.header("access-control-allow-origin"), None::<&str>);
    let _: Value = r.json();
}
