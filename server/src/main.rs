//! `dspark`: the command-line entry point.
//!
//! Subcommands so far: `plugins list|validate` (the plugin registry), `constraint check|maskbench`
//! (drive a real constraint plugin in wasmtime without a model) and `generate` (one prompt
//! through the engine). `serve` and `bench` arrive with the server work.

mod cli;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
