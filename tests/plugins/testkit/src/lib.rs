//! `testkit`: a plugin for dspark's own tests and benchmarks. Each kind behaves in one
//! particular (mostly hostile) way, so the host's sandbox can be tested against a real guest:
//!
//! | kind              | behaviour                                                   |
//! |-------------------|-------------------------------------------------------------|
//! | `bitset`          | well-behaved; every mask is an incompressible full bitset   |
//! | `loop-mask`       | `compute-mask` never returns                                |
//! | `sleep-mask`      | `compute-mask` sleeps for an hour (a WASI clock subscribe)  |
//! | `tokenize-mask`   | `compute-mask` asks the host to tokenize `"hello"` first    |
//! | `endless-compile` | `compile` never returns                                     |
//! | `membomb`         | `compute-mask` allocates until memory runs out              |
//! | `panic`           | `compute-mask` panics (a trap)                              |
//! | `bad-mask-len`    | `compute-mask` returns a bitset of the wrong length         |
//! | `bad-token`       | `compute-mask` allows a token id beyond the vocabulary      |
//! | `huge-span`       | `commit` returns a forced span of a million tokens          |
//! | `wasi-probe`      | `compile` reports, as an error message, what WASI granted   |
//! | `verbose`         | source `error`: a 1 MB error; else 1,000 warnings of 10 KB  |

use std::hint::black_box;
use std::sync::Arc;

use dspark_guest::{
    CommitResult, CompiledConstraint, ConstraintError, ErrorCode, Mask, Matcher, Plugin, TokenTable, Warning,
};

const KINDS: [&str; 12] = [
    "bitset",
    "loop-mask",
    "sleep-mask",
    "tokenize-mask",
    "endless-compile",
    "membomb",
    "panic",
    "bad-mask-len",
    "bad-token",
    "huge-span",
    "wasi-probe",
    "verbose",
];

/// The plugin.
#[derive(Default)]
pub struct Testkit;

struct Compiled {
    kind: &'static str,
    table: Arc<TokenTable>,
    words: Arc<Vec<u32>>,
}

#[derive(Clone)]
struct TestMatcher {
    kind: &'static str,
    table: Arc<TokenTable>,
    words: Arc<Vec<u32>>,
    len: u32,
}

impl Plugin for Testkit {
    fn kinds(&self) -> Vec<String> {
        KINDS.iter().map(|k| k.to_string()).collect()
    }

    fn compile(
        &self,
        kind: &str,
        source: &str,
        _options: &str,
        table: &Arc<TokenTable>,
    ) -> Result<Arc<dyn CompiledConstraint>, ConstraintError> {
        dspark_guest::check_kind(kind, &KINDS)?;
        // The served name as a `'static` str (the frames keep it).
        let kind = KINDS.iter().copied().find(|k| *k == kind).unwrap_or("bitset");
        if kind == "verbose" && source == "error" {
            let mut e = ConstraintError::new(ErrorCode::InvalidSource, "é".repeat(500_000));
            e.location = Some("x".repeat(1 << 20));
            return Err(e);
        }
        if kind == "wasi-probe" {
            return Err(ConstraintError::new(ErrorCode::Unsupported, wasi_probe()));
        }
        if kind == "endless-compile" {
            let mut n = 0u64;
            loop {
                n = black_box(n.wrapping_add(1));
            }
        }
        let vocab = table.vocab_size();
        // Alternating bits: a mask no smaller form can express.
        let mut words = vec![0x5555_5555u32; vocab.div_ceil(32)];
        if !vocab.is_multiple_of(32)
            && let Some(last) = words.last_mut()
        {
            *last &= (1u32 << (vocab % 32)) - 1;
        }
        Ok(Arc::new(Compiled { kind, table: table.clone(), words: Arc::new(words) }))
    }
}

impl CompiledConstraint for Compiled {
    fn warnings(&self) -> Vec<Warning> {
        if self.kind != "verbose" {
            return Vec::new();
        }
        (0..1000).map(|i| Warning { location: format!("/{i}"), message: "w".repeat(10_000) }).collect()
    }

    fn new_matcher(&self) -> Box<dyn Matcher> {
        Box::new(TestMatcher { kind: self.kind, table: self.table.clone(), words: self.words.clone(), len: 0 })
    }
}

impl Matcher for TestMatcher {
    fn compute_mask(&mut self) -> Result<Mask, ConstraintError> {
        match self.kind {
            "loop-mask" => {
                let mut n = 0u64;
                loop {
                    n = black_box(n.wrapping_add(1));
                }
            }
            "tokenize-mask" => {
                black_box(self.table.tokenize(b"hello"));
                Ok(Mask::Bitset(self.words.to_vec()))
            }
            "sleep-mask" => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                Ok(Mask::Bitset(self.words.to_vec()))
            }
            "membomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![black_box(1u8); 1 << 20]);
                    black_box(&hoard);
                }
            }
            "panic" => panic!("testkit: deliberate panic in compute-mask"),
            "bad-mask-len" => Ok(Mask::Bitset(vec![u32::MAX; self.words.len() + 3])),
            "bad-token" => Ok(Mask::Allow(vec![1, self.table.vocab_size() as u32 + 5])),
            _ => Ok(Mask::Bitset(self.words.to_vec())),
        }
    }

    fn commit(&mut self, tokens: &[u32]) -> Result<CommitResult, ConstraintError> {
        self.len += tokens.len() as u32;
        if self.kind == "huge-span" {
            return Ok(CommitResult { forced: vec![1; 1_000_000], stop: false });
        }
        Ok(CommitResult::default())
    }

    fn rollback(&mut self, n: u32) -> Result<(), ConstraintError> {
        self.len =
            self.len.checked_sub(n).ok_or_else(|| ConstraintError::new(ErrorCode::InvalidState, "rollback too far"))?;
        Ok(())
    }

    fn validate_draft(&self, tokens: &[u32]) -> u32 {
        tokens.len() as u32
    }

    fn fork(&self) -> Box<dyn Matcher> {
        Box::new(self.clone())
    }

    fn is_accepting(&self) -> bool {
        true
    }

    fn is_stopped(&self) -> bool {
        false
    }

    fn state_key(&self) -> u64 {
        self.len as u64
    }
}

/// What the sandbox lets the guest see: filesystem, environment, clocks.
fn wasi_probe() -> String {
    let fs = match std::fs::read_dir("/") {
        Ok(_) => "open".to_string(),
        Err(e) => format!("denied({e})"),
    };
    let env = std::env::vars().count();
    let wall =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(u64::MAX);
    let t0 = std::time::Instant::now();
    black_box(fs.len());
    let mono = t0.elapsed().as_nanos();
    format!("fs={fs} env={env} wall={wall} monotonic_elapsed={mono}")
}

dspark_guest::export_plugin!(Testkit);
