//! `dspark fuzz`: a mutation fuzzer for the parsers that read untrusted input, on the stable
//! toolchain (cargo-fuzz needs a nightly one, which these machines cannot fetch).
//!
//! Each [`target`](targets) takes bytes and must return, for any bytes, without a panic, an
//! abort or a hang. The fuzzer starts from a corpus of real inputs (`fuzz/corpus/<target>/`),
//! and each round mutates one of them (bit flips, byte and chunk edits, splices of two inputs,
//! the target's dictionary of tokens, lengths and depths pushed to their extremes), runs the
//! target, and keeps inputs whose outcome class (accepted, or the first words of the error) is
//! new, a cheap stand-in for coverage. A panic saves the input to `fuzz/crashes/<target>/` and
//! fails the run; an input that runs longer than `--timeout` does too.

mod targets;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use dspark_bench::rng::SplitMix64 as Rng;

pub use targets::{TARGETS, Target};

/// The most inputs kept in memory (seeds and mutants).
const MAX_CORPUS: usize = 4096;

/// What a run found.
#[derive(Debug, Default)]
pub struct Report {
    /// Inputs run.
    pub runs: u64,
    /// Distinct outcome classes seen.
    pub classes: usize,
    /// Inputs in the corpus at the end (seeds and kept mutants).
    pub corpus: usize,
    /// Where the first crashing input was saved, if any.
    pub crash: Option<(PathBuf, String)>,
}

/// A draw below `n`.
fn below(rng: &mut Rng, n: usize) -> usize {
    rng.below(n as u64) as usize
}

/// One mutation of `input`, drawing on `corpus` for splices and `dictionary` for tokens.
fn mutate(rng: &mut Rng, input: &[u8], corpus: &[Vec<u8>], dictionary: &[&[u8]], max_len: usize) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + below(rng, 4) {
        let at = below(rng, out.len() + 1);
        match below(rng, 9) {
            0 if !out.is_empty() => {
                let i = below(rng, out.len());
                out[i] ^= 1 << below(rng, 8);
            }
            1 if !out.is_empty() => {
                let i = below(rng, out.len());
                out[i] = rng.next_u64() as u8;
            }
            2 if !out.is_empty() => {
                let end = (at + 1 + below(rng, 16)).min(out.len());
                out.drain(at.min(end)..end);
            }
            3 => {
                let word = dictionary.get(below(rng, dictionary.len())).copied().unwrap_or(b"");
                out.splice(at..at, word.iter().copied());
            }
            4 if !out.is_empty() => {
                // Repeat a chunk many times: deep nesting, long runs.
                let start = below(rng, out.len());
                let end = (start + 1 + below(rng, 8)).min(out.len());
                let chunk = out[start..end].to_vec();
                let times = [2, 16, 256, 4096][below(rng, 4)];
                for _ in 0..times {
                    out.splice(end..end, chunk.iter().copied());
                    if out.len() > max_len {
                        break;
                    }
                }
            }
            5 if !corpus.is_empty() => {
                let other = &corpus[below(rng, corpus.len())];
                let from = below(rng, other.len() + 1);
                out.truncate(at);
                out.extend_from_slice(&other[from..]);
            }
            6 => {
                // An interesting number in text.
                let n = ["0", "-1", "4294967295", "18446744073709551615", "1e308", "-0.0", "9999999999"][below(rng, 7)];
                out.splice(at..at, n.bytes());
            }
            7 if out.len() >= 8 => {
                // An interesting number in binary (lengths and counts of binary formats).
                let i = below(rng, out.len() - 7);
                let v: u64 = [0, 1, u32::MAX as u64, u64::MAX, 1 << 31, 1 << 40][below(rng, 6)];
                out[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                if !out.is_empty() {
                    let i = below(rng, out.len());
                    out.insert(i, out[i]);
                }
            }
        }
    }
    out.truncate(max_len);
    out
}

/// Reads every file of `dir` (a missing folder is an empty corpus).
fn read_corpus(dir: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(read) => read.flatten().map(|e| e.path()).filter(|p| p.is_file()).collect(),
        Err(_) => return Ok(Vec::new()),
    };
    files.sort();
    files.iter().map(|f| std::fs::read(f).with_context(|| format!("cannot read {}", f.display()))).collect()
}

/// Fuzzes `target` for `duration`, from the corpus in `corpus_dir`, saving crashes under
/// `crash_dir`. Every seed is run first, as is.
pub fn run(
    target: &Target,
    corpus_dir: &Path,
    crash_dir: &Path,
    duration: Duration,
    seed: u64,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut corpus = read_corpus(corpus_dir)?;
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let mut rng = Rng(seed);
    let mut classes: HashSet<String> = HashSet::new();
    let mut report = Report::default();
    // A watchdog: an input that runs past `timeout` is a hang, and ends the process after
    // saving it (a running target cannot be interrupted from outside).
    let busy = Arc::new(std::sync::Mutex::new(None::<(Instant, Vec<u8>)>));
    let done = Arc::new(AtomicBool::new(false));
    {
        let (busy, done, crash_dir, name) = (busy.clone(), done.clone(), crash_dir.to_path_buf(), target.name);
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                let hung = busy.lock().ok().and_then(|b| b.as_ref().filter(|(at, _)| at.elapsed() > timeout).cloned());
                if let Some((_, input)) = hung {
                    let path = save(&crash_dir, "hang", &input);
                    eprintln!("fuzz {name}: an input ran longer than {timeout:?}; saved to {}", path.display());
                    std::process::exit(2);
                }
            }
        });
    }
    let started = Instant::now();
    let seeds = corpus.len();
    let mut i = 0;
    while i < seeds || started.elapsed() < duration {
        let input = if i < seeds {
            corpus[i].clone()
        } else {
            let base = corpus[below(&mut rng, corpus.len())].clone();
            mutate(&mut rng, &base, &corpus, target.dictionary, target.max_len)
        };
        i += 1;
        if let Ok(mut b) = busy.lock() {
            *b = Some((Instant::now(), input.clone()));
        }
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (target.run)(&input)));
        if let Ok(mut b) = busy.lock() {
            *b = None;
        }
        report.runs += 1;
        match outcome {
            Ok(class) => {
                if classes.insert(class) && i > seeds {
                    if corpus.len() < MAX_CORPUS {
                        corpus.push(input);
                    } else {
                        // Full: a new find replaces a kept mutant, never a seed.
                        let slot = seeds + below(&mut rng, corpus.len() - seeds);
                        corpus[slot] = input;
                    }
                }
            }
            Err(panic) => {
                let message = crate::serving::models::panic_message(&panic);
                let path = save(crash_dir, "crash", &input);
                report.crash = Some((path, message));
                break;
            }
        }
    }
    done.store(true, Ordering::Relaxed);
    report.classes = classes.len();
    report.corpus = corpus.len();
    Ok(report)
}

fn save(dir: &Path, what: &str, input: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let hash = dspark_host::plugin::health::constraint_key(what, &String::from_utf8_lossy(input), "");
    let path = dir.join(format!("{what}-{hash:016x}"));
    let _ = std::fs::write(&path, input);
    path
}

/// The target called `name`.
pub fn target(name: &str) -> anyhow::Result<&'static Target> {
    match TARGETS.iter().find(|t| t.name == name) {
        Some(t) => Ok(t),
        None => {
            let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            bail!("no fuzz target `{name}`; the targets are {}", names.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_within_the_length_and_vary() {
        let mut rng = Rng(7);
        let seeds = vec![b"{\"type\":\"string\"}".to_vec()];
        let mut seen = HashSet::new();
        for _ in 0..500 {
            let m = mutate(&mut rng, &seeds[0], &seeds, &[b"$ref"], 4096);
            assert!(m.len() <= 4096);
            seen.insert(m);
        }
        assert!(seen.len() > 400, "mutations repeat too often: {}", seen.len());
    }
}
