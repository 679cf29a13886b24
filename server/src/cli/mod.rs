//! Argument parsing and dispatch.

mod authoring;
mod constraint;
mod fuzz;
mod generate;
mod plugins;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use dspark_host::plugin::{PluginRuntime, RuntimeConfig};

/// dspark: an OpenAI-compatible inference server with WebAssembly constraint plugins.
#[derive(Debug, Parser)]
#[command(name = "dspark", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Inspect the plugin registry.
    #[command(subcommand)]
    Plugins(plugins::PluginsCommand),
    /// Exercise constraints without a model.
    #[command(subcommand)]
    Constraint(constraint::ConstraintCommand),
    /// Measure the engine: decode and prefill speed against the memory-bandwidth floor, chunks,
    /// peak memory.
    EngineBench(dspark_bench::engine_bench::EngineBenchArgs),
    /// Serve models over the OpenAI API.
    Serve(serve::ServeArgs),
    /// Generate text from a prompt with a GGUF model (prints prompt and decode timings).
    Generate(generate::GenerateArgs),
    /// Load-test an OpenAI-compatible server (ours, llama.cpp, vLLM) with structured-output
    /// workloads, optionally against a second target.
    Bench(dspark_bench::load::BenchArgs),
    /// Fuzz a parser of untrusted input (schemas, grammars, regexes, GGUF, requests, tool
    /// calls) from its seed corpus; exit 1 on a crash, saving the input.
    Fuzz(fuzz::FuzzArgs),
    /// Run every CUDA kernel on a GPU against its CPU reference (needs an NVIDIA driver and
    /// NVRTC on LD_LIBRARY_PATH; scripts/gpu-check.sh runs it).
    CudaCheck(dspark_bench::cuda_check::CudaCheckArgs),
}

/// Options every command that runs plugins shares.
#[derive(Debug, Clone, clap::Args)]
pub struct RuntimeArgs {
    /// The plugin registry directory.
    #[arg(long, default_value = "plugins", env = "DSPARK_PLUGINS_DIR")]
    pub plugins_dir: PathBuf,
    /// Where compiled components are cached and quarantines recorded (default:
    /// $DSPARK_STATE_DIR, else ~/.cache/dspark).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

impl RuntimeArgs {
    /// Starts a plugin runtime with these options.
    pub fn runtime(&self) -> anyhow::Result<Arc<PluginRuntime>> {
        let state = match &self.state_dir {
            Some(d) => d.clone(),
            None => RuntimeConfig::default_state_dir()?,
        };
        PluginRuntime::new(RuntimeConfig::new(state))
    }
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Plugins(c) => plugins::run(c),
        Command::Constraint(c) => constraint::run(c),
        Command::EngineBench(a) => dspark_bench::engine_bench::run(a).map(|()| ExitCode::SUCCESS),
        Command::Serve(a) => serve::run(a).map(|()| ExitCode::SUCCESS),
        Command::Generate(a) => generate::run(a).map(|()| ExitCode::SUCCESS),
        Command::Bench(a) => dspark_bench::load::run(a).map(|()| ExitCode::SUCCESS),
        Command::CudaCheck(a) => dspark_bench::cuda_check::run(a),
        Command::Fuzz(a) => fuzz::run(a),
    }
}
