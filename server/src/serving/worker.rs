//! One model entry's engine thread.
//!
//! The engine is synchronous; a dedicated OS thread owns it and loops: take new submissions,
//! drop sequences whose client has gone (the HTTP handler's receiver closed: a disconnect),
//! run one step, route each update to its client's channel. With nothing to do it blocks on
//! the submission channel. Dropping every [`Worker`] handle ends the thread after its
//! in-flight requests finish, which is how a reloaded entry retires its old engine.
//!
//! A panic inside the engine (a bug) must not take the entry down silently: the thread catches
//! it, ends every request in flight with an error event, builds a fresh engine from the same
//! weights and goes on serving. If the engine cannot be rebuilt the thread stops, and
//! [`Worker::alive`] (behind `/health/live`) says so.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// Cleared when the engine thread stops.
    alive: Arc<AtomicBool>,
}

/// Clears the alive flag when the engine thread ends, however it ends.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Builds an engine: at start, and again after a panic.
type EngineFactory = Box<dyn Fn() -> anyhow::Result<Box<dyn Engine>> + Send>;

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
        let factory_tokenizer = tokenizer.clone();
        let make_engine: EngineFactory =
            Box::new(move || model.clone().engine(factory_tokenizer.clone(), &engine_config));
        Self::start(name, make_engine, tokenizer, vocab_size, max_model_len, config.max_queue, metrics)
    }

    /// Builds the first engine with `make_engine` (errors surface here) and starts the thread,
    /// which calls `make_engine` again to restart after a panic.
    fn start(
        name: &str,
        make_engine: EngineFactory,
        tokenizer: Arc<ModelTokenizer>,
        vocab_size: usize,
        max_model_len: usize,
        max_queue: usize,
        metrics: Arc<ModelMetrics>,
    ) -> anyhow::Result<Self> {
        let engine = make_engine()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let thread_metrics = metrics.clone();
        let alive = Arc::new(AtomicBool::new(true));
        let guard = AliveGuard(alive.clone());
        let thread_name = format!("engine-{name}");
        std::thread::Builder::new().name(thread_name.clone()).spawn(move || {
            let _guard = guard;
            run(&thread_name, engine, make_engine, rx, thread_metrics);
            return_freed_memory();
        })?;
        Ok(Self {
            tx,
            in_flight: Arc::new(AtomicUsize::new(0)),
            max_queue,
            tokenizer,
            vocab_size,
            max_model_len,
            metrics,
            alive,
        })
    }

    /// Whether the engine thread runs.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Takes room in the queue for `count` sequences, before anything costly (constraint
    /// compilation) is done for them: 429 when the queue is full, 400 when `count` could never
    /// fit.
    pub fn reserve(&self, count: usize, field: &str) -> Result<Reservation, ApiError> {
        if count > self.max_queue {
            return Err(ApiError::invalid(
                field,
                format!("this request asks for {count} sequences; this model runs at most {} at once", self.max_queue),
            ));
        }
        let total = self.in_flight.fetch_add(count, Ordering::AcqRel) + count;
        let slots: Vec<Slot> = (0..count).map(|_| Slot(self.in_flight.clone())).collect();
        if total > self.max_queue {
            return Err(ApiError::overloaded(format!(
                "{} requests are already queued or running for this model; retry later",
                self.max_queue
            )));
        }
        Ok(Reservation { slots })
    }

    /// Queues a request in a place `reservation` holds; fails with 400 when the engine refuses
    /// it (e.g. a prompt longer than `max_model_len`).
    pub async fn submit(&self, request: GenerationRequest, reservation: &mut Reservation) -> Result<Ticket, ApiError> {
        let slot = reservation.slots.pop().ok_or_else(|| ApiError::internal("no place was reserved for a sequence"))?;
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

/// Places in a model's queue, taken by [`Worker::reserve`] and given back as they drop.
pub struct Reservation {
    slots: Vec<Slot>,
}

struct Client {
    events: mpsc::UnboundedSender<Event>,
    started: Instant,
    last: Option<Instant>,
    prompt_tokens: usize,
    generated: usize,
}

/// Gives the memory of a retired engine (its KV cache, in blocks small enough for the
/// allocator's arenas) back to the system: glibc keeps freed arena memory for reuse, so
/// without this every config reload would leave the resident size at its peak.
fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The engine thread: serves until every [`Worker`] handle is gone, restarting the engine after
/// a panic.
fn run(
    name: &str,
    mut engine: Box<dyn Engine>,
    make_engine: EngineFactory,
    rx: std::sync::mpsc::Receiver<Submission>,
    metrics: Arc<ModelMetrics>,
) {
    let mut clients: HashMap<u64, Client> = HashMap::new();
    loop {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            serve(engine.as_mut(), &rx, &mut clients, &metrics)
        }));
        let Err(panic) = served else { return };
        let message = format!(
            "the engine panicked: {}; the request was ended and the engine restarted",
            super::models::panic_message(&panic)
        );
        tracing::error!(engine = name, in_flight = clients.len(), "{message}");
        for (_, client) in clients.drain() {
            let _ = client.events.send(Event::Failed(message.clone()));
            metrics.finish("error");
        }
        match make_engine() {
            Ok(fresh) => engine = fresh,
            Err(e) => {
                tracing::error!(engine = name, "the engine cannot restart, the entry stops serving: {e:#}");
                return;
            }
        }
    }
}

/// Serves until the submission channel closes.
fn serve(
    engine: &mut dyn Engine,
    rx: &std::sync::mpsc::Receiver<Submission>,
    clients: &mut HashMap<u64, Client>,
    metrics: &ModelMetrics,
) {
    let mut seen = EngineStats::default();
    loop {
        if !engine.has_work() {
            match rx.recv() {
                Ok(s) => admit(engine, clients, s),
                Err(_) => return,
            }
        }
        while let Ok(s) = rx.try_recv() {
            admit(engine, clients, s);
        }
        // Clients that went away: cancel now, freeing their blocks.
        let gone: Vec<u64> = clients.iter().filter(|(_, c)| c.events.is_closed()).map(|(&id, _)| id).collect();
        for id in gone {
            engine.cancel(id);
            clients.remove(&id);
            metrics.finish("abort");
        }
        if !engine.has_work() {
            report(engine, metrics, &mut seen);
            continue;
        }
        match engine.step() {
            Ok(updates) => {
                // Gauges and counters first: a client that reads /metrics after its answer
                // must find the step that produced it counted.
                report(engine, metrics, &mut seen);
                for update in updates {
                    deliver(engine, clients, metrics, update);
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
        report(engine, metrics, &mut seen);
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

#[cfg(test)]
mod tests {
    use dspark_host::engine::scheduler::{Scheduler, SeqId};
    use dspark_host::engine::{BackendChoice, load};

    use super::*;
    use crate::serving::metrics::Metrics;

    /// A real engine with one injected fault: its first step panics, as a bug in the engine
    /// would.
    struct PanicsOnce {
        inner: Box<dyn Engine>,
        armed: Arc<AtomicBool>,
    }

    impl Engine for PanicsOnce {
        fn add_request(&mut self, request: GenerationRequest) -> Result<SeqId, RequestError> {
            self.inner.add_request(request)
        }
        fn cancel(&mut self, id: SeqId) -> bool {
            self.inner.cancel(id)
        }
        fn step(&mut self) -> anyhow::Result<Vec<SequenceUpdate>> {
            if self.armed.swap(false, Ordering::AcqRel) {
                panic!("an injected engine fault");
            }
            self.inner.step()
        }
        fn has_work(&self) -> bool {
            self.inner.has_work()
        }
        fn stats(&self) -> EngineStats {
            self.inner.stats()
        }
        fn scheduler(&self) -> &Scheduler {
            self.inner.scheduler()
        }
        fn tokenizer(&self) -> &Arc<ModelTokenizer> {
            self.inner.tokenizer()
        }
        fn max_model_len(&self) -> usize {
            self.inner.max_model_len()
        }
    }

    async fn answer(worker: &Worker, prompt: Vec<u32>) -> Result<String, String> {
        let mut request = GenerationRequest::new(prompt);
        request.max_tokens = Some(4);
        request.ignore_eos = true;
        let mut reservation = worker.reserve(1, "n").map_err(|e| e.body().to_string())?;
        let mut ticket = worker.submit(request, &mut reservation).await.map_err(|e| e.body().to_string())?;
        let mut text = String::new();
        while let Some(event) = ticket.events.recv().await {
            match event {
                Event::Update(u) => {
                    text.push_str(&u.text);
                    if u.finish.is_some() {
                        return Ok(text);
                    }
                }
                Event::Failed(message) => return Err(message),
            }
        }
        Err("the events ended without a finish".into())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panicking_engine_ends_its_requests_with_an_error_and_restarts() {
        let (model, tokenizer) = load(BackendChoice::Cpu, &dspark_tests::smollm2()).unwrap();
        let tokenizer = Arc::new(tokenizer);
        let armed = Arc::new(AtomicBool::new(true));
        let builds = Arc::new(AtomicUsize::new(0));
        let (m, t, a, b) = (model.clone(), tokenizer.clone(), armed.clone(), builds.clone());
        let make_engine: EngineFactory = Box::new(move || {
            b.fetch_add(1, Ordering::Relaxed);
            let inner = m.clone().engine(t.clone(), &EngineConfig::default())?;
            Ok(Box::new(PanicsOnce { inner, armed: a.clone() }) as Box<dyn Engine>)
        });
        let metrics = Metrics::default().model("test");
        let vocab = model.config().vocab_size;
        let worker = Worker::start("test", make_engine, tokenizer.clone(), vocab, 512, 8, metrics).unwrap();
        let prompt = tokenizer.encode("Count:").unwrap();

        let failed = answer(&worker, prompt.clone()).await.unwrap_err();
        assert_eq!(
            failed,
            "the engine panicked: an injected engine fault; the request was ended and the engine restarted"
        );
        let text = answer(&worker, prompt).await.expect("the restarted engine serves");
        assert!(!text.is_empty());
        assert!(worker.alive());
        assert_eq!(builds.load(Ordering::Relaxed), 2, "a fresh engine was built");
    }
}
