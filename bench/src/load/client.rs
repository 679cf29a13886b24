//! One streamed chat completion against any OpenAI-compatible server, timed.
//!
//! HTTP/1.1 over plain TCP with hyper (one connection per request, as a load generator of
//! independent clients would), `stream: true` with `stream_options.include_usage`, the
//! server-sent events parsed as they arrive: the time to the first content token (TTFT), the
//! text, the finish reason and the usage. A server that sends no usage chunk gets its
//! completion tokens counted as content chunks (each chunk is one token in llama.cpp and in
//! vLLM without fast-forward), and the result says so.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// Where requests go.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub authority: String,
    /// The chat completions path (`/v1/chat/completions` under any prefix).
    pub path: String,
    /// Sent as a bearer token.
    pub api_key: Option<String>,
}

impl Endpoint {
    /// Parses `http://host:port[/prefix]`; a prefix ending in `/v1` is not doubled.
    pub fn parse(url: &str, api_key: Option<String>) -> anyhow::Result<Self> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("`{url}` is not an http:// URL (the load generator speaks plain HTTP)"))?;
        let (authority, prefix) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
        if authority.is_empty() {
            bail!("`{url}` has no host");
        }
        let authority = if authority.contains(':') { authority.to_string() } else { format!("{authority}:80") };
        let prefix = prefix.trim_end_matches('/');
        let path = if prefix.is_empty() {
            "/v1/chat/completions".to_string()
        } else if prefix.ends_with("v1") {
            format!("/{prefix}/chat/completions")
        } else {
            format!("/{prefix}/v1/chat/completions")
        };
        Ok(Self { authority, path, api_key })
    }
}

/// What one request gave.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The assembled content.
    pub content: String,
    /// Seconds from sending to the first content.
    pub ttft: Option<f64>,
    /// Seconds from sending to the end of the stream.
    pub latency: f64,
    /// Seconds from the start of its block of requests to sending (set by the bench loop):
    /// with `latency`, it places the request among its neighbours in a `--dump`.
    pub sent_at: f64,
    /// Completion tokens (from usage, else content chunks).
    pub completion_tokens: u64,
    /// Whether `completion_tokens` came from the server's usage.
    pub usage_reported: bool,
    /// The finish reason.
    pub finish_reason: Option<String>,
    /// Why the request failed (HTTP status and body, a broken stream, a timeout).
    pub error: Option<String>,
}

/// Sends `body` (with `stream` set) and reads the stream to its end, within `timeout`.
pub async fn chat(endpoint: &Endpoint, body: &Value, timeout: Duration) -> Outcome {
    let started = Instant::now();
    let mut outcome = Outcome::default();
    let result = tokio::time::timeout(timeout, stream(endpoint, body, started, &mut outcome)).await;
    outcome.latency = started.elapsed().as_secs_f64();
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => outcome.error = Some(format!("{e:#}")),
        Err(_) => outcome.error = Some(format!("no complete answer within {} s", timeout.as_secs())),
    }
    outcome
}

async fn stream(endpoint: &Endpoint, body: &Value, started: Instant, out: &mut Outcome) -> anyhow::Result<()> {
    let tcp = tokio::net::TcpStream::connect(&endpoint.authority)
        .await
        .with_context(|| format!("cannot connect to {}", endpoint.authority))?;
    tcp.set_nodelay(true).ok();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    tokio::spawn(connection);
    let mut request = Request::post(&endpoint.path)
        .header("host", &endpoint.authority)
        .header("content-type", "application/json")
        .header("accept", "text/event-stream");
    if let Some(key) = &endpoint.api_key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request.body(Full::new(Bytes::from(body.to_string())))?;
    let response = sender.send_request(request).await.context("the server closed the connection")?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
    }
    let mut pending: Vec<u8> = Vec::new();
    let mut chunks = 0u64;
    let mut done = false;
    while let Some(frame) = body.frame().await {
        let frame = frame.context("the stream broke")?;
        let Some(data) = frame.data_ref() else { continue };
        pending.extend_from_slice(data);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(payload) = line.trim_end().strip_prefix("data:").map(str::trim_start) else { continue };
            if payload == "[DONE]" {
                done = true;
                continue;
            }
            let event: Value =
                serde_json::from_str(payload).with_context(|| format!("a stream event is not JSON: {payload}"))?;
            if let Some(error) = event.get("error") {
                bail!("the server reported an error mid-stream: {error}");
            }
            if let Some(choice) = event["choices"].get(0) {
                if let Some(text) = choice["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
                    out.ttft.get_or_insert_with(|| started.elapsed().as_secs_f64());
                    out.content.push_str(text);
                    chunks += 1;
                }
                if let Some(reason) = choice["finish_reason"].as_str() {
                    out.finish_reason = Some(reason.to_string());
                }
            }
            if let Some(n) = event["usage"]["completion_tokens"].as_u64() {
                out.completion_tokens = n;
                out.usage_reported = true;
            }
        }
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    if !out.usage_reported {
        out.completion_tokens = chunks;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_map_to_the_chat_completions_path() {
        let e = Endpoint::parse("http://127.0.0.1:8000", None).unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("127.0.0.1:8000", "/v1/chat/completions"));
        let e = Endpoint::parse("http://localhost:8080/v1/", None).unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("localhost:8080", "/v1/chat/completions"));
        let e = Endpoint::parse("http://gpu-box/openai", None).unwrap();
        assert_eq!((e.authority.as_str(), e.path.as_str()), ("gpu-box:80", "/openai/v1/chat/completions"));
        assert!(Endpoint::parse("https://x", None).is_err());
    }
}
