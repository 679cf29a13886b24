//! dspark's benchmarks and diagnostics, kept apart from the server and reached from the
//! `dspark` command:
//!
//! - [`load`]: `dspark bench`, a load generator for any OpenAI-compatible server (ours,
//!   llama.cpp's `llama-server`, vLLM) with the published DSpark workload, optionally against a
//!   second target, interleaved;
//! - [`maskbench`]: `dspark constraint maskbench`, the MaskBench method through a real plugin in
//!   wasmtime: compile time, mask time per token, acceptance, fast-forward share;
//! - [`engine_bench`]: `dspark engine-bench`, the engine alone: decode and prefill speed against
//!   the memory-bandwidth floor, chunks, peak memory;
//! - [`cuda_check`]: `dspark cuda-check`, every CUDA kernel against its CPU reference.
//!
//! Speed is measured here, never in unit tests: the machines are shared, so the tools print
//! medians and ratios taken in one run.

pub mod cuda_check;
pub mod engine_bench;
pub mod load;
pub mod maskbench;
pub mod rng;
