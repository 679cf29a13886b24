//! Shutdown that loses nothing, on the real binary: SIGTERM drains (requests in flight finish,
//! the process exits 0), a drain past its grace period ends what is left with an error event
//! and `[DONE]` (a 503 body when not streamed), and the liveness and readiness probes.

use std::path::Path;
use std::time::{Duration, Instant};

use dspark_tests::http::{self, get};
use dspark_tests::server::Server;
use dspark_tests::smollm2;
use serde_json::{Value, json};

fn start(shutdown_timeout: &str) -> Server {
    let model = smollm2();
    Server::start(
        Path::new(env!("CARGO_BIN_EXE_dspark")),
        &["--model", model.to_str().unwrap(), "--served-model-name", "smol", "--shutdown-timeout", shutdown_timeout],
    )
}

fn completion(stream: bool, max_tokens: usize) -> Value {
    json!({"model": "smol", "prompt": "Count:", "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0, "stream": stream})
}

fn post(addr: std::net::SocketAddr, body: &Value) -> http::Response {
    http::send(addr, "POST", "/v1/completions", &[("content-type", "application/json")], body.to_string().as_bytes())
}

/// Waits until `n` requests are running on the engine.
fn wait_running(addr: std::net::SocketAddr, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = get(addr, "/metrics").body;
        let running = text
            .lines()
            .find(|l| l.starts_with("vllm:num_requests_running{"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if running >= n {
            return;
        }
        assert!(Instant::now() < deadline, "{n} requests never ran");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn probes_say_live_and_ready() {
    let server = start("30");
    let live = get(server.addr, "/health/live");
    assert_eq!((live.status, live.json()), (200, json!({"status": "live"})));
    let ready = get(server.addr, "/health/ready");
    assert_eq!((ready.status, ready.json()), (200, json!({"status": "ready"})));
    assert_eq!(get(server.addr, "/health").status, 200);
}

#[test]
fn sigterm_lets_requests_in_flight_finish_then_exits_0() {
    let mut server = start("60");
    let addr = server.addr;
    let streamed = std::thread::spawn(move || post(addr, &completion(true, 48)));
    let plain = std::thread::spawn(move || post(addr, &completion(false, 48)));
    wait_running(addr, 2.0);
    server.signal("TERM");

    let events = streamed.join().unwrap().events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c.get("error").is_none()), "{chunks:?}");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "the stream ran to its end: {last}");
    let plain = plain.join().unwrap();
    assert_eq!(plain.status, 200, "{}", plain.body);
    assert_eq!(plain.json()["usage"]["completion_tokens"], 48);

    let status = server.wait_for_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(std::net::TcpStream::connect(addr).is_err(), "nothing listens after the exit");
}

#[test]
fn a_drain_past_its_grace_ends_the_rest_with_an_error_and_done() {
    let mut server = start("0.5");
    let addr = server.addr;
    let streamed = std::thread::spawn(move || post(addr, &completion(true, 1500)));
    let plain = std::thread::spawn(move || post(addr, &completion(false, 1500)));
    wait_running(addr, 2.0);
    let signalled = Instant::now();
    server.signal("TERM");

    let events = streamed.join().unwrap().events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "server_shutting_down", "{error}");
    assert_eq!(error["error"]["type"], "service_unavailable_error", "{error}");
    let plain = plain.join().unwrap();
    assert_eq!(plain.status, 503, "{}", plain.body);
    assert_eq!(plain.json()["error"]["code"], "server_shutting_down");
    assert_eq!(plain.header("retry-after"), Some("1"));

    let status = server.wait_for_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(signalled.elapsed() < Duration::from_secs(20), "the drain ended at its grace period");
}
