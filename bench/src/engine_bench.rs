//! `dspark engine-bench`: the engine's speed and memory on one model, against the machine's
//! memory-bandwidth floor.
//!
//! Measured on the model directly (no HTTP, no sampling), each figure the median of several
//! runs:
//! - copy bandwidth: a 256 MiB `memcpy`;
//! - the floor of one decode step: the weight bytes read per step over that bandwidth;
//! - decode tokens/s at batch 1, 4 and 16 (each sequence holding `--context` tokens);
//! - prefill tokens/s (one `--prefill`-token chunk);
//! - a 16-token chunk against 16 single decode steps;
//! - the two ratios the CPU engine is judged by (batch 16 over batch 1, a chunk over a step) also from
//!   measurements taken in turn, so that both sides of a ratio meet the same load on a shared
//!   machine (see `Bench::paired_batch_ratio`);
//! - with `--rss`: peak resident memory after 16 sequences of 2,048 tokens went through the
//!   full engine (scheduler, sampler), the memory figure.
//!
//! Build with `--release`; debug numbers mean nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use dspark_host::engine::backend::{Backend, ForwardBatch, KvDtype, KvShape};
use dspark_host::engine::{CpuBackend, EngineConfig, GenerationRequest, LlmEngine, Model, SamplingParams, load_model};
use serde_json::json;

/// Arguments of `dspark engine-bench`.
#[derive(Debug, clap::Args)]
pub struct EngineBenchArgs {
    /// The GGUF model.
    #[arg(long, default_value = "assets/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// Tokens of context each decoding sequence holds.
    #[arg(long, default_value_t = 128)]
    context: usize,
    /// Tokens in the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prefill: usize,
    /// Timed decode steps per batch size.
    #[arg(long, default_value_t = 24)]
    steps: usize,
    /// Also run 16 sequences x 2,048 tokens through the engine and report peak RSS.
    #[arg(long)]
    rss: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// The KV cache's element type (auto: bf16 where the CPU has AVX-512 BF16, else f16).
    #[arg(long, default_value = "auto")]
    kv_cache_dtype: KvDtype,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Median seconds to copy 256 MiB, as bytes per second.
fn copy_bandwidth() -> f64 {
    let size = 256 << 20;
    let src = vec![1u8; size];
    let mut dst = vec![0u8; size];
    let runs: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            t.elapsed().as_secs_f64()
        })
        .collect();
    // A copy reads and writes every byte.
    2.0 * size as f64 / median(runs)
}

fn tokens(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + salt * 104_729) % (vocab - 300) + 256) as u32).collect()
}

struct Bench<'a> {
    model: &'a Model<CpuBackend>,
    vocab: usize,
    dtype: KvDtype,
}

impl Bench<'_> {
    fn cache(&self, seqs: usize, len: usize) -> anyhow::Result<<CpuBackend as Backend>::KvCache> {
        let c = self.model.config();
        let blocks_per_seq = len.div_ceil(16);
        let shape = KvShape {
            layers: c.layers,
            num_blocks: seqs * blocks_per_seq,
            block_size: 16,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            dtype: self.dtype,
        };
        self.model.backend().kv_cache(shape)
    }

    fn table(seq: usize, blocks_per_seq: usize) -> Vec<u32> {
        (0..blocks_per_seq).map(|b| (seq * blocks_per_seq + b) as u32).collect()
    }

    /// `batch` sequences of `context` tokens each, prefilled, with room for `steps` more.
    fn decoder(&self, batch: usize, context: usize, steps: usize) -> anyhow::Result<Decoder<'_>> {
        let len = context + steps + 1;
        let per_seq = len.div_ceil(16);
        let mut cache = self.cache(batch, len)?;
        for s in 0..batch {
            let mut prefill = ForwardBatch::default();
            prefill.push_sequence(&tokens(context, s, self.vocab), 0, &Self::table(s, per_seq), 16, true);
            self.model.forward(&prefill, &mut cache)?;
        }
        Ok(Decoder { bench: self, cache, batch, per_seq, position: context })
    }

    /// Median decode-step seconds at `batch` sequences of `context` tokens.
    fn decode(&self, batch: usize, context: usize, steps: usize) -> anyhow::Result<f64> {
        let mut decoder = self.decoder(batch, context, steps)?;
        let times = (0..steps).map(|_| decoder.step()).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(median(times))
    }

    /// Batch 16's tokens/s over batch 1's, from steps taken in turn (one step of each, `steps`
    /// times), as the median of the pairs' ratios.
    ///
    /// This machine is shared: a neighbour's load comes and goes within seconds and slows
    /// compute-bound work (16 rows) more than memory-bound work (one row). Measured in phases
    /// of their own, the two batch sizes met different loads, and their ratio moved between
    /// 2.6x and 4.6x from one run to the next on an idle-looking machine. A pair's two steps
    /// meet the same load.
    fn paired_batch_ratio(&self, context: usize, steps: usize) -> anyhow::Result<f64> {
        let mut one = self.decoder(1, context, steps)?;
        let mut sixteen = self.decoder(16, context, steps)?;
        let ratios =
            (0..steps).map(|_| Ok(16.0 * one.step()? / sixteen.step()?)).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(median(ratios))
    }

    /// Median seconds of one `n`-token prefill chunk.
    fn prefill(&self, n: usize) -> anyhow::Result<f64> {
        let per_seq = n.div_ceil(16);
        let times = (0..3)
            .map(|run| {
                let mut cache = self.cache(1, n)?;
                let mut b = ForwardBatch::default();
                b.push_sequence(&tokens(n, run, self.vocab), 0, &Self::table(0, per_seq), 16, true);
                let t = Instant::now();
                self.model.forward(&b, &mut cache)?;
                Ok(t.elapsed().as_secs_f64())
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(median(times))
    }

    /// Median seconds of a 16-token chunk and of 16 single steps, after `context` tokens, and
    /// the median over the rounds of the chunk's time over one of its round's single steps
    /// (paired for the reason [`Self::paired_batch_ratio`] gives).
    fn chunk(&self, context: usize) -> anyhow::Result<(f64, f64, f64)> {
        let len = context + 16;
        let per_seq = len.div_ceil(16);
        let table = Self::table(0, per_seq);
        let span = tokens(16, 99, self.vocab);
        let mut chunk_times = Vec::new();
        let mut single_times = Vec::new();
        for _ in 0..CHUNK_ROUNDS {
            let mut cache = self.cache(1, len)?;
            let mut prefill = ForwardBatch::default();
            prefill.push_sequence(&tokens(context, 0, self.vocab), 0, &table, 16, true);
            self.model.forward(&prefill, &mut cache)?;
            let mut b = ForwardBatch::default();
            b.push_sequence(&span, context, &table, 16, true);
            let t = Instant::now();
            self.model.forward(&b, &mut cache)?;
            chunk_times.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            for (i, &token) in span.iter().enumerate() {
                let mut b = ForwardBatch::default();
                b.push_sequence(&[token], context + i, &table, 16, true);
                self.model.forward(&b, &mut cache)?;
            }
            single_times.push(t.elapsed().as_secs_f64());
        }
        let ratios = chunk_times.iter().zip(&single_times).map(|(c, s)| c / (s / 16.0)).collect();
        Ok((median(chunk_times), median(single_times), median(ratios)))
    }
}

/// Rounds of the chunk measurement (each a fresh cache, a 16-token chunk and 16 single steps).
const CHUNK_ROUNDS: usize = 9;

/// Sequences being decoded together, one step at a time.
struct Decoder<'a> {
    bench: &'a Bench<'a>,
    cache: <CpuBackend as Backend>::KvCache,
    batch: usize,
    per_seq: usize,
    /// The position the next step writes.
    position: usize,
}

impl Decoder<'_> {
    /// One decode step of every sequence; its seconds.
    fn step(&mut self) -> anyhow::Result<f64> {
        let (bench, p) = (self.bench, self.position);
        let mut b = ForwardBatch::default();
        for s in 0..self.batch {
            b.push_sequence(&tokens(1, s + p, bench.vocab), p, &Bench::table(s, self.per_seq), 16, true);
        }
        let t = Instant::now();
        bench.model.forward(&b, &mut self.cache)?;
        self.position += 1;
        Ok(t.elapsed().as_secs_f64())
    }
}

/// Peak resident memory of this process, from /proc (Linux).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// 16 sequences grown to 2,048 tokens through the full engine.
fn rss_run(
    model: Arc<Model<CpuBackend>>,
    tokenizer: Arc<dspark_host::engine::ModelTokenizer>,
    dtype: KvDtype,
) -> anyhow::Result<(u64, f64)> {
    let config = EngineConfig {
        kv_cache_dtype: dtype,
        max_num_seqs: 16,
        max_model_len: Some(2048),
        max_num_batched_tokens: 2048,
        ..EngineConfig::default()
    };
    let vocab = model.config().vocab_size;
    let mut engine = LlmEngine::new(model, tokenizer, &config)?;
    for s in 0..16 {
        let mut r = GenerationRequest::new(tokens(2000, s, vocab));
        r.sampling = SamplingParams { temperature: 0.0, ..SamplingParams::default() };
        r.max_tokens = Some(48);
        r.ignore_eos = true;
        engine.add_request(r).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let t = Instant::now();
    while engine.has_work() {
        engine.step()?;
    }
    Ok((peak_rss_bytes().unwrap_or(0), t.elapsed().as_secs_f64()))
}

/// Runs `dspark engine-bench`.
pub fn run(args: EngineBenchArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; build with --release for meaningful numbers");
    }
    let (model, tokenizer) = load_model(CpuBackend::new(), &args.model)?;
    let bandwidth = copy_bandwidth();
    let weight_bytes = model.weight_bytes();
    let floor = weight_bytes as f64 / bandwidth;
    let bench_dtype = args.kv_cache_dtype;
    let bench = Bench { model: &model, vocab: model.config().vocab_size, dtype: bench_dtype };
    let mut decode = Vec::new();
    for batch in [1usize, 4, 16] {
        let step = bench.decode(batch, args.context, args.steps)?;
        decode.push((batch, step));
    }
    let prefill = bench.prefill(args.prefill)?;
    let paired_batch16 = bench.paired_batch_ratio(args.context, args.steps)?;
    let (chunk, singles, chunk_paired) = bench.chunk(args.context)?;
    let single_step = decode[0].1;
    let rss = if args.rss {
        let model = Arc::new(model);
        Some(rss_run(model, Arc::new(tokenizer), bench_dtype)?)
    } else {
        None
    };
    let b1 = 1.0 / decode[0].1;
    let report = json!({
        "model": args.model.display().to_string(),
        "target_cpu_features": {"avx2": cfg!(target_feature = "avx2"), "fma": cfg!(target_feature = "fma")},
        "threads": cpu_threads(),
        "kv_cache_dtype": format!("{bench_dtype:?}").to_lowercase(),
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "weight_bytes": weight_bytes,
        "decode_floor_ms": floor * 1e3,
        "decode": decode.iter().map(|&(b, s)| json!({"batch": b, "step_ms": s * 1e3, "tokens_per_s": b as f64 / s})).collect::<Vec<_>>(),
        "batch1_over_floor": decode[0].1 / floor,
        "batch16_over_batch1_tokens_per_s": (16.0 / decode[2].1) / b1,
        "batch16_over_batch1_paired": paired_batch16,
        "prefill_tokens": args.prefill,
        "prefill_tokens_per_s": args.prefill as f64 / prefill,
        "chunk16_ms": chunk * 1e3,
        "single_steps16_ms": singles * 1e3,
        "chunk16_over_single_step": chunk / single_step,
        "chunk16_over_single_step_paired": chunk_paired,
        "peak_rss_mb": rss.map(|(b, _)| b as f64 / 1e6),
        "rss_run_s": rss.map(|(_, s)| s),
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("model                 {}", args.model.display());
    println!("AVX2/FMA kernels      {}", cfg!(target_feature = "avx2") && cfg!(target_feature = "fma"));
    println!("KV cache              {:?}", bench_dtype);
    println!("copy bandwidth        {:.2} GB/s", bandwidth / 1e9);
    println!("weights read / step   {:.1} MB -> floor {:.2} ms", weight_bytes as f64 / 1e6, floor * 1e3);
    for &(b, s) in &decode {
        println!("decode batch {b:>2}       {:.2} ms/step, {:.1} tokens/s", s * 1e3, b as f64 / s);
    }
    println!("batch 1 vs floor      {:.2}x", decode[0].1 / floor);
    println!("batch 16 vs batch 1   {:.2}x tokens/s", (16.0 / decode[2].1) / b1);
    println!("  steps taken in turn {paired_batch16:.2}x (median of {} pairs)", args.steps);
    println!("prefill               {:.0} tokens/s ({} tokens)", args.prefill as f64 / prefill, args.prefill);
    println!(
        "16-token chunk        {:.2} ms = {:.2}x one decode step (16 steps: {:.2} ms)",
        chunk * 1e3,
        chunk / single_step,
        singles * 1e3
    );
    println!("  within each round   {chunk_paired:.2}x its 16 steps' mean (median of {CHUNK_ROUNDS} rounds)");
    if let Some((bytes, secs)) = rss {
        println!("peak RSS 16 x 2048    {:.0} MB (run {:.1} s)", bytes as f64 / 1e6, secs);
    }
    Ok(())
}

fn cpu_threads() -> usize {
    dspark_host::engine::backend::cpu::threads::threads()
}
