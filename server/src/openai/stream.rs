//! Server-sent events: the choices' events merged into one stream of OpenAI chunks, ending
//! with usage (when asked) and `[DONE]`.

use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use dspark_host::engine::SequenceUpdate;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::generate::{check_output, usage};
use crate::serving::error::ApiError;
use crate::serving::lifecycle::Lifecycle;
use crate::serving::models::Served;
use crate::serving::worker::{Event, Ticket};

/// Merges the tickets' events into one channel of (choice index, event).
pub(super) fn merge(tickets: Vec<Ticket>) -> mpsc::UnboundedReceiver<(usize, Event)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (index, mut ticket) in tickets.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(event) = ticket.events.recv().await {
                if tx.send((index, event)).is_err() {
                    // The client left; dropping the ticket cancels the sequence.
                    return;
                }
            }
        });
    }
    rx
}

pub(super) fn sse(value: &Value) -> Result<SseEvent, std::convert::Infallible> {
    Ok(SseEvent::default().data(value.to_string()))
}

/// What a streamed response needs besides its choices' rendering.
pub(super) struct StreamHead {
    pub(super) served: Arc<Served>,
    pub(super) validator: Option<Arc<jsonschema::Validator>>,
    pub(super) id: String,
    pub(super) object: &'static str,
    pub(super) created: u64,
    pub(super) model: String,
    pub(super) prompt_tokens: usize,
    pub(super) include_usage: bool,
    /// Ends the stream (an error event and `[DONE]`) when a drain runs out of time.
    pub(super) lifecycle: Arc<Lifecycle>,
}

/// Streams the tickets' updates as server-sent events: `opening` choices first, then
/// whatever `render` makes of each update, the usage chunk when asked for, and `[DONE]`.
/// Finished answers are checked against their constraint on the way.
pub(super) fn stream_response<F>(head: StreamHead, tickets: Vec<Ticket>, opening: Vec<Value>, mut render: F) -> Response
where
    F: FnMut(&Served, usize, &SequenceUpdate) -> Vec<Value> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let n = tickets.len();
    let mut events = merge(tickets);
    tokio::spawn(async move {
        let chunk = |choices: Value, usage: Option<Value>| {
            let mut c = json!({"id": head.id, "object": head.object, "created": head.created, "model": head.model, "choices": choices});
            if head.include_usage {
                c["usage"] = usage.unwrap_or(Value::Null);
            }
            c
        };
        for choice in opening {
            if tx.send(sse(&chunk(json!([choice]), None))).is_err() {
                return;
            }
        }
        let mut texts = vec![String::new(); n];
        let mut completion_tokens = 0;
        let mut open = n;
        // Every way a stream ends sends `[DONE]` last; an ending other than the choices'
        // finish sends an error event before it.
        let fail = |error: ApiError| {
            let _ = tx.send(sse(&error.body()));
            let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
        };
        while open > 0 {
            let next = tokio::select! {
                biased;
                next = events.recv() => next,
                _ = head.lifecycle.in_flight_ended() => return fail(ApiError::shutting_down()),
            };
            let Some((index, event)) = next else {
                return fail(ApiError::internal("the engine dropped the request"));
            };
            let update = match event {
                Event::Update(u) => u,
                Event::Failed(message) => return fail(ApiError::internal(message)),
            };
            completion_tokens += update.tokens.len();
            texts[index].push_str(&update.text);
            if let Some(finish) = &update.finish {
                check_output(&head.served, head.validator.as_deref(), &texts[index], finish);
                open -= 1;
            }
            for choice in render(&head.served, index, &update) {
                if tx.send(sse(&chunk(json!([choice]), None))).is_err() {
                    return;
                }
            }
        }
        if head.include_usage {
            let _ = tx.send(sse(&chunk(json!([]), Some(usage(head.prompt_tokens, completion_tokens)))));
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]")));
    });
    Sse::new(UnboundedReceiverStream::new(rx)).keep_alive(KeepAlive::default()).into_response()
}
