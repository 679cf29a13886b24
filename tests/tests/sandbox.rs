//! Hostile plugins against the real sandbox: each misbehaviour gives that call a clear error,
//! the host stays up, other plugins keep serving, a plugin that keeps failing is quarantined,
//! and a costly input is refused without counting against the plugin.

use std::sync::Arc;
use std::time::Duration;

use dspark_host::plugin::{ErrorCode, MatcherHandle, PluginError, PluginInstance, PluginStatus, TrapCause};
use dspark_host::tokenizer::CanonicalTokenizer;
use dspark_tests::{ByteTokenizer, Fixture, builtin_plugin, test_plugin};

/// Deadlines generous enough that a loaded CI machine never hits them by accident; the tests of
/// the deadlines themselves set short ones with [`fixture_with_deadlines`].
fn fixture(strike_limit: u32) -> Fixture {
    fixture_with_deadlines(strike_limit, Duration::from_secs(10), Duration::from_secs(10))
}

fn fixture_with_deadlines(strike_limit: u32, mask_deadline: Duration, compile_deadline: Duration) -> Fixture {
    Fixture::new(&[test_plugin("testkit"), builtin_plugin("regex")], |c| {
        c.strike_limit = strike_limit;
        c.mask_deadline = mask_deadline;
        c.compile_deadline = compile_deadline;
        c.memory_bytes = 32 << 20;
    })
}

fn instance(f: &Fixture, plugin: &str, tok: &Arc<ByteTokenizer>) -> PluginInstance {
    let p = f.registry.get(plugin).unwrap_or_else(|| panic!("{plugin} loaded"));
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    p.instantiate(tok.table(), canonical).expect("instantiates")
}

/// The regex plugin still compiles and masks correctly.
fn regex_still_serves(f: &Fixture, tok: &Arc<ByteTokenizer>) {
    let mut inst = instance(f, "regex", tok);
    let c = inst.compile("regex", "ab+", "{}").expect("regex compiles");
    let m = inst.new_matcher(&c).expect("matcher");
    let mask = inst.compute_mask(&m).expect("mask");
    assert!(mask.allows(b'a' as u32) && !mask.allows(b'b' as u32));
}

/// The trap message of the first mask of a testkit matcher of `kind`.
fn mask_trap(f: &Fixture, tok: &Arc<ByteTokenizer>, kind: &str) -> String {
    let mut inst = instance(f, "testkit", tok);
    let c = inst.compile(kind, "", "{}").unwrap();
    let m = inst.new_matcher(&c).unwrap();
    trap_message(inst.compute_mask(&m).unwrap_err())
}

fn trap_message(e: PluginError) -> String {
    match e {
        PluginError::Trap { message, .. } => message,
        other => panic!("expected a trap, got {other:?}"),
    }
}

/// A testkit instance with a matcher whose masks never end, under a mask limit of 50 ms.
fn endless_matcher() -> (Fixture, Arc<ByteTokenizer>, PluginInstance, MatcherHandle) {
    let f = fixture_with_deadlines(100, Duration::from_millis(50), Duration::from_secs(10));
    let tok = ByteTokenizer::new(&[]);
    let mut inst = instance(&f, "testkit", &tok);
    let c = inst.compile("loop-mask", "", "{}").unwrap();
    let m = inst.new_matcher(&c).unwrap();
    (f, tok, inst, m)
}

#[test]
fn endless_mask_hits_the_deadline_and_the_host_goes_on() {
    let (f, tok, mut inst, m) = endless_matcher();
    let msg = trap_message(inst.compute_mask(&m).unwrap_err());
    assert!(msg.contains("exceeded its time limit of 50 ms"), "{msg}");
    // The old matcher died with its Store; the instance itself restarts on the next compile.
    assert!(matches!(inst.compute_mask(&m), Err(PluginError::Stale { .. })));
    let c = inst.compile("bitset", "", "{}").expect("a fresh Store compiles again");
    let m = inst.new_matcher(&c).unwrap();
    assert!(inst.compute_mask(&m).is_ok());
    regex_still_serves(&f, &tok);
}

/// The epoch ticker rests while no call runs; a call that comes then still has its deadline.
#[test]
fn an_endless_mask_is_stopped_after_the_ticker_rested() {
    let (f, tok, mut inst, m) = endless_matcher();
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while !f.runtime.ticker_resting() {
        assert!(std::time::Instant::now() < until, "the epoch ticker never rested");
        std::thread::sleep(Duration::from_millis(5));
    }
    let msg = trap_message(inst.compute_mask(&m).unwrap_err());
    assert!(msg.contains("exceeded its time limit of 50 ms"), "{msg}");
    regex_still_serves(&f, &tok);
}

#[test]
fn a_plugin_that_sleeps_is_stopped_at_once_and_the_host_goes_on() {
    // Run on a thread: were sleeping allowed, this call would block for an hour, and a test
    // must fail rather than hang.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let f = fixture(100);
        let tok = ByteTokenizer::new(&[]);
        let msg = mask_trap(&f, &tok, "sleep-mask");
        regex_still_serves(&f, &tok);
        let _ = tx.send(msg);
    });
    let msg = rx.recv_timeout(Duration::from_secs(120)).expect("the sleeping call returned");
    assert!(msg.contains("asked to sleep") && msg.contains("plugins may not wait"), "{msg}");
}

/// A tokenizer that takes `pause` of wall time, and no CPU, to answer: the guest's thread
/// stands still inside a call, as it does when a loaded machine deschedules it.
struct PausingTokenizer {
    inner: Arc<ByteTokenizer>,
    pause: Duration,
}

impl CanonicalTokenizer for PausingTokenizer {
    fn tokenize(&self, text: &[u8]) -> Vec<u32> {
        std::thread::sleep(self.pause);
        self.inner.tokenize(text)
    }
}

/// A testkit matcher whose every mask waits `pause` in the host's tokenizer, under a mask
/// limit of 20 ms.
fn pausing_matcher(f: &Fixture, tok: &Arc<ByteTokenizer>, pause: Duration) -> (PluginInstance, MatcherHandle) {
    let pausing: Arc<dyn CanonicalTokenizer> = Arc::new(PausingTokenizer { inner: tok.clone(), pause });
    let mut inst = f.registry.get("testkit").expect("testkit loaded").instantiate(tok.table(), pausing).unwrap();
    let c = inst.compile("tokenize-mask", "", "{}").unwrap();
    let m = inst.new_matcher(&c).unwrap();
    (inst, m)
}

#[test]
fn a_call_is_judged_by_its_cpu_time_not_by_the_time_that_passed() {
    // A strike limit of 1: a single interruption would quarantine the plugin.
    let f = fixture_with_deadlines(1, Duration::from_millis(20), Duration::from_secs(10));
    let tok = ByteTokenizer::new(&[]);
    let (mut inst, m) = pausing_matcher(&f, &tok, Duration::from_millis(80));
    for _ in 0..3 {
        let started = std::time::Instant::now();
        inst.compute_mask(&m).expect("a call that waited 4 limits but computed little goes on");
        assert!(started.elapsed() >= Duration::from_millis(80));
    }
    assert_eq!(f.registry.get("testkit").unwrap().status(), PluginStatus::Ready);
}

#[test]
fn a_call_that_waits_past_the_backstop_is_stopped() {
    let f = fixture_with_deadlines(100, Duration::from_millis(20), Duration::from_secs(10));
    let tok = ByteTokenizer::new(&[]);
    let (mut inst, m) = pausing_matcher(&f, &tok, Duration::from_millis(1500));
    let msg = trap_message(inst.compute_mask(&m).unwrap_err());
    assert_eq!(
        msg,
        "did not finish in 1000 ms of wall-clock time, using 0 ms of CPU after its time limit of 20 ms \
         passed: it was waiting, not computing"
    );
    regex_still_serves(&f, &tok);
}

#[test]
fn endless_compile_hits_the_compile_deadline() {
    let f = fixture_with_deadlines(100, Duration::from_secs(10), Duration::from_millis(500));
    let tok = ByteTokenizer::new(&[]);
    let mut inst = instance(&f, "testkit", &tok);
    let msg = trap_message(inst.compile("endless-compile", "", "{}").unwrap_err());
    assert!(msg.contains("exceeded its time limit of 500 ms"), "{msg}");
    regex_still_serves(&f, &tok);
}

#[test]
fn memory_bomb_is_stopped_by_the_store_limit() {
    // Filling 32 MiB a megabyte at a time took longer than 50 ms on a loaded CI machine, so the
    // deadline fired first; with the generous default the memory limit is what stops it.
    let f = fixture(100);
    let tok = ByteTokenizer::new(&[]);
    let msg = mask_trap(&f, &tok, "membomb");
    // The message says which limit, and which manifest key raises it.
    assert!(msg.contains("exceeded its memory limit of 32 MiB (it asked for"), "{msg}");
    assert!(
        msg.contains("raise `memory_mib` under `[limits]` in its plugin.toml (this host allows up to 2048 MiB)"),
        "{msg}"
    );
    regex_still_serves(&f, &tok);
}

#[test]
fn panic_is_a_trap_with_the_panic_message() {
    let f = fixture(100);
    let tok = ByteTokenizer::new(&[]);
    let msg = mask_trap(&f, &tok, "panic");
    assert!(msg.contains("panicked") && msg.contains("deliberate panic in compute-mask"), "{msg}");
    regex_still_serves(&f, &tok);
}

#[test]
fn invalid_answers_are_refused() {
    let f = fixture(100);
    let tok = ByteTokenizer::new(&[]);
    let vocab = tok.table().vocab_size();
    let mut inst = instance(&f, "testkit", &tok);
    let cases = [
        (
            "bad-mask-len",
            "compute-mask",
            format!(
                "the bitset has {} words; a vocabulary of {vocab} needs exactly {}",
                vocab.div_ceil(32) + 3,
                vocab.div_ceil(32)
            ),
        ),
        ("bad-token", "compute-mask", format!("token id {} is not below the vocabulary size {vocab}", vocab + 5)),
        ("huge-span", "commit", "a forced span of 1000000 tokens exceeds the cap of 4096".to_string()),
    ];
    for (kind, call, want) in cases {
        let c = inst.compile(kind, "", "{}").unwrap();
        let m = inst.new_matcher(&c).unwrap();
        let err =
            if call == "commit" { inst.commit(&m, &[1]).unwrap_err() } else { inst.compute_mask(&m).unwrap_err() };
        match err {
            PluginError::InvalidOutput { call: got_call, message, .. } => {
                assert_eq!(got_call, call, "{kind}");
                assert_eq!(message, want, "{kind}");
            }
            other => panic!("{kind}: expected an invalid-output error, got {other:?}"),
        }
    }
    // Invalid answers do not kill the Store: the same instance keeps working.
    let c = inst.compile("bitset", "", "{}").unwrap();
    let m = inst.new_matcher(&c).unwrap();
    assert!(inst.compute_mask(&m).is_ok());
}

#[test]
fn a_plugin_that_keeps_trapping_is_quarantined_and_others_keep_serving() {
    let f = fixture(3);
    let tok = ByteTokenizer::new(&[]);
    let plugin = f.registry.get("testkit").unwrap();
    let mut inst = instance(&f, "testkit", &tok);
    let panic_under = |inst: &mut PluginInstance, source: &str| {
        let c = inst.compile("panic", source, "{}").unwrap();
        let m = inst.new_matcher(&c).unwrap();
        assert!(matches!(inst.compute_mask(&m), Err(PluginError::Trap { cause: TrapCause::Fault, .. })));
    };
    // One input repeated is one strike, however often: a client cannot quarantine a plugin
    // by sending the same request again and again.
    for _ in 0..5 {
        panic_under(&mut inst, "one");
    }
    assert_eq!((plugin.status(), plugin.strikes()), (PluginStatus::Ready, 1));
    // Faults under three different constraints are a broken plugin.
    panic_under(&mut inst, "two");
    panic_under(&mut inst, "three");
    assert_eq!(plugin.status(), PluginStatus::Quarantined);
    let err = inst.compile("bitset", "", "{}").unwrap_err();
    assert!(matches!(err, PluginError::Quarantined { strikes: 3, .. }), "{err:?}");
    assert!(err.to_string().ends_with("or lift the quarantine with `dspark plugins unquarantine testkit`"), "{err}");
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    assert!(matches!(plugin.instantiate(tok.table(), canonical.clone()), Err(PluginError::Quarantined { .. })));
    let listed = f.registry.list();
    let row = listed.iter().find(|p| p.name == "testkit").unwrap();
    assert_eq!(row.status, "quarantined");
    assert_eq!(f.registry.find_kind("bitset").map(|p| p.name().to_string()), None);
    regex_still_serves(&f, &tok);
    // The quarantine is recorded for this component: a new runtime over the same state
    // directory (e.g. `dspark plugins list`) sees it too.
    let again = f.runtime.load(&f.plugins.path().join("testkit")).unwrap();
    assert_eq!(again.status(), PluginStatus::Quarantined);
    // An operator lifts it (`dspark plugins unquarantine`): the next scan serves it again.
    assert!(f.runtime.unquarantine(&plugin.sha256).unwrap());
    assert_eq!(f.registry.scan().unquarantined, vec!["testkit"]);
    assert_eq!((plugin.status(), plugin.strikes()), (PluginStatus::Ready, 0));
    let mut inst = plugin.instantiate(tok.table(), canonical).expect("serves again");
    assert!(inst.compile("bitset", "", "{}").is_ok());
    // A server that does not keep quarantines forgets the records of an earlier run.
    panic_under(&mut inst, "four");
    panic_under(&mut inst, "five");
    panic_under(&mut inst, "six");
    assert_eq!(f.runtime.forget_quarantines().unwrap(), 1);
    assert_eq!(f.runtime.load(&f.plugins.path().join("testkit")).unwrap().status(), PluginStatus::Ready);
}

/// A constraint that exhausts a resource (time, memory) fails its request with a clear error
/// and is refused for a while without entering the plugin again; it is the input's cost, and
/// counts nothing against the plugin, whatever the number of such inputs.
#[test]
fn costly_constraints_are_refused_and_strike_nothing() {
    let f = fixture_with_deadlines(3, Duration::from_secs(10), Duration::from_millis(100));
    let tok = ByteTokenizer::new(&[]);
    let plugin = f.registry.get("testkit").unwrap();
    let mut inst = instance(&f, "testkit", &tok);
    for source in ["a", "b", "c", "d", "e"] {
        match inst.compile("endless-compile", source, "{}").unwrap_err() {
            PluginError::Trap { cause: TrapCause::Deadline, message, .. } => {
                assert!(message.contains("exceeded its time limit of 100 ms"), "{message}")
            }
            other => panic!("expected a deadline trap, got {other:?}"),
        }
    }
    // The same input again is refused at once, saying why and for how long.
    let again = inst.compile("endless-compile", "a", "{}").unwrap_err();
    assert!(matches!(again, PluginError::Refused { .. }), "{again:?}");
    assert!(again.is_user_error());
    let text = again.to_string();
    assert!(
        text.starts_with("plugin `testkit` refuses this constraint for another ")
            && text.ends_with(" s: it exceeded its time limit of 100 ms of CPU time"),
        "{text}"
    );
    // A memory bomb under a matcher refuses its constraint too.
    let c = inst.compile("membomb", "", "{}").unwrap();
    let m = inst.new_matcher(&c).unwrap();
    assert!(matches!(inst.compute_mask(&m), Err(PluginError::Trap { cause: TrapCause::Memory, .. })));
    assert!(matches!(inst.compile("membomb", "", "{}"), Err(PluginError::Refused { .. })));
    assert_eq!((plugin.status(), plugin.strikes()), (PluginStatus::Ready, 0));
    assert!(inst.compile("bitset", "", "{}").is_ok(), "the plugin serves other constraints");
}

#[test]
fn plugins_get_no_filesystem_no_environment_and_frozen_clocks() {
    let f = fixture(100);
    let tok = ByteTokenizer::new(&[]);
    let mut inst = instance(&f, "testkit", &tok);
    match inst.compile("wasi-probe", "", "{}").unwrap_err() {
        PluginError::Constraint { error, .. } => {
            assert_eq!(error.code, ErrorCode::Unsupported);
            let m = error.message;
            assert!(m.starts_with("fs=denied("), "{m}");
            assert!(m.contains(" env=0 ") && m.contains(" wall=0 ") && m.ends_with(" monotonic_elapsed=0"), "{m}");
        }
        other => panic!("expected the probe's report, got {other:?}"),
    }
}

#[test]
fn a_plugins_words_are_cut_to_size_at_the_boundary() {
    let f = fixture(2);
    let tok = ByteTokenizer::new(&[]);
    let mut inst = instance(&f, "testkit", &tok);
    let PluginError::Constraint { error, .. } = inst.compile("verbose", "error", "{}").unwrap_err() else {
        panic!("a constraint error")
    };
    // 2,048 two-byte characters, then what was cut.
    assert_eq!(error.message, format!("{} [... 995904 of 1000000 bytes cut]", "é".repeat(2048)));
    assert_eq!(error.location, Some(format!("{} [... 1048064 of 1048576 bytes cut]", "x".repeat(512))));
    let compiled = inst.compile("verbose", "", "{}").unwrap();
    assert_eq!(compiled.warnings.len(), 65);
    assert_eq!(compiled.warnings[0], ("/0".to_string(), format!("{} [... 5904 of 10000 bytes cut]", "w".repeat(4096))));
    assert_eq!(compiled.warnings[64], (String::new(), "936 more warnings were left out".to_string()));
    assert_eq!(f.registry.get("testkit").unwrap().status(), PluginStatus::Ready);
}

#[test]
fn error_values_are_not_strikes() {
    let f = fixture(2);
    let tok = ByteTokenizer::new(&[]);
    let mut inst = instance(&f, "regex", &tok);
    for _ in 0..5 {
        match inst.compile("regex", "(", "{}").unwrap_err() {
            PluginError::Constraint { error, .. } => {
                assert_eq!(error.code, ErrorCode::InvalidSource);
                assert!(error.message.contains("unclosed group"), "{}", error.message);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(f.registry.get("regex").unwrap().status(), PluginStatus::Ready);
}
