//! `dspark`: the command-line entry point.
//!
//! Subcommands so far: `plugins list|validate` (the plugin registry), `constraint check|maskbench`
//! (drive a real constraint plugin in wasmtime without a model) and `generate` (one prompt
//! through the engine), `serve` (the OpenAI-compatible server), `engine-bench` (the engine
//! alone) and `bench` (a load generator for any OpenAI-compatible server).

mod bench;
mod cli;
mod serve;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    // SAFETY: the first statement of `main`: no other thread exists yet.
    unsafe { dspark_host::engine::backend::cpu::quiet_candle_workers() };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DSPARK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
