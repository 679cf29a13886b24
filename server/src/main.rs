//! `dspark`: the command-line entry point.
//!
//! Subcommands: `serve` (the OpenAI-compatible server: [`openai`] speaks the API, [`serving`]
//! runs the model entries), `generate` (one prompt through the engine, optionally
//! constrained), `plugins list|validate|new|build|unquarantine` (the plugin registry, and a
//! plugin author's scaffold and build), `constraint check` (drive a real constraint plugin in
//! wasmtime without a model), `fuzz` (the parsers of untrusted input, see [`fuzz`]), and the
//! benchmarks and diagnostics of
//! the `dspark-bench` crate: `constraint maskbench`, `engine-bench`, `bench` (a load generator
//! for any OpenAI-compatible server) and `cuda-check`.

mod cli;
mod fuzz;
mod openai;
mod serving;

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
