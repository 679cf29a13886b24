//! One model entry's engine thread.
//!
//! The engine is synchronous; a dedicated OS thread owns it and loops: take new submissions,
//! drop sequences whose client has gone (the HTTP handler's receiver closed: a disconnect),
//! run one step, route each update to its client's channel. With nothing to do it blocks on
//! the submission channel. Dropping every [`Worker`] handle ends the thread after its
//! in-flight requests finish, which is how a reloaded entry retires its old engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use dspark_host::engine::{
    Engine, EngineConfig, EngineStats, FinishReason, GenerationRequest, LoadedModel, ModelTokenizer, RequestError,
    SequenceUpdate,
};
use tokio::sync::{mpsc, oneshot};

use super::config::EntryConfig;
use super::error::ApiError;
use super::metrics::{ModelMetrics, lock};

/// What a client receives.
#[derive(Debug)]
pub enum Event {
    /// Tokens, text and possibly the end.
    Update(SequenceUpdate),
    /// The engine failed; the request is over.
    Failed(String),
}

struct Submission {
    request: GenerationRequest,
    prompt_tokens: usize,
    events: mpsc::UnboundedSender<Event>,
    admitted: oneshot::Sender<Result<(), RequestError>>,
}

/// A handle to a running engine thread.
#[derive(Clone)]
pub struct Worker {
    tx: std::sync::mpsc::Sender<Submission>,
    in_flight: Arc<AtomicUsize>,
    max_queue: usize,
    /// The model's tokenizer.
    pub tokenizer: Arc<ModelTokenizer>,
    /// Logits width.
    pub vocab_size: usize,
    /// The longest sequence.
    pub max_model_len: usize,
    /// This entry's series.
    pub metrics: Arc<ModelMetrics>,
}

/// An admitted request: its events, and its place in the queue count until dropped.
pub struct Ticket {
    /// Updates of the sequence, ending with one that has a finish reason (or `Failed`).
    pub events: mpsc::UnboundedReceiver<Event>,
    _slot: Slot,
}

struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Worker {
    /// Builds the engine (errors surface here) and starts its thread.
    pub fn spawn(
        name: &str,
        model: Arc<dyn LoadedModel>,
        tokenizer: Arc<ModelTokenizer>,
        config: &EntryConfig,
        metrics: Arc<ModelMetrics>,
    ) -> anyhow::Result<Self> {
        let max_model_len = config.max_model_len.unwrap_or(model.config().context_length.min(4096));
        let engine_config = EngineConfig {
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens.max(1),
            max_model_len: Some(max_model_len),
            kv_cache_tokens: config.kv_cache_tokens,
            prefix_caching: config.prefix_caching,
            // DSpark's overlap; `dspark: false` computes each mask at sampling.
            overlap_masks: config.dspark,
            masked_logits: config.dspark && config.masked_logits,
            guesses: config.dspark && config.speculate,
            prompt_lookup: config.prompt_lookup(),
            confident_lookup_hits: config.confident_lookup(),
            extra_rows_beside_plain: config.extra_rows_beside_unconstrained,
            kv_cache_dtype: config.kv_cache_dtype.resolve(),
            ..EngineConfig::default()
        };
        let vocab_size = model.config().vocab_size;
        let engine = model.engine(tokenizer.clone(), &engine_config)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_metrics = metrics.clone();
        std::thread::Builder::new().name(format!("engine-{name}")).spawn(move || run(engine, rx, thread_metrics))?;
        Ok(Self {
            tx,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_queue: config.max_queue,
            tokenizer,
            vocab_size,
            max_model_len,
            metrics,
        })
    }

    /// Queues a request; fails with 429 when `max_queue` requests are in flight, and with 400
    /// when the engine refuses it (e.g. a prompt longer than `max_model_len`).
    pub async fn submit(&self, request: GenerationRequest) -> Result<Ticket, ApiError> {
        let count = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        let slot = Slot(self.in_flight.clone());
        if count > self.max_queue {
            return Err(ApiError::overloaded(format!(
                "{} requests are already queued or running for this model; retry later",
                self.max_queue
            )));
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let (admitted, admission) = oneshot::channel();
        let prompt_tokens = request.prompt.len();
        self.tx
            .send(Submission { request, prompt_tokens, events, admitted })
            .map_err(|_| ApiError::unavailable("the model's engine has stopped"))?;
        match admission.await {
            Ok(Ok(())) => Ok(Ticket { events: receiver, _slot: slot }),
            Ok(Err(e @ RequestError::PromptTooLong { .. })) => Err(ApiError::invalid("messages", e.to_string())),
            Ok(Err(RequestError::Params(e))) => Err(ApiError::bad_request(e.to_string())),
            Ok(Err(e @ RequestError::MinAboveMax { .. })) => Err(ApiError::invalid("min_tokens", e.to_string())),
            Ok(Err(e)) => Err(ApiError::bad_request(e.to_string())),
            Err(_) => Err(ApiError::unavailable("the model's engine has stopped")),
        }
    }
}

struct Client {
    events: mpsc::UnboundedSender<Event>,
    started: Instant,
    last: Option<Instant>,
    prompt_tokens: usize,
    generated: usize,
}

fn run(mut engine: Box<dyn Engine>, rx: std::sync::mpsc::Receiver<Submission>, metrics: Arc<ModelMetrics>) {
    let mut clients: HashMap<u64, Client> = HashMap::new();
    let mut seen = EngineStats::default();
    loop {
        if !engine.has_work() {
            match rx.recv() {
                Ok(s) => admit(engine.as_mut(), &mut clients, s),
                Err(_) => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            admit(engine.as_mut(), &mut clients, s);
        }
        // Clients that went away: cancel now, freeing their blocks.
        let gone: Vec<u64> = clients.iter().filter(|(_, c)| c.events.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            engine.cancel(id);
            clients.remove(&id);
            metrics.finish("abort");
        }
        if !engine.has_work() {
            report(engine.as_ref(), &metrics, &mut seen);
            continue;
        }
        match engine.step() {
            Ok(updates) => {
                // Gauges and counters first: a client that reads /metrics after its answer
                // must find the step that produced it counted.
                report(engine.as_ref(), &metrics, &mut seen);
                for update in updates {
                    deliver(engine.as_mut(), &mut clients, &metrics, update);
                }
            }
            Err(e) => {
                let message = format!("the engine failed: {e:#}");
                for (id, client) in clients.drain() {
                    let _ = client.events.send(Event::Failed(message.clone()));
                    engine.cancel(id);
                    metrics.finish("error");
                }
            }
        }
        report(engine.as_ref(), &metrics, &mut seen);
    }
}

/// Publishes the engine's gauges and counter increments.
fn report(engine: &dyn Engine, metrics: &ModelMetrics, seen: &mut EngineStats) {
    let stats = engine.stats();
    metrics.forced_tokens.add(stats.forced_tokens - seen.forced_tokens);
    metrics.steps.add(stats.steps - seen.steps);
    metrics.step_rows.add(stats.step_rows - seen.step_rows);
    metrics.step_us.add((stats.step_ns / 1000).saturating_sub(seen.step_ns / 1000));
    metrics.speculated_tokens.add(stats.speculated_tokens - seen.speculated_tokens);
    metrics.speculated_accepted.add(stats.speculated_accepted - seen.speculated_accepted);
    metrics.cut_chunks.add(stats.cut_chunks - seen.cut_chunks);
    metrics.masked_logits_rows.add(stats.masked_logits_rows - seen.masked_logits_rows);
    metrics.masked_logits_allowed.add(stats.masked_logits_allowed - seen.masked_logits_allowed);
    metrics.masked_logits_vocab.add(stats.masked_logits_vocab - seen.masked_logits_vocab);
    metrics.preemptions.add(stats.preemptions - seen.preemptions);
    metrics.masks.add(stats.masks - seen.masks);
    metrics.mask_wait_us.add((stats.mask_wait_ns / 1000).saturating_sub(seen.mask_wait_ns / 1000));
    *seen = stats;
    let scheduler = engine.scheduler();
    metrics.running.set(scheduler.num_running() as f64);
    metrics.waiting.set(scheduler.num_waiting() as f64);
    metrics.kv_cache_usage.set(scheduler.cache_usage());
}

fn admit(engine: &mut dyn Engine, clients: &mut HashMap<u64, Client>, s: Submission) {
    match engine.add_request(s.request) {
        Ok(id) => {
            let client = Client {
                events: s.events,
                started: Instant::now(),
                last: None,
                prompt_tokens: s.prompt_tokens,
                generated: 0,
            };
            clients.insert(id, client);
            let _ = s.admitted.send(Ok(()));
        }
        Err(e) => {
            let _ = s.admitted.send(Err(e));
        }
    }
}

fn deliver(
    engine: &mut dyn Engine,
    clients: &mut HashMap<u64, Client>,
    metrics: &ModelMetrics,
    update: SequenceUpdate,
) {
    let id = update.id;
    let Some(client) = clients.get_mut(&id) else { return };
    let now = Instant::now();
    let n = update.tokens.len();
    if n > 0 {
        match client.last {
            None => lock(&metrics.ttft).observe((now - client.started).as_secs_f64()),
            Some(last) => {
                let per_token = (now - last).as_secs_f64() / n as f64;
                let mut h = lock(&metrics.inter_token);
                (0..n).for_each(|_| h.observe(per_token));
            }
        }
        client.last = Some(now);
        client.generated += n;
    }
    let Some(reason) = update.finish.clone() else {
        if client.events.send(Event::Update(update)).is_err() {
            engine.cancel(id);
            clients.remove(&id);
            metrics.finish("abort");
        }
        return;
    };
    // The last update is counted before it is sent, for the same reason as the gauges.
    lock(&metrics.e2e).observe(client.started.elapsed().as_secs_f64());
    metrics.prompt_tokens.add(client.prompt_tokens as u64);
    metrics.generation_tokens.add(client.generated as u64);
    metrics.finish(match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::Error(_) => "error",
    });
    // A client gone by now missed only its last update; the sequence is finished either way.
    let _ = client.events.send(Event::Update(update));
    clients.remove(&id);
}
