//! `dspark`: the command-line entry point.
//!
//! Subcommands so far: `plugins list|validate` (the plugin registry) and `constraint check`
//! (drive a real constraint plugin in wasmtime over a text, without a model). `serve`,
//! `generate` and `bench` arrive with the engine and server work.

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
