//! `dspark fuzz TARGET`: runs one fuzz target (see [`crate::fuzz`]) for a while.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use crate::fuzz;

/// Arguments of `dspark fuzz`.
#[derive(Debug, clap::Args)]
pub struct FuzzArgs {
    /// The target (`list` prints them).
    target: String,
    /// How long to mutate after running the seeds, in seconds.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The seed corpus (default: fuzz/corpus/TARGET).
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// Where a crashing or hanging input is saved (default: fuzz/crashes/TARGET).
    #[arg(long)]
    crashes: Option<PathBuf>,
    /// The random seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
    /// An input running longer than this many seconds is a hang.
    #[arg(long, default_value_t = 20)]
    timeout: u64,
}

/// Runs `dspark fuzz`: exit 0 when nothing crashed.
pub fn run(args: FuzzArgs) -> anyhow::Result<ExitCode> {
    if args.target == "list" {
        for t in fuzz::TARGETS {
            println!("{:<16} {}", t.name, t.about);
        }
        return Ok(ExitCode::SUCCESS);
    }
    let target = fuzz::target(&args.target)?;
    let corpus = args.corpus.unwrap_or_else(|| PathBuf::from("fuzz/corpus").join(target.name));
    let crashes = args.crashes.unwrap_or_else(|| PathBuf::from("fuzz/crashes").join(target.name));
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    // Deep inputs recurse deep natively (in Wasm the same recursion is a trap the host
    // handles): a large stack keeps that from reading as a crash.
    let (duration, timeout) = (Duration::from_secs(args.seconds), Duration::from_secs(args.timeout));
    let report = std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || fuzz::run(target, &corpus, &crashes, duration, seed, timeout))
        .context("cannot start the fuzzing thread")?
        .join()
        .map_err(|_| anyhow::anyhow!("the fuzzer itself panicked"))??;
    println!(
        "fuzz {}: {} runs, {} outcome classes, corpus {} (seed {seed})",
        target.name, report.runs, report.classes, report.corpus
    );
    match report.crash {
        None => {
            println!("no crash");
            Ok(ExitCode::SUCCESS)
        }
        Some((path, message)) => {
            println!("CRASH: {message}\ninput saved to {}", path.display());
            Ok(ExitCode::from(1))
        }
    }
}
