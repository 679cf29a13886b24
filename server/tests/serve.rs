//! `dspark serve` end to end: the real binary on the real SmolLM2 model with the real plugins,
//! over HTTP.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::time::{Duration, Instant};

use dspark_host::engine::ModelTokenizer;
use dspark_host::engine::gguf::GgufFile;
use dspark_tests::http::{self, get, post_json};
use dspark_tests::server::Server;
use dspark_tests::{qwen25, smollm2};
use serde_json::{Value, json};

const MODEL: &str = "smol";

fn start(extra: &[&str]) -> Server {
    let model = smollm2();
    let mut args = vec!["--model", model.to_str().unwrap(), "--served-model-name", MODEL];
    args.extend_from_slice(extra);
    Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &args)
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Describe a person."}], "temperature": 0, "max_tokens": 120});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// POSTs a streaming chat request; checks the status and content type; returns the events.
fn stream(addr: std::net::SocketAddr, body: &Value) -> Vec<String> {
    let response = post_raw(addr, body);
    assert_eq!(response.status, 200);
    assert!(response.header("content-type").unwrap().starts_with("text/event-stream"));
    response.events()
}

/// POSTs a chat request and returns the raw response (for error statuses).
fn post_raw(addr: std::net::SocketAddr, body: &Value) -> http::Response {
    http::send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn content(response: &Value) -> &str {
    response["choices"][0]["message"]["content"].as_str().unwrap()
}

fn assert_error(response: &http::Response, status: u16, param: Option<&str>, message_part: &str) {
    assert_eq!(response.status, status, "{}", response.body);
    let body = response.json();
    let error = &body["error"];
    assert!(error["message"].as_str().unwrap().contains(message_part), "{} lacks {message_part:?}", error["message"]);
    assert!(error["type"].is_string());
    assert_eq!(error["param"].as_str(), param, "{body}");
}

#[test]
fn structured_outputs_validate_and_stream() {
    let server = start(&[]);
    let addr = server.addr;

    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
        "required": ["name", "age"],
        "additionalProperties": false,
    });
    let format = json!({"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": true}});
    let r = post_json(addr, "/v1/chat/completions", &chat(json!({"response_format": format}))).json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    let person: Value = serde_json::from_str(content(&r)).unwrap();
    assert!(jsonschema::is_valid(&schema, &person), "{person} does not validate");
    // Key names and punctuation were fast-forwarded (`dspark: true`, the default).
    let forced = metric(addr, &format!("dspark_fast_forward_tokens_total{{model_name=\"{MODEL}\"}}"));
    assert!(forced > 0.0, "no fast-forward tokens counted");
    assert!(r["usage"]["completion_tokens"].as_f64().unwrap() > forced, "forced tokens are part of the completion");
    // The first step computes the whole prompt (nothing cached yet), every later one at least
    // the token sampled before it; fast-forwarded tokens were sampled in no step of their own.
    let steps = metric(addr, &format!("dspark_steps_total{{model_name=\"{MODEL}\"}}"));
    let rows = metric(addr, &format!("dspark_step_rows_total{{model_name=\"{MODEL}\"}}"));
    let (prompt, completion) =
        (r["usage"]["prompt_tokens"].as_f64().unwrap(), r["usage"]["completion_tokens"].as_f64().unwrap());
    assert!(steps >= 1.0 && steps <= completion - forced, "{steps} steps for {completion} tokens, {forced} forced");
    assert!(rows >= prompt + steps - 1.0, "{rows} rows in {steps} steps for a prompt of {prompt} tokens");
    assert!(metric(addr, &format!("dspark_step_microseconds_total{{model_name=\"{MODEL}\"}}")) > 0.0);
    assert_eq!(
        r["usage"]["total_tokens"],
        r["usage"]["prompt_tokens"].as_u64().unwrap() + r["usage"]["completion_tokens"].as_u64().unwrap()
    );
    // The same request again walks the path tree the first one grew: the same answer, served
    // from the cache (hits), with the masks computed during the forward pass.
    let hits = |addr| metric(addr, &format!("dspark_path_tree_hits_total{{model_name=\"{MODEL}\"}}"));
    let hits_before = hits(addr);
    let again = post_json(addr, "/v1/chat/completions", &chat(json!({"response_format": format}))).json();
    assert_eq!(content(&again), content(&r));
    assert!(hits(addr) > hits_before, "the second walk made no path-tree hit");
    assert!(metric(addr, &format!("dspark_masks_total{{model_name=\"{MODEL}\"}}")) > 0.0);
    assert!(metric(addr, &format!("dspark_mask_wait_seconds_total{{model_name=\"{MODEL}\"}}")) >= 0.0);

    let r = post_json(addr, "/v1/chat/completions", &chat(json!({"response_format": {"type": "json_object"}}))).json();
    if r["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(content(&r)).unwrap().is_object());
    } else {
        assert_eq!(r["choices"][0]["finish_reason"], "length");
    }

    let r =
        post_json(addr, "/v1/chat/completions", &chat(json!({"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}})))
            .json();
    let text = content(&r);
    assert!(
        text.len() == 8 && text.as_bytes()[3] == b'-' && text.chars().filter(char::is_ascii_digit).count() == 7,
        "{text}"
    );

    // dspark's extension: any installed plugin by name, kind and source.
    let plugin =
        json!({"response_format": {"type": "plugin", "plugin": "regex", "kind": "regex", "source": "(ab|cd){2}!"}});
    let r = post_json(addr, "/v1/chat/completions", &chat(plugin)).json();
    let text = content(&r);
    assert!(["abab!", "abcd!", "cdab!", "cdcd!"].contains(&text), "{text}");
    let unknown = json!({"response_format": {"type": "plugin", "plugin": "nope", "kind": "x"}});
    let r = post_json(addr, "/v1/chat/completions", &chat(unknown));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["param"], "response_format.plugin");

    for field in [json!({"structured_outputs": {"choice": ["yes", "no"]}}), json!({"guided_choice": ["yes", "no"]})] {
        let r = post_json(addr, "/v1/chat/completions", &chat(field)).json();
        assert!(["yes", "no"].contains(&content(&r)), "{r}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }

    // Streaming with usage: the deltas add up to the text; the usage chunk comes before [DONE].
    let body = chat(
        json!({"stream": true, "stream_options": {"include_usage": true}, "max_tokens": 24, "response_format": format}),
    );
    let events = stream(addr, &body);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let finish = chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap();
    let completion_tokens = usage["usage"]["completion_tokens"].as_u64().unwrap();
    match finish {
        "stop" => assert!(jsonschema::is_valid(&schema, &serde_json::from_str(&text).unwrap()), "{text}"),
        "length" => assert_eq!(completion_tokens, 24),
        other => panic!("finish_reason {other}"),
    }
    assert!(completion_tokens > 0 && completion_tokens <= 24);
    assert!(text.starts_with('{'), "{text}");

    // A fast-forwarded span reaches a streaming client as one delta: with logprobs on, some
    // delta carries several tokens (the sampled one and the forced ones after it).
    let body = chat(json!({"stream": true, "logprobs": true, "max_tokens": 40, "response_format": format}));
    let events = stream(addr, &body);
    let widest = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().map(Vec::len))
        .max()
        .unwrap_or(0);
    assert!(widest >= 2, "no delta carried a multi-token span");

    // Log-probabilities: one entry per completion token, alternatives best first.
    let r =
        post_json(addr, "/v1/chat/completions", &chat(json!({"logprobs": true, "top_logprobs": 3, "max_tokens": 6})))
            .json();
    let entries = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(entries.len(), 6);
    for e in entries {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], e["token"], "greedy picks the best alternative");
        assert!(top[0]["logprob"].as_f64().unwrap() >= top[1]["logprob"].as_f64().unwrap());
    }

    // Completions, n > 1 with a seed, and /v1/models, /v1/plugins, /health.
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "n": 2, "seed": 3}),
    )
    .json();
    assert_eq!(r["choices"].as_array().unwrap().len(), 2);
    assert_eq!(r["usage"]["completion_tokens"], 16);
    let r = post_json(addr, "/v1/completions", &json!({"model": MODEL, "prompt": "Hi", "n": 2, "best_of": 3}));
    assert_error(&r, 400, Some("best_of"), "`best_of` other than `n` is not supported (got 3)");
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 2, "n": 2, "best_of": 2}),
    );
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 2);
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hi", "stream_options": {"include_usage": true}}),
    );
    assert_error(&r, 400, Some("stream_options"), "only allowed with `stream: true`");
    assert_eq!(get(addr, "/v1/models").json()["data"][0]["id"], MODEL);
    let plugins = get(addr, "/v1/plugins").json();
    assert!(plugins["data"].as_array().unwrap().iter().any(|p| p["name"] == "json-schema"));
    assert_eq!(get(addr, "/health").status, 200);
    let metrics = get(addr, "/metrics").body;
    assert!(
        metrics.contains(&format!("vllm:request_success_total{{model_name=\"{MODEL}\",finished_reason=\"stop\"}}")),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("dspark_validation_failures_total{{model_name=\"{MODEL}\"}} 0")));
}

/// Several keys (flags and a key file), `Bearer` in any case, and `/metrics` behind the key
/// when asked; the health probes stay open.
#[test]
fn api_keys_from_flags_and_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys");
    std::fs::write(&file, "# one per line\nfrom-file\n").unwrap();
    let server = start(&[
        "--api-key",
        "first",
        "--api-key",
        "second",
        "--api-key-file",
        file.to_str().unwrap(),
        "--metrics-require-key",
    ]);
    let addr = server.addr;
    let models = |authorization: &str| http::send(addr, "GET", "/v1/models", &[("authorization", authorization)], b"");
    for header in ["Bearer first", "bearer second", "BEARER from-file"] {
        assert_eq!(models(header).status, 200, "{header}");
    }
    // The model's file name, not where it lives on the server.
    assert_eq!(models("Bearer first").json()["data"][0]["root"], "SmolLM2-135M-Instruct.Q4_1.gguf");
    assert_error(&models("Bearer third"), 401, None, "Incorrect API key provided.");
    assert_error(&models("Basic Zmlyc3Q="), 401, None, "Missing API key");
    assert_error(&get(addr, "/metrics"), 401, None, "Missing API key");
    let metrics = http::send(addr, "GET", "/metrics", &[("authorization", "Bearer first")], b"");
    assert_eq!(metrics.status, 200);
    assert!(metrics.body.contains("vllm:num_requests_running"));
    for probe in ["/health", "/health/live", "/health/ready"] {
        assert_eq!(get(addr, probe).status, 200, "{probe} needs no key");
    }
}

#[test]
fn errors_use_the_openai_shape_and_status() {
    let server = start(&["--max-model-len", "64", "--api-key", "sesame", "--max-body-bytes", "4096"]);
    let addr = server.addr;
    let auth = [("content-type", "application/json"), ("authorization", "Bearer sesame")];
    let post = |body: &str| http::send(addr, "POST", "/v1/chat/completions", &auth, body.as_bytes());

    let r = http::send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        chat(json!({})).to_string().as_bytes(),
    );
    assert_error(&r, 401, None, "API key");
    let r = http::send(addr, "POST", "/v1/chat/completions", &[("authorization", "Bearer wrong")], b"{}");
    assert_error(&r, 401, None, "Incorrect API key");
    assert_eq!(get(addr, "/health").status, 200, "health needs no key");

    let mut unknown = chat(json!({}));
    unknown["model"] = json!("gpt-9");
    let r = post(&unknown.to_string());
    assert_error(&r, 404, Some("model"), "gpt-9");
    assert_eq!(r.json()["error"]["code"], "model_not_found");

    assert_error(&post("{\"model\": "), 400, None, "not valid JSON");
    assert_error(&post(&chat(json!({"temperature": "hot"})).to_string()), 400, Some("temperature"), "temperature");
    assert_error(
        &post(&chat(json!({"messages": [{"role": "wizard", "content": "x"}]})).to_string()),
        400,
        Some("messages[0].role"),
        "wizard",
    );
    assert_error(&post(&chat(json!({"top_p": 2.0})).to_string()), 400, Some("top_p"), "top_p");
    let bad_schema = json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"type": "strnig"}}}}}});
    let r = post(&chat(bad_schema).to_string());
    assert_error(&r, 400, Some("response_format.json_schema.schema"), "strnig");
    // Strict mode refuses what the plugin can only approximate; without it the request runs.
    let approximated = json!({"type": "array", "items": {"type": "array"}, "uniqueItems": true});
    let with_strict = |strict: Value| {
        chat(
            json!({"max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": strict, "schema": approximated}}}),
        )
    };
    let r = post(&with_strict(json!(true)).to_string());
    assert_error(
        &r,
        400,
        Some("response_format.json_schema.schema"),
        "invalid json-schema constraint at #/uniqueItems: strict mode: `uniqueItems` is not enforced",
    );
    assert!(
        r.json()["error"]["message"].as_str().unwrap().ends_with("; without strict mode this is served as a warning")
    );
    assert_eq!(post(&with_strict(json!(false)).to_string()).status, 200);
    let r = post(&with_strict(json!("yes")).to_string());
    assert_error(&r, 400, Some("response_format.json_schema.strict"), "must be a boolean");
    let r = post(&chat(json!({"structured_outputs": {"regex": "(unclosed"}})).to_string());
    assert_error(&r, 400, Some("structured_outputs.regex"), "regex");
    // Constraints that no output satisfies are refused up front, not served into a dead end.
    let r = post(&chat(json!({"structured_outputs": {"regex": "x*[^\\s\\S]"}})).to_string());
    assert_error(&r, 400, Some("structured_outputs.regex"), "the regex matches no text at all");
    let contradictory = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 3}}, "required": ["n"]});
    let r = post(
        &chat(
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": contradictory}}}),
        )
        .to_string(),
    );
    assert_error(&r, 400, Some("response_format.json_schema.schema"), "the schema admits no value");
    let r = post(&chat(json!({"structured_outputs": {"regex": "a"}, "guided_choice": ["b"]})).to_string());
    assert_error(&r, 400, Some("guided_choice"), "only one output constraint");

    let long = "word ".repeat(80);
    let r = post(&chat(json!({"messages": [{"role": "user", "content": long}]})).to_string());
    assert_error(&r, 400, Some("messages"), "maximum context length is 64 tokens");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("the prompt has"));

    let huge = chat(json!({"messages": [{"role": "user", "content": "x".repeat(5000)}]}));
    assert_error(&post(&huge.to_string()), 413, None, "4096 bytes");
}

fn metric(addr: std::net::SocketAddr, line_start: &str) -> f64 {
    let body = get(addr, "/metrics").body;
    body.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_classic_path_and_a_client_that_disconnects() {
    // `--no-dspark`: the same guarantees, every token sampled, nothing fast-forwarded.
    let server = start(&["--no-dspark"]);
    let addr = server.addr;
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "n", "schema": schema}});
    let r = post_json(addr, "/v1/chat/completions", &chat(json!({"response_format": format}))).json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    assert!(jsonschema::is_valid(&schema, &serde_json::from_str(content(&r)).unwrap()));
    assert_eq!(metric(addr, &format!("dspark_fast_forward_tokens_total{{model_name=\"{MODEL}\"}}")), 0.0);
    assert_eq!(get(addr, "/v1/models").json()["data"][0]["dspark"]["dspark"], false);
    assert_bias_picks_the_choice(addr);
    assert_narrowing_yields_to_the_choice(addr);

    let body = chat(json!({"stream": true, "max_tokens": 400, "ignore_eos": true}));
    let mut stream = http::open(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    );
    {
        let mut reader = BufReader::new(&mut stream);
        let (status, _) = http::read_head(&mut reader);
        assert_eq!(status, 200);
        let mut seen = 0;
        let mut line = String::new();
        while seen < 3 {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line.contains("\"content\"") {
                seen += 1;
            }
        }
    }
    assert!(metric(addr, "vllm:num_requests_running{") >= 1.0);
    drop(stream);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let aborted =
            metric(addr, &format!("vllm:request_success_total{{model_name=\"{MODEL}\",finished_reason=\"abort\"}}"));
        if aborted == 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the disconnected request was not cancelled");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(addr, "vllm:num_requests_running{"), 0.0);
    assert_eq!(metric(addr, "vllm:kv_cache_usage_perc{"), 0.0);
}

#[test]
fn config_edits_reload_models_while_requests_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("models.yaml");
    let smol = smollm2();
    let entry = |name: &str, path: &Path, extra: &str| {
        format!(
            "apiVersion: gpustack.gg/v1alpha1\nkind: Model\nmetadata:\n  name: {name}\nspec:\n  source: file:{}\n  engine: dspark\n  replicas: 1\n  config:\n    dspark: true\n    max_num_seqs: 4\n    max_queue: 2\n{extra}",
            path.display()
        )
    };
    std::fs::write(&config, entry("a", &smol, "")).unwrap();
    let server = Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &["--config", config.to_str().unwrap()]);
    let addr = server.addr;
    let ask = |model: &str, max_tokens: u64| {
        let body =
            json!({"model": model, "prompt": "Count:", "max_tokens": max_tokens, "ignore_eos": true, "temperature": 0});
        post_json(addr, "/v1/completions", &body)
    };
    assert_eq!(ask("a", 2).status, 200);

    // Waits until `n` requests of model `a` are running. Polled rather than slept for: the
    // engine's speed must not decide whether the requests overlap (at 150 tokens, the long
    // request once finished before the third was sent).
    let running = |n: f64| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while metric(addr, "vllm:num_requests_running{model_name=\"a\"}") < n {
            assert!(Instant::now() < deadline, "{n} requests never ran at once");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // A long request runs on the old engine while the entry reloads.
    let long = std::thread::spawn(move || {
        let body = json!({"model": "a", "prompt": "Count:", "max_tokens": 1000, "ignore_eos": true});
        post_json(addr, "/v1/completions", &body)
    });
    running(1.0);
    // Queue limit: max_queue 2 -> a third concurrent request gets 429.
    let second = std::thread::spawn(move || {
        let body = json!({"model": "a", "prompt": "Count:", "max_tokens": 600, "ignore_eos": true});
        post_json(addr, "/v1/completions", &body)
    });
    running(2.0);
    let third = ask("a", 4);
    assert_error(&third, 429, None, "already queued");
    assert!(third.header("retry-after").is_some());

    // Edit: `a` changes (reloads, sharing the loaded weights), `b` (another file) appears.
    let qwen = qwen25();
    let text = format!("{}\n---\n{}", entry("a", &smol, "    max_model_len: 1024\n"), entry("b", &qwen, ""));
    std::fs::write(&config, text).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut saw_loading = false;
    loop {
        let r = ask("b", 2);
        match r.status {
            200 => break,
            503 => {
                assert_error(&r, 503, None, "model b is loading");
                assert!(r.header("retry-after").is_some());
                saw_loading = true;
            }
            404 => {} // the watcher has not seen the edit yet
            other => panic!("unexpected {other}: {}", r.body),
        }
        assert!(Instant::now() < deadline, "model b never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(saw_loading, "a 491 MB model should be seen loading");
    let long = long.join().unwrap().json();
    assert_eq!(long["choices"][0]["finish_reason"], "length", "the in-flight request finished: {long}");
    assert_eq!(long["usage"]["completion_tokens"], 1000);
    assert_eq!(second.join().unwrap().status, 200);
    let models = get(addr, "/v1/models").json();
    let a = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "a").unwrap().clone();
    assert_eq!(a["max_model_len"], 1024, "{models}");

    // Removing an entry makes it unknown.
    std::fs::write(&config, entry("a", &smol, "    max_model_len: 1024\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ask("b", 1).status != 404 {
        assert!(Instant::now() < deadline, "model b was not removed");
        std::thread::sleep(Duration::from_millis(100));
    }

    // An edit that cannot load (a missing file) leaves the working configuration serving,
    // and /v1/models says why; every request meanwhile is answered.
    let missing = dir.path().join("missing.gguf");
    std::fs::write(&config, entry("a", &missing, "    max_model_len: 512\n")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert_eq!(ask("a", 1).status, 200, "the previous configuration serves during and after the edit");
        let models = get(addr, "/v1/models").json();
        let a = models["data"].as_array().unwrap().iter().find(|m| m["id"] == "a").unwrap().clone();
        if let Some(error) = a["dspark"]["error"].as_str() {
            assert!(error.contains("missing.gguf"), "{error}");
            assert_eq!((a["dspark"]["status"].as_str(), a["max_model_len"].as_u64()), (Some("ready"), Some(1024)));
            break;
        }
        assert!(Instant::now() < deadline, "the failed edit was not reported: {models}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SmolLM2's chat template has no tool syntax: the server describes the tools in a system
/// message and constrains the answer to the generic `{"tool_calls": [...]}` format, which it
/// turns into OpenAI `tool_calls`; a tool schema the plugin rejects is a 400 at `tools`.
#[test]
fn tool_calls_in_the_generic_format() {
    let server = start(&[]);
    let addr = server.addr;
    let parameters = json!({
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": false,
    });
    let tools = json!([{"type": "function", "function": {"name": "forecast", "parameters": parameters}}]);
    let body = json!({
        "model": MODEL, "temperature": 0, "max_tokens": 80, "tools": tools, "tool_choice": "required",
        "parallel_tool_calls": false, "messages": [{"role": "user", "content": "Weather for Paris over the next three days?"}],
    });
    let r = post_json(addr, "/v1/chat/completions", &body).json();
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    assert!(choice["message"]["content"].is_null(), "{r}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "parallel_tool_calls: false");
    for call in calls {
        assert_eq!(call["type"], "function");
        assert!(call["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(call["function"]["name"], "forecast");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(jsonschema::is_valid(&parameters, &args), "{args} does not validate");
    }

    let mut bad = body.clone();
    bad["tools"][0]["function"]["parameters"] = json!({"type": "object", "properties": {"a": {"type": "strnig"}}});
    let r = post_raw(addr, &bad);
    assert_error(&r, 400, Some("tools"), "/tools/0/function/parameters");
    // A strict tool whose parameters are only approximated is refused, naming that tool; the
    // same tools without `strict` are served.
    let mut strict = body.clone();
    let approximated = json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "array"}, "uniqueItems": true}}});
    strict["tools"] = json!([tools[0], {"type": "function", "function": {"name": "tag", "strict": true, "parameters": approximated}}]);
    let r = post_raw(addr, &strict);
    assert_error(
        &r,
        400,
        Some("tools"),
        "invalid tool-call constraint at /tools/1/function/parameters#/properties/tags/uniqueItems: tool `tag`: strict mode",
    );
    strict["tools"][1]["function"]["strict"] = json!(false);
    assert_eq!(post_raw(addr, &strict).status, 200);
    strict["tools"][1]["function"]["strict"] = json!(1);
    assert_error(&post_raw(addr, &strict), 400, Some("tools[1].function.strict"), "must be a boolean");
    let mut both = body.clone();
    both["response_format"] = json!({"type": "json_object"});
    let r = post_raw(addr, &both);
    assert_error(&r, 400, Some("tool_choice"), "cannot be combined with `response_format`");
}

/// Grammars through the API: Lark in `structured_outputs.grammar`, GBNF in `guided_grammar`;
/// answers are sentences of their grammar (checked with the grammar crate natively), and a
/// syntax error is a 400 with its line and column.
#[test]
fn grammars_in_both_syntaxes() {
    let server = start(&[]);
    let addr = server.addr;
    let fixture = |name: &str| {
        std::fs::read_to_string(format!("{}/../constraints/grammar/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR")))
            .unwrap()
    };
    let cases = [
        ("lark", fixture("arithmetic.lark"), json!({"structured_outputs": {"grammar": fixture("arithmetic.lark")}})),
        ("gbnf", fixture("csv3.gbnf"), json!({"guided_grammar": fixture("csv3.gbnf")})),
        ("lark", fixture("sql.lark"), json!({"structured_outputs": {"grammar": fixture("sql.lark")}})),
    ];
    for (kind, grammar, fields) in cases {
        let mut body = chat(fields);
        body["max_tokens"] = json!(60);
        body["messages"] = json!([{"role": "user", "content": "Write one example."}]);
        let r = post_json(addr, "/v1/chat/completions", &body).json();
        let text = content(&r).to_string();
        let rec = dspark_plugin_grammar::compile_recognizer(kind, &grammar).unwrap();
        match r["choices"][0]["finish_reason"].as_str() {
            Some("stop") => assert!(rec.matches(text.as_bytes()), "{kind}: {text:?} is not a sentence"),
            Some("length") => assert!(!text.is_empty()),
            other => panic!("{kind}: finish_reason {other:?}: {r}"),
        }
    }
    let body = chat(json!({"structured_outputs": {"grammar": "start: a\na: \"x\" b\n"}}));
    let r = post_raw(addr, &body);
    assert_error(&r, 400, Some("structured_outputs.grammar"), "at 2:8: `b` is not defined");

    // A grammar that exhausts the plugin is the request's cost, not the plugin's fault: a
    // 400, again at once when repeated, and the plugin keeps serving everyone.
    let deep = format!("start: {}\"a\"{}\n", "(".repeat(300_000), ")".repeat(300_000));
    let body = chat(json!({"structured_outputs": {"grammar": deep}}));
    let r = post_raw(addr, &body);
    assert_error(
        &r,
        400,
        Some("structured_outputs.grammar"),
        "the grammar constraint is too costly to serve: the plugin",
    );
    for _ in 0..3 {
        let r = post_raw(addr, &body);
        assert_error(
            &r,
            400,
            Some("structured_outputs.grammar"),
            "plugin `grammar` refuses this constraint for another",
        );
    }
    let mut body = chat(json!({"structured_outputs": {"grammar": "start: \"yes\" | \"no\"\n"}}));
    body["max_tokens"] = json!(4);
    let r = post_json(addr, "/v1/chat/completions", &body).json();
    assert!(["yes", "no"].contains(&content(&r)), "{r}");
}

/// The SDK tutorial's example plugin (examples/iso-duration), built by scripts/build-plugins.sh,
/// installed into a running server's registry by copying its folder, then used through the
/// `response_format` plugin extension: the answer is an ISO 8601 duration.
#[test]
fn an_example_plugin_installed_into_a_running_server() {
    let registry = tempfile::tempdir().unwrap();
    let model = smollm2();
    let server = dspark_tests::server::Server::start_with_plugins(
        Path::new(env!("CARGO_BIN_EXE_dspark")),
        registry.path(),
        &["--model", model.to_str().unwrap(), "--served-model-name", MODEL],
    );
    let addr = server.addr;
    let source = dspark_tests::example_plugin("iso-duration");
    let target = registry.path().join("iso-duration");
    std::fs::create_dir(&target).unwrap();
    for file in ["plugin.toml", "plugin.wasm"] {
        std::fs::copy(source.join(file), target.join(file)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let plugins = get(addr, "/v1/plugins").json();
        let ready =
            plugins["data"].as_array().unwrap().iter().any(|p| p["name"] == "iso-duration" && p["status"] == "ready");
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "the plugin was not picked up: {plugins}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let format = json!({"type": "plugin", "plugin": "iso-duration", "kind": "iso8601-duration", "source": "", "options": {"max_digits": 3}});
    let mut body = chat(json!({"response_format": format}));
    body["messages"] = json!([{"role": "user", "content": "How long is a marathon for a beginner?"}]);
    body["max_tokens"] = json!(24);
    let r = post_json(addr, "/v1/chat/completions", &body).json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    let text = content(&r);
    use dspark_guest::{Plugin, TokenTable};
    let table = std::sync::Arc::new(TokenTable::byte_level_for_tests(&[]));
    let c = dspark_plugin_iso_duration::IsoDurationPlugin
        .compile("iso8601-duration", "", r#"{"max_digits": 3}"#, &table)
        .unwrap();
    let w = dspark_guest::testing::walk_text(&mut *c.new_matcher(), &table, text.as_bytes());
    assert!(w.accepted(), "{text:?} is not an ISO 8601 duration");
}

/// JSON layouts through the API: vLLM's `whitespace_pattern`, and the json-schema plugin's
/// `indent` through the plugin extension (the answer is exactly serde_json's pretty form).
#[test]
fn json_layouts_through_the_api() {
    let server = start(&[]);
    let addr = server.addr;
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false});
    let r = post_json(
        addr,
        "/v1/chat/completions",
        &chat(json!({"structured_outputs": {"json": schema, "whitespace_pattern": "[ ]?"}})),
    )
    .json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    let v: Value = serde_json::from_str(content(&r)).unwrap();
    assert!(jsonschema::is_valid(&schema, &v));
    assert!(!content(&r).contains("  ") && !content(&r).contains('\n'), "{}", content(&r));
    let format = json!({"type": "plugin", "plugin": "json-schema", "kind": "json-schema", "source": schema.to_string(), "options": {"indent": 2}});
    let r = post_json(addr, "/v1/chat/completions", &chat(json!({"response_format": format}))).json();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    let text = content(&r);
    let v: Value = serde_json::from_str(text).unwrap();
    assert_eq!(text, serde_json::to_string_pretty(&v).unwrap());
    let bad = chat(json!({"structured_outputs": {"regex": "a+", "whitespace_pattern": " ?"}}));
    let r = post_raw(addr, &bad);
    assert_error(&r, 400, Some("structured_outputs.whitespace_pattern"), "applies to JSON output");
}

#[test]
fn path_tree_guesses_save_steps_without_changing_answers() {
    // Records whose key names the plugin forces up to the held-back `":"`: the token the model
    // writes there repeats from record to record, so the path tree guesses it and the engine
    // feeds it ahead of sampling. Greedy answers must be the classic path's, byte for byte.
    let record = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "country": {"type": "string", "maxLength": 16}}, "required": ["city", "country"], "additionalProperties": false});
    let schema = json!({"type": "object", "properties": {"places": {"type": "array", "items": record, "minItems": 4, "maxItems": 4}}, "required": ["places"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "places", "schema": schema}});
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "List four cities and their countries as JSON."}], "temperature": 0, "max_tokens": 200, "response_format": format});

    let classic = start(&["--no-dspark"]);
    let expected = post_json(classic.addr, "/v1/chat/completions", &body).json();
    drop(classic);
    assert_eq!(expected["choices"][0]["finish_reason"], "stop", "{expected}");
    let expected = content(&expected).to_string();
    assert!(jsonschema::is_valid(&schema, &serde_json::from_str(&expected).unwrap()), "{expected}");

    // The record index is part of the plugin's state (the count is bounded), so a state's
    // streak grows across requests: the third one is guessed.
    let server = start(&[]);
    for _ in 0..3 {
        let r = post_json(server.addr, "/v1/chat/completions", &body).json();
        assert_eq!(content(&r), expected, "{r}");
    }
    let fed = metric(server.addr, &format!("dspark_speculated_tokens_total{{model_name=\"{MODEL}\"}}"));
    let kept = metric(server.addr, &format!("dspark_speculated_accepted_total{{model_name=\"{MODEL}\"}}"));
    assert!(kept > 0.0 && kept <= fed, "guesses fed {fed}, kept {kept}");
}

#[test]
fn masked_logits_skip_most_of_the_output_projection_without_changing_answers() {
    // Two entries over one model, masked logits on and off: greedy and seeded answers, with
    // their log-probabilities, must be the same byte for byte (a mask makes the skipped
    // logits -inf anyway), while the masks let the projection skip most of the vocabulary.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("models.yaml");
    let entry = |name: &str, masked: bool| {
        format!(
            "apiVersion: gpustack.gg/v1alpha1\nkind: Model\nmetadata:\n  name: {name}\nspec:\n  source: file:{}\n  engine: dspark\n  config:\n    masked_logits: {masked}\n",
            smollm2().display()
        )
    };
    std::fs::write(&config, format!("{}---\n{}", entry("masked", true), entry("full", false))).unwrap();
    let server = Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &["--config", config.to_str().unwrap()]);
    let record = json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "role": {"enum": ["admin", "user", "guest"]}}, "required": ["name", "age", "role"], "additionalProperties": false});
    let schema = json!({"type": "object", "properties": {"people": {"type": "array", "items": record, "minItems": 3, "maxItems": 3}}, "required": ["people"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "people", "schema": schema}});
    for (temperature, seed) in [(0.0, 0), (0.8, 1), (0.8, 2)] {
        let ask = |model: &str| {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "List three users with their ages and roles as JSON."}], "temperature": temperature, "seed": seed, "max_tokens": 160, "logprobs": true, "top_logprobs": 3, "response_format": format});
            post_json(server.addr, "/v1/chat/completions", &body).json()
        };
        let (masked, full) = (ask("masked"), ask("full"));
        assert_eq!(masked["choices"][0]["message"], full["choices"][0]["message"], "T={temperature} seed {seed}");
        assert_eq!(masked["choices"][0]["logprobs"], full["choices"][0]["logprobs"], "T={temperature} seed {seed}");
        assert!(masked["choices"][0]["logprobs"]["content"].as_array().is_some_and(|c| !c.is_empty()), "{masked}");
        if masked["choices"][0]["finish_reason"] == "stop" {
            assert!(jsonschema::is_valid(&schema, &serde_json::from_str(content(&masked)).unwrap()), "{masked}");
        }
    }
    let rows = metric(server.addr, "dspark_masked_logits_rows_total{model_name=\"masked\"}");
    let allowed = metric(server.addr, "dspark_masked_logits_allowed_total{model_name=\"masked\"}");
    let vocab = metric(server.addr, "dspark_masked_logits_vocab_total{model_name=\"masked\"}");
    assert!(rows > 0.0 && vocab == rows * 49152.0, "rows {rows}, vocab {vocab}");
    assert!(allowed > 0.0 && allowed < 0.5 * vocab, "allowed {allowed} of {vocab}");
    assert_eq!(metric(server.addr, "dspark_masked_logits_rows_total{model_name=\"full\"}"), 0.0);
}

#[test]
fn seeded_sampling_draws_the_same_with_and_without_guesses() {
    // A guess only computes ahead: the sampler draws the same numbers in the same order, from
    // the same logits, whether the token after a guess is sampled in the guess's step or the
    // next one. Two entries over one model, guesses on and off, the same seeded requests.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("models.yaml");
    let entry = |name: &str, speculate: bool| {
        format!(
            "apiVersion: gpustack.gg/v1alpha1\nkind: Model\nmetadata:\n  name: {name}\nspec:\n  source: file:{}\n  engine: dspark\n  config:\n    dspark: true\n    speculate: {speculate}\n    batch_invariant: true\n",
            smollm2().display()
        )
    };
    std::fs::write(&config, format!("{}---\n{}", entry("guess", true), entry("plain", false))).unwrap();
    let server = Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &["--config", config.to_str().unwrap()]);
    let record = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "country": {"type": "string", "maxLength": 16}}, "required": ["city", "country"], "additionalProperties": false});
    let schema = json!({"type": "object", "properties": {"places": {"type": "array", "items": record, "minItems": 4, "maxItems": 4}}, "required": ["places"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "places", "schema": schema}});
    for seed in [1, 2, 3, 4] {
        let ask = |model: &str| {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "List four cities and their countries as JSON."}], "temperature": 0.8, "seed": seed, "max_tokens": 200, "response_format": format});
            post_json(server.addr, "/v1/chat/completions", &body).json()
        };
        let (with, without) = (ask("guess"), ask("plain"));
        assert_eq!(content(&with), content(&without), "seed {seed}: {with} vs {without}");
        if with["choices"][0]["finish_reason"] == "stop" {
            assert!(jsonschema::is_valid(&schema, &serde_json::from_str(content(&with)).unwrap()), "{with}");
        }
    }
    let kept = metric(server.addr, "dspark_speculated_accepted_total{model_name=\"guess\"}");
    assert!(kept > 0.0, "no guess was drawn");
    assert_eq!(metric(server.addr, "dspark_speculated_tokens_total{model_name=\"plain\"}"), 0.0);
}

#[test]
fn constrained_chunks_make_room_for_an_unconstrained_neighbour() {
    // Two entries over one model: the default (constrained requests get no rows beyond one
    // each per step while an unconstrained one decodes) and one without that limit. Beside a
    // long unconstrained answer, a constrained answer's fast-forward chunks are cut into
    // single rows by the first and fed whole by the second; both answers stay the same.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("models.yaml");
    let entry = |name: &str, extra: &str| {
        format!(
            "apiVersion: gpustack.gg/v1alpha1\nkind: Model\nmetadata:\n  name: {name}\nspec:\n  source: file:{}\n  engine: dspark\n  config:\n{extra}",
            smollm2().display()
        )
    };
    let entries = format!(
        "{}\n---\n{}",
        entry("guarded", "    speculate: true\n"),
        entry("open", "    extra_rows_beside_unconstrained: 100000\n")
    );
    std::fs::write(&config, entries).unwrap();
    let server = Server::start(Path::new(env!("CARGO_BIN_EXE_dspark")), &["--config", config.to_str().unwrap()]);
    let addr = server.addr;
    let record = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "country": {"type": "string", "maxLength": 16}}, "required": ["city", "country"], "additionalProperties": false});
    let schema = json!({"type": "object", "properties": {"places": {"type": "array", "items": record, "minItems": 4, "maxItems": 4}}, "required": ["places"], "additionalProperties": false});
    let format = json!({"type": "json_schema", "json_schema": {"name": "places", "schema": schema}});
    let constrained = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "List four cities and their countries as JSON."}], "temperature": 0, "max_tokens": 200, "response_format": format});
    let plain = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "Tell me a long story."}], "temperature": 0, "max_tokens": 700, "ignore_eos": true});
    let alone = content(&post_json(addr, "/v1/chat/completions", &constrained("guarded")).json()).to_string();
    assert!(jsonschema::is_valid(&schema, &serde_json::from_str(&alone).unwrap()), "{alone}");
    let running = |model: &str| metric(addr, &format!("vllm:num_requests_running{{model_name=\"{model}\"}}"));
    let cut = |model: &str| metric(addr, &format!("dspark_cut_chunks_total{{model_name=\"{model}\"}}"));
    let forced = |model: &str| metric(addr, &format!("dspark_fast_forward_tokens_total{{model_name=\"{model}\"}}"));
    assert_eq!(cut("guarded"), 0.0, "alone, nothing is cut");

    let mut answers = Vec::new();
    for model in ["guarded", "open"] {
        let forced_before = forced(model);
        let body = plain(model);
        let neighbour = std::thread::spawn(move || post_json(addr, "/v1/chat/completions", &body).json());
        let deadline = Instant::now() + Duration::from_secs(60);
        while running(model) < 1.0 {
            assert!(Instant::now() < deadline, "the unconstrained request did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Past its prefill, into its decode.
        std::thread::sleep(Duration::from_millis(500));
        let beside = content(&post_json(addr, "/v1/chat/completions", &constrained(model)).json()).to_string();
        assert_eq!(running(model), 1.0, "{model}: the unconstrained request was still decoding");
        assert_eq!(beside, alone, "{model}: the constrained answer does not depend on its neighbour");
        assert!(forced(model) > forced_before, "{model}: its spans were still forced, not sampled");
        let story = neighbour.join().unwrap();
        assert_eq!(story["usage"]["completion_tokens"], 700, "{story}");
        answers.push(content(&story).to_string());
    }
    assert_eq!(answers[0], answers[1], "the unconstrained answer is the same beside either");
    assert!(cut("guarded") > 0.0, "the default cut the chunks beside the unconstrained request");
    assert_eq!(cut("open"), 0.0, "without the limit nothing is cut");
}

#[test]
fn logit_bias_steers_and_bans_tokens_with_and_without_a_constraint() {
    let server = start(&[]);
    let addr = server.addr;
    let (tokenizer, vocab) = smollm2_tokenizer();
    let one_token = |text: &str| one_token(&tokenizer, text);
    let complete = |extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0, "logprobs": 1});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post_json(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let first_token = |r: &Value| r["choices"][0]["logprobs"]["tokens"][0].as_str().unwrap().to_string();

    // Banning every id that spells the greedy answer's first token makes greedy take another.
    let top = first_token(&complete(json!({})));
    let banned: serde_json::Map<String, Value> =
        (0..vocab).filter(|&id| tokenizer.token_text(id) == top).map(|id| (id.to_string(), json!(-100))).collect();
    assert!(!banned.is_empty(), "no id spells {top:?}");
    let r = complete(json!({"logit_bias": banned}));
    assert_ne!(first_token(&r), top, "{r}");

    // +100 on an unlikely token makes it the answer, with a log-probability of about 0.
    let banana = one_token(" banana");
    let r = complete(json!({"logit_bias": {banana.to_string(): 100}}));
    assert_eq!(first_token(&r), " banana", "{r}");
    assert!(r["choices"][0]["logprobs"]["token_logprobs"][0].as_f64().unwrap() > -1e-3, "{r}");

    // Under a constraint the bias picks among what the mask allows (the classic path's test
    // checks the same), and cannot let in what the mask rules out.
    assert_bias_picks_the_choice(addr);
    let body = chat(json!({"guided_choice": ["yes", "no"], "logit_bias": {banana.to_string(): 100}}));
    let answer = content(&post_json(addr, "/v1/chat/completions", &body).json()).to_string();
    assert!(answer == "yes" || answer == "no", "{answer:?}");

    let r = post_raw(addr, &chat(json!({"logit_bias": {vocab.to_string(): 1}})));
    assert_error(
        &r,
        400,
        Some("logit_bias"),
        &format!("names token {vocab}, outside the vocabulary (ids 0 to {})", vocab - 1),
    );
    let r = post_raw(addr, &chat(json!({"logit_bias": {"5": -101}})));
    assert_error(&r, 400, Some("logit_bias"), "`logit_bias` for token 5 must be between -100 and 100, got -101");
}

#[test]
fn vllm_sampling_extensions_min_tokens_allowed_ids_stops_truncation_and_special_tokens() {
    let server = start(&[]);
    let addr = server.addr;
    let (tokenizer, vocab) = smollm2_tokenizer();
    let ask = |extra: Value| {
        let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Reply with the single word: yes"}], "temperature": 0, "max_tokens": 60});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post_json(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let tokens = |r: &Value| r["usage"]["completion_tokens"].as_u64().unwrap();

    // The short greedy answer ends at EOS; with `min_tokens` EOS waits, and a stop string
    // met within the first `min_tokens` tokens does not end the answer.
    let short = ask(json!({}));
    let answer = content(&short).to_string();
    assert_eq!(short["choices"][0]["finish_reason"], "stop", "{short}");
    assert_eq!(short["choices"][0]["stop_reason"], Value::Null, "EOS has no stop_reason: {short}");
    let least = tokens(&short) + 10;
    let first_word = answer.split_whitespace().next().unwrap().to_string();
    let long = ask(json!({"min_tokens": least, "max_tokens": least + 20}));
    assert!(tokens(&long) >= least, "{long}");
    assert!(content(&long).starts_with(&answer), "{long}");
    let cut = ask(json!({"stop": [first_word]}));
    assert_eq!(content(&cut), &answer[..answer.find(&first_word).unwrap()], "{cut}");
    let kept = ask(json!({"stop": [first_word], "min_tokens": 4}));
    assert!(content(&kept).starts_with(&first_word), "{kept}");

    // `include_stop_str_in_output` keeps the stop string that ended the text.
    let complete = |extra: Value| {
        let mut body =
            json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post_json(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let choice = &r.json()["choices"][0];
        // vLLM's `stop_reason`: the stop string that ended the text, or null.
        let stopped_by = extra.get("stop").map_or(Value::Null, |stops| stops[0].clone());
        assert_eq!(choice["stop_reason"], stopped_by, "{choice}");
        choice["text"].as_str().unwrap().to_string()
    };
    let text = complete(json!({}));
    let word = text.split_whitespace().nth(1).unwrap_or_else(|| panic!("{text:?}")).to_string();
    let at = text.find(&word).unwrap();
    assert_eq!(complete(json!({"stop": [word]})), &text[..at]);
    assert_eq!(complete(json!({"stop": [word], "include_stop_str_in_output": true})), &text[..at + word.len()]);

    // A `stop_token_ids` entry ends the output at its first occurrence and is its
    // `stop_reason`.
    let spelled = complete(json!({"logprobs": 0}));
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 0}),
    )
    .json();
    let generated: Vec<String> =
        r["choices"][0]["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().into()).collect();
    assert_eq!(generated.concat(), spelled);
    let third = &generated[2];
    let ids: Vec<u32> = (0..vocab).filter(|&id| &tokenizer.token_text(id) == third).collect();
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "stop_token_ids": ids}),
    )
    .json();
    let first = generated.iter().position(|t| t == third).unwrap();
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    assert_eq!(r["usage"]["completion_tokens"], first + 1, "{r}");
    let reason = r["choices"][0]["stop_reason"].as_u64().unwrap_or_else(|| panic!("{r}"));
    assert!(ids.contains(&(reason as u32)), "{r}");

    // `bad_words`: the greedy answer's first word, banned, is not generated.
    let word = generated[0].trim();
    assert!(!word.is_empty(), "{generated:?}");
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "logprobs": 0, "bad_words": [word]}),
    )
    .json();
    let avoided: Vec<&str> =
        r["choices"][0]["logprobs"]["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(!avoided.is_empty() && !avoided.contains(&generated[0].as_str()), "{r}");
    let r = post_raw(addr, &chat(json!({"bad_words": [""]})));
    assert_error(&r, 400, Some("bad_words"), "`bad_words` entries must not be empty or only whitespace");

    // `truncate_prompt_tokens` keeps the prompt's last tokens: the answer is the one to
    // those tokens given as the prompt.
    let ids = tokenizer.encode("The capital of France is").unwrap();
    let cut = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0, "truncate_prompt_tokens": 2}),
    )
    .json();
    assert_eq!(cut["usage"]["prompt_tokens"], 2, "{cut}");
    let tail = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": ids[ids.len() - 2..], "max_tokens": 8, "temperature": 0}),
    )
    .json();
    assert_eq!(cut["choices"][0]["text"], tail["choices"][0]["text"], "{cut} {tail}");

    // `skip_special_tokens: false` keeps the special tokens generated past EOS in the text.
    let special = |skip: bool| {
        let r = ask(json!({"ignore_eos": true, "max_tokens": tokens(&short) + 6, "skip_special_tokens": skip}));
        content(&r).to_string()
    };
    let (skipped, kept) = (special(true), special(false));
    assert!(kept.contains("<|im_end|>"), "{kept:?}");
    assert!(!skipped.contains("<|im_end|>"), "{skipped:?}");
    assert_eq!(skipped, kept.replace("<|im_end|>", "").replace("<|im_start|>", ""));

    // `allowed_token_ids`: every sampled token is one of them.
    let (banana, apple) = (one_token(&tokenizer, " banana"), one_token(&tokenizer, " apple"));
    let r = post_json(
        addr,
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0.8, "seed": 3, "logprobs": 1, "allowed_token_ids": [banana, apple]}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    let sampled = r["choices"][0]["logprobs"]["tokens"].as_array().unwrap();
    assert_eq!(sampled.len(), 6, "{r}");
    assert!(sampled.iter().all(|t| t == " banana" || t == " apple"), "{r}");
    assert_narrowing_yields_to_the_choice(addr);

    let r = post_raw(addr, &chat(json!({"min_tokens": 50, "max_tokens": 10})));
    assert_error(&r, 400, Some("min_tokens"), "`min_tokens` (50) must not exceed `max_tokens` (10)");
    let r = post_raw(addr, &chat(json!({"allowed_token_ids": [1, vocab]})));
    assert_error(
        &r,
        400,
        Some("allowed_token_ids"),
        &format!("`allowed_token_ids` names token {vocab}, outside the vocabulary (ids 0 to {})", vocab - 1),
    );
    let r = post_raw(addr, &chat(json!({"allowed_token_ids": []})));
    assert_error(&r, 400, Some("allowed_token_ids"), "`allowed_token_ids` must name at least one token");
    let r = post_raw(addr, &chat(json!({"truncate_prompt_tokens": 0})));
    assert_error(&r, 400, Some("truncate_prompt_tokens"), "`truncate_prompt_tokens` must be at least 1");
}

/// Under a choice of `yes` or `no`: `allowed_token_ids` picks within it; an `allowed_token_ids`
/// outside it, or a `min_tokens` past its end, yields to the constraint.
fn assert_narrowing_yields_to_the_choice(addr: std::net::SocketAddr) {
    let (tokenizer, _) = smollm2_tokenizer();
    let answer = |extra: Value| {
        let mut body = chat(json!({"guided_choice": ["yes", "no"]}));
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post_json(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let r = r.json();
        assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
        content(&r).to_string()
    };
    for choice in ["yes", "no"] {
        assert_eq!(answer(json!({"allowed_token_ids": [one_token(&tokenizer, choice)]})), choice);
    }
    let outside = answer(json!({"allowed_token_ids": [one_token(&tokenizer, " banana")]}));
    assert!(outside == "yes" || outside == "no", "{outside:?}");
    let early = answer(json!({"min_tokens": 20}));
    assert!(early == "yes" || early == "no", "{early:?}");
}

/// `echo` and `prompt_logprobs` on /v1/completions as lm-evaluation-harness reads them
/// (`prompt` as token ids, `echo: true`, `logprobs: 1`, `max_tokens` 1 or 0, greedy): the
/// prompt starts the text; its tokens come first in `logprobs` (the first with `null`), a
/// greedy continuation scored as part of the prompt is "greedy" by lm-eval's test (each
/// token's log-probability is the best in its `top_logprobs`) and keeps the log-probabilities
/// sampling reported; vLLM's `prompt_logprobs` list the prompt token by id with its rank;
/// streaming, several prompts, chat, and the errors.
#[test]
fn echo_and_prompt_logprobs_score_prompts_as_evaluation_harnesses_read_them() {
    let server = start(&[]);
    let addr = server.addr;
    let (tokenizer, _) = smollm2_tokenizer();
    let complete = |body: Value| {
        let mut body = body;
        body["model"] = json!(MODEL);
        body["temperature"] = json!(0);
        let r = post_json(addr, "/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let floats = |v: &Value| -> Vec<f64> { v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect() };
    let context = "The capital of France is";
    let ids = tokenizer.encode(context).unwrap();

    // A greedy continuation of the context, with its sampled log-probabilities.
    let answer = complete(json!({"prompt": ids, "max_tokens": 6, "logprobs": 1}));
    let continuation = answer["choices"][0]["text"].as_str().unwrap().to_string();
    let sampled = floats(&answer["choices"][0]["logprobs"]["token_logprobs"]);
    let offsets = floats(&answer["choices"][0]["logprobs"]["text_offset"]);
    assert_eq!(offsets[0], 0.0, "without echo the first token starts the text: {answer}");
    let full = tokenizer.encode(&format!("{context}{continuation}")).unwrap();
    assert_eq!(full.len(), ids.len() + 6, "the continuation tokenises back to its 6 tokens: {full:?}");
    assert_eq!(full[..ids.len()], ids[..]);

    // lm-eval's loglikelihood request: the context and continuation as the prompt, echoed.
    let scored = complete(json!({"prompt": full, "echo": true, "max_tokens": 1, "logprobs": 1}));
    let choice = &scored["choices"][0];
    let text = choice["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("{context}{continuation}")), "{scored}");
    let logprobs = &choice["logprobs"];
    let tokens: Vec<&str> = logprobs["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), full.len() + 1, "the prompt's tokens and the generated one: {scored}");
    assert_eq!(tokens.concat(), text);
    let token_logprobs = logprobs["token_logprobs"].as_array().unwrap();
    assert_eq!(token_logprobs[0], Value::Null, "the first prompt token has no log-probability");
    assert_eq!(logprobs["top_logprobs"][0], Value::Null);
    let mut at = 0;
    for (token, offset) in tokens.iter().zip(logprobs["text_offset"].as_array().unwrap()) {
        assert_eq!(offset.as_u64(), Some(at as u64), "{scored}");
        at += token.chars().count();
    }
    // lm-eval's slice: the continuation's tokens, without the generated one.
    let (start, end) = (ids.len(), full.len());
    for (i, sampled) in (start..end).zip(&sampled) {
        let logprob = token_logprobs[i].as_f64().unwrap();
        assert!((logprob - sampled).abs() < 1e-4, "token {i}: scored {logprob}, sampled {sampled}");
        let top = logprobs["top_logprobs"][i].as_object().unwrap();
        let best = top.values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(logprob, best, "lm-eval's is_greedy: the token is the best of {top:?}");
        assert!(top.contains_key(tokens[i]), "{top:?} lists the token itself");
    }
    assert_eq!(scored["usage"]["prompt_tokens"], full.len());
    assert_eq!(scored["usage"]["completion_tokens"], 1);

    // `max_tokens: 0` with echo: the prompt alone, scored; vLLM's `prompt_logprobs` by id.
    let only = complete(json!({"prompt": full, "echo": true, "max_tokens": 0, "logprobs": 2, "prompt_logprobs": 1}));
    let choice = &only["choices"][0];
    assert_eq!(choice["text"].as_str().unwrap(), tokens[..full.len()].concat(), "{only}");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(only["usage"]["completion_tokens"], 0);
    assert_eq!(choice["logprobs"]["tokens"].as_array().unwrap().len(), full.len());
    assert_eq!(choice["logprobs"]["token_logprobs"].as_array().unwrap()[..], token_logprobs[..full.len()]);
    let prompt_logprobs = choice["prompt_logprobs"].as_array().unwrap();
    assert_eq!(prompt_logprobs.len(), full.len());
    assert_eq!(prompt_logprobs[0], Value::Null);
    for (i, entry) in prompt_logprobs.iter().enumerate().skip(1) {
        let own = &entry[full[i].to_string()];
        assert_eq!(own["logprob"], token_logprobs[i], "position {i}: {entry}");
        assert!(own["rank"].as_u64().unwrap() >= 1);
        assert_eq!(own["decoded_token"].as_str(), Some(tokens[i]));
        if i >= start {
            assert_eq!(own["rank"], 1, "a greedy token ranks first: {entry}");
            assert_eq!(entry.as_object().unwrap().len(), 1, "its one alternative is itself: {entry}");
        }
    }

    // Streamed: the first chunk carries the prompt; the chunks add up to the same text and
    // logprobs, with offsets running on.
    let events = http::send(
        addr,
        "POST",
        "/v1/completions",
        &[("content-type", "application/json")],
        json!({"model": MODEL, "prompt": full, "echo": true, "max_tokens": 3, "logprobs": 1, "temperature": 0, "stream": true})
            .to_string()
            .as_bytes(),
    )
    .events();
    let chunks: Vec<Value> =
        events.iter().filter(|e| *e != "[DONE]").map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert!(chunks[0]["choices"][0]["text"].as_str().unwrap().starts_with(context), "{:?}", chunks[0]);
    let whole = complete(json!({"prompt": full, "echo": true, "max_tokens": 3, "logprobs": 1}));
    assert_eq!(streamed, whole["choices"][0]["text"].as_str().unwrap());
    let streamed_offsets: Vec<Value> =
        chunks.iter().flat_map(|c| c["choices"][0]["logprobs"]["text_offset"].as_array().unwrap().clone()).collect();
    assert_eq!(streamed_offsets, *whole["choices"][0]["logprobs"]["text_offset"].as_array().unwrap());

    // Several prompts: each choice echoes its own.
    let two = complete(json!({"prompt": ["One, two,", "Red, green,"], "echo": true, "max_tokens": 2}));
    assert!(two["choices"][0]["text"].as_str().unwrap().contains("One, two,"), "{two}");
    assert!(two["choices"][1]["text"].as_str().unwrap().contains("Red, green,"), "{two}");

    // Chat: the scores of the templated prompt beside the choices.
    let body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "prompt_logprobs": 0});
    let r = post_json(addr, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    assert_eq!(r["prompt_logprobs"].as_array().unwrap().len() as u64, r["usage"]["prompt_tokens"].as_u64().unwrap());

    // Errors name the field.
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    assert_error(&post_raw(addr, &stream_body), 400, Some("prompt_logprobs"), "not supported with `stream`");
    let zero = post_json(addr, "/v1/completions", &json!({"model": MODEL, "prompt": "Hi", "max_tokens": 0}));
    assert_error(&zero, 400, Some("max_tokens"), "0 is allowed only with `echo`");
    let many = post_json(addr, "/v1/completions", &json!({"model": MODEL, "prompt": "Hi", "prompt_logprobs": 21}));
    assert_error(&many, 400, Some("prompt_logprobs"), "`prompt_logprobs` must be between 0 and 20, got 21");
}

/// vLLM's `/tokenize` and `/detokenize`: a prompt's ids are the tokenizer's, a conversation's
/// count is what a chat completion bills as its prompt, and ids come back as the text.
#[test]
fn tokenize_and_detokenize_as_vllm_serves_them() {
    let server = start(&[]);
    let addr = server.addr;
    let (tokenizer, _) = smollm2_tokenizer();
    let text = "The capital of France is Paris.";
    let r = post_json(addr, "/tokenize", &json!({"model": MODEL, "prompt": text, "return_token_strs": true}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    let ids = tokenizer.encode(text).unwrap();
    assert_eq!(r["tokens"], json!(ids));
    assert_eq!(r["count"], ids.len());
    assert!(r["max_model_len"].as_u64().unwrap() > 0);
    let strs: String = r["token_strs"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(strs.ends_with(text), "{strs:?}");
    let back = post_json(addr, "/detokenize", &json!({"model": MODEL, "tokens": ids}));
    assert_eq!(back.status, 200, "{}", back.body);
    assert_eq!(back.json()["prompt"].as_str().unwrap(), strs);

    let messages = json!([{"role": "user", "content": "Hi"}]);
    let counted = post_json(addr, "/tokenize", &json!({"model": MODEL, "messages": messages})).json();
    let billed = post_json(
        addr,
        "/v1/chat/completions",
        &json!({"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}),
    )
    .json();
    assert_eq!(counted["count"], billed["usage"]["prompt_tokens"], "{counted} {billed}");
    let without =
        post_json(addr, "/tokenize", &json!({"model": MODEL, "messages": messages, "add_generation_prompt": false}))
            .json();
    assert!(without["count"].as_u64() < counted["count"].as_u64(), "{without}");

    let both = post_json(addr, "/tokenize", &json!({"model": MODEL, "prompt": "a", "messages": messages}));
    assert_error(&both, 400, Some("prompt"), "exactly one of `prompt`");
    let outside = post_json(addr, "/detokenize", &json!({"model": MODEL, "tokens": [1, 9999999]}));
    assert_error(&outside, 400, Some("tokens"), "`tokens` holds 9999999, outside the vocabulary");
    let unknown = post_json(addr, "/tokenize", &json!({"model": "nope", "prompt": "a"}));
    assert_eq!(unknown.status, 404, "{}", unknown.body);
}

/// SmolLM2's tokenizer, read from its GGUF file, and its vocabulary size.
fn smollm2_tokenizer() -> (ModelTokenizer, u32) {
    let path = smollm2();
    let file = GgufFile::open(&path).unwrap();
    let vocab = file.strings("tokenizer.ggml.tokens").unwrap().len() as u32;
    (ModelTokenizer::load(&path, &file).unwrap(), vocab)
}

/// The id of `text`, which must be a single token.
fn one_token(tokenizer: &ModelTokenizer, text: &str) -> u32 {
    let ids = tokenizer.encode(text).unwrap();
    assert_eq!(ids.len(), 1, "{text:?} should be one token: {ids:?}");
    ids[0]
}

/// With a choice of `yes` or `no`, +100 on either's token makes it the answer.
fn assert_bias_picks_the_choice(addr: std::net::SocketAddr) {
    let (tokenizer, _) = smollm2_tokenizer();
    for answer in ["yes", "no"] {
        let bias = json!({one_token(&tokenizer, answer).to_string(): 100});
        let body = chat(json!({"guided_choice": ["yes", "no"], "logit_bias": bias}));
        let r = post_json(addr, "/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(content(&r.json()), answer, "{}", r.body);
    }
}
