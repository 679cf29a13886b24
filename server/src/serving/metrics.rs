//! Prometheus metrics at `GET /metrics`.
//!
//! vLLM's names and labels (`model_name`, and `finished_reason` on request counts), so
//! GPUStack and inference gateways that read vLLM's metrics read ours unchanged, plus
//! `dspark_*` series for the constraint machinery.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dspark_host::constraint::{ConstraintObserver, TreeStats};

/// Latency buckets in seconds (vLLM's TTFT buckets).
const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// Buckets for per-call times (masks, compiles).
const CALL_BUCKETS: &[f64] = &[1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1.0, 5.0];

/// A cumulative histogram.
#[derive(Debug)]
pub struct Histogram {
    buckets: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Self {
        Self { buckets, counts: vec![0; buckets.len()], sum: 0.0, count: 0 }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: f64) {
        for (bound, count) in self.buckets.iter().zip(&mut self.counts) {
            if value <= *bound {
                *count += 1;
            }
        }
        self.sum += value;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, count) in self.buckets.iter().zip(&self.counts) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {count}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

/// An f64 gauge.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    /// Sets the value.
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    /// The value.
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// A counter.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// The value.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The series of one served model.
#[derive(Debug)]
pub struct ModelMetrics {
    /// Sequences running.
    pub running: Gauge,
    /// Sequences waiting.
    pub waiting: Gauge,
    /// KV-cache usage in [0, 1].
    pub kv_cache_usage: Gauge,
    /// Time to first token.
    pub ttft: Mutex<Histogram>,
    /// Time between tokens (per token, a chunk's tokens share its interval).
    pub inter_token: Mutex<Histogram>,
    /// Request latency.
    pub e2e: Mutex<Histogram>,
    /// Prompt tokens of finished requests.
    pub prompt_tokens: Counter,
    /// Completion tokens (sampled and forced) of finished requests.
    pub generation_tokens: Counter,
    /// Finished requests by reason.
    pub finished: Mutex<BTreeMap<&'static str, u64>>,
    /// Tokens appended by fast-forward without sampling.
    pub forced_tokens: Counter,
    /// Forward passes (engine steps).
    pub steps: Counter,
    /// Rows those steps computed (every token fed: prompt, decoded, forced, drafted).
    pub step_rows: Counter,
    /// Microseconds in those forward passes.
    pub step_us: Counter,
    /// Drafted tokens fed to the model ahead of sampling (DSpark's path-tree guesses and
    /// prompt lookup).
    pub speculated_tokens: Counter,
    /// Drafted tokens that sampling then drew (a step saved each).
    pub speculated_accepted: Counter,
    /// Steps times constrained sequences whose fast-forward chunk was cut beside an
    /// unconstrained neighbour (`extra_rows_beside_unconstrained`).
    pub cut_chunks: Counter,
    /// Logits rows computed under their constraint's mask.
    pub masked_logits_rows: Counter,
    /// Of those rows' vocabulary entries, the ones their masks allowed.
    pub masked_logits_allowed: Counter,
    /// Those rows' vocabulary entries in all.
    pub masked_logits_vocab: Counter,
    /// Time per plugin mask call.
    pub mask_seconds: Mutex<Histogram>,
    /// Time per constraint compilation.
    pub compile_seconds: Mutex<Histogram>,
    /// Constrained answers that finished with `stop` but did not validate (must stay 0).
    pub validation_failures: Counter,
    /// Preempted sequences.
    pub preemptions: Counter,
    /// Path-tree answers (starts, masks, edges) served from the cache, per finished request.
    pub path_tree_hits: Counter,
    /// Path-tree answers the plugin had to compute.
    pub path_tree_misses: Counter,
    /// Constraint masks the engine used.
    pub masks: Counter,
    /// Microseconds sampling waited for masks (the whole mask time on the classic path,
    /// what outlasted the forward pass with overlap).
    pub mask_wait_us: Counter,
}

impl ModelMetrics {
    fn new() -> Self {
        Self {
            running: Gauge::default(),
            waiting: Gauge::default(),
            kv_cache_usage: Gauge::default(),
            ttft: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            inter_token: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            e2e: Mutex::new(Histogram::new(LATENCY_BUCKETS)),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            finished: Mutex::new(BTreeMap::new()),
            forced_tokens: Counter::default(),
            steps: Counter::default(),
            step_rows: Counter::default(),
            step_us: Counter::default(),
            speculated_tokens: Counter::default(),
            speculated_accepted: Counter::default(),
            cut_chunks: Counter::default(),
            masked_logits_rows: Counter::default(),
            masked_logits_allowed: Counter::default(),
            masked_logits_vocab: Counter::default(),
            mask_seconds: Mutex::new(Histogram::new(CALL_BUCKETS)),
            compile_seconds: Mutex::new(Histogram::new(CALL_BUCKETS)),
            validation_failures: Counter::default(),
            preemptions: Counter::default(),
            path_tree_hits: Counter::default(),
            path_tree_misses: Counter::default(),
            masks: Counter::default(),
            mask_wait_us: Counter::default(),
        }
    }

    /// Counts a finished request.
    pub fn finish(&self, reason: &'static str) {
        if let Ok(mut f) = self.finished.lock() {
            *f.entry(reason).or_insert(0) += 1;
        }
    }
}

/// The constraint runtime reports its plugin calls and path-tree walks here.
impl ConstraintObserver for ModelMetrics {
    fn compiled(&self, took: Duration) {
        lock(&self.compile_seconds).observe(took.as_secs_f64());
    }

    fn mask_computed(&self, took: Duration) {
        lock(&self.mask_seconds).observe(took.as_secs_f64());
    }

    fn walked(&self, stats: TreeStats) {
        self.path_tree_hits.add(stats.hits);
        self.path_tree_misses.add(stats.misses);
    }
}

/// All series.
#[derive(Debug, Default)]
pub struct Metrics {
    models: Mutex<BTreeMap<String, Arc<ModelMetrics>>>,
}

/// Locks a mutex, recovering from a panicked holder (metrics must never take the server down).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Metrics {
    /// The series of `model`, created on first use.
    pub fn model(&self, model: &str) -> Arc<ModelMetrics> {
        lock(&self.models).entry(model.to_string()).or_insert_with(|| Arc::new(ModelMetrics::new())).clone()
    }

    /// Prometheus text format. `plugin_strikes` are (plugin, strikes) pairs.
    pub fn render(&self, plugin_strikes: &[(String, u32)]) -> String {
        let models = lock(&self.models);
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, get: &dyn Fn(&ModelMetrics) -> f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (model, m) in models.iter() {
                let _ = writeln!(out, "{name}{{model_name=\"{}\"}} {}", escape(model), get(m));
            }
        };
        gauge(&mut out, "vllm:num_requests_running", "Requests in the running batch.", &|m| m.running.get());
        gauge(&mut out, "vllm:num_requests_waiting", "Requests waiting to run.", &|m| m.waiting.get());
        gauge(&mut out, "vllm:kv_cache_usage_perc", "KV-cache usage (1 is full).", &|m| m.kv_cache_usage.get());
        let counter = |out: &mut String, name: &str, help: &str, get: &dyn Fn(&ModelMetrics) -> u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (model, m) in models.iter() {
                let _ = writeln!(out, "{name}{{model_name=\"{}\"}} {}", escape(model), get(m));
            }
        };
        counter(&mut out, "vllm:prompt_tokens_total", "Prompt tokens processed.", &|m| m.prompt_tokens.get());
        counter(&mut out, "vllm:generation_tokens_total", "Generated tokens.", &|m| m.generation_tokens.get());
        counter(&mut out, "vllm:num_preemptions_total", "Preempted sequences.", &|m| m.preemptions.get());
        counter(&mut out, "dspark_fast_forward_tokens_total", "Tokens appended without sampling.", &|m| {
            m.forced_tokens.get()
        });
        counter(&mut out, "dspark_steps_total", "Forward passes (engine steps).", &|m| m.steps.get());
        counter(&mut out, "dspark_step_rows_total", "Rows (tokens) those forward passes computed.", &|m| {
            m.step_rows.get()
        });
        counter(&mut out, "dspark_step_microseconds_total", "Time in those forward passes.", &|m| m.step_us.get());
        counter(
            &mut out,
            "dspark_speculated_tokens_total",
            "Drafted tokens fed ahead of sampling (guesses, prompt lookup).",
            &|m| m.speculated_tokens.get(),
        );
        counter(&mut out, "dspark_speculated_accepted_total", "Drafted tokens that sampling drew.", &|m| {
            m.speculated_accepted.get()
        });
        counter(
            &mut out,
            "dspark_cut_chunks_total",
            "Fast-forward chunks cut to the extra rows allowed beside unconstrained requests (per step).",
            &|m| m.cut_chunks.get(),
        );
        counter(&mut out, "dspark_masked_logits_rows_total", "Logits rows computed under their mask.", &|m| {
            m.masked_logits_rows.get()
        });
        counter(
            &mut out,
            "dspark_masked_logits_allowed_total",
            "Vocabulary entries those masks allowed (the rest need no logit).",
            &|m| m.masked_logits_allowed.get(),
        );
        counter(&mut out, "dspark_masked_logits_vocab_total", "Vocabulary entries of those rows.", &|m| {
            m.masked_logits_vocab.get()
        });
        counter(&mut out, "dspark_path_tree_hits_total", "Constraint answers served by the path tree.", &|m| {
            m.path_tree_hits.get()
        });
        counter(&mut out, "dspark_path_tree_misses_total", "Constraint answers computed by the plugin.", &|m| {
            m.path_tree_misses.get()
        });
        counter(&mut out, "dspark_masks_total", "Constraint masks applied at sampling.", &|m| m.masks.get());
        let _ = writeln!(
            out,
            "# HELP dspark_mask_wait_seconds_total Time sampling waited for constraint masks.\n\
             # TYPE dspark_mask_wait_seconds_total counter"
        );
        for (model, m) in models.iter() {
            let _ = writeln!(
                out,
                "dspark_mask_wait_seconds_total{{model_name=\"{}\"}} {}",
                escape(model),
                m.mask_wait_us.get() as f64 / 1e6
            );
        }
        counter(
            &mut out,
            "dspark_validation_failures_total",
            "Constrained answers finished with stop that did not validate.",
            &|m| m.validation_failures.get(),
        );
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Finished requests.\n# TYPE vllm:request_success_total counter"
        );
        for (model, m) in models.iter() {
            for (reason, n) in lock(&m.finished).iter() {
                let _ = writeln!(
                    out,
                    "vllm:request_success_total{{model_name=\"{}\",finished_reason=\"{reason}\"}} {n}",
                    escape(model)
                );
            }
        }
        let histogram = |out: &mut String, name: &str, help: &str, get: &dyn Fn(&ModelMetrics) -> &Mutex<Histogram>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (model, m) in models.iter() {
                lock(get(m)).render(out, name, &format!("model_name=\"{}\"", escape(model)));
            }
        };
        histogram(&mut out, "vllm:time_to_first_token_seconds", "Time to first token.", &|m| &m.ttft);
        histogram(&mut out, "vllm:inter_token_latency_seconds", "Time between output tokens.", &|m| &m.inter_token);
        histogram(&mut out, "vllm:e2e_request_latency_seconds", "Request latency.", &|m| &m.e2e);
        histogram(&mut out, "dspark_mask_compute_seconds", "Time per constraint mask.", &|m| &m.mask_seconds);
        histogram(&mut out, "dspark_constraint_compile_seconds", "Time per constraint compilation.", &|m| {
            &m.compile_seconds
        });
        let _ = writeln!(
            out,
            "# HELP dspark_plugin_strikes Traps and deadline overruns per plugin.\n# TYPE dspark_plugin_strikes gauge"
        );
        for (plugin, strikes) in plugin_strikes {
            let _ = writeln!(out, "dspark_plugin_strikes{{plugin=\"{}\"}} {strikes}", escape(plugin));
        }
        out
    }
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}
