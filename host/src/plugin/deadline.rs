//! `CallDeadline`: a plugin call's time limit, counted in the CPU time the call used rather
//! than the time that passed.
//!
//! Why not the wall clock: the epoch ticker measures wall time, and on a loaded machine (a
//! busy 2-core CI box, a noisy cloud neighbour, the engine's own worker threads) a mask that
//! needs 3 ms of CPU can take 15 ms to finish. A wall-clock limit then traps a well-behaved
//! plugin, strikes it, and after a few strikes quarantines it: load alone would take
//! structured output down. A plugin is judged by what it did, so it is stopped when it has
//! *run* for its limit.
//!
//! Why not read the CPU clock at every call: a thread's CPU clock is a system call
//! (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, about 0.75 µs on this project's VMs), a fifth of
//! a typical 4 µs mask call. So the clock is read only once a call has outlived its limit on
//! the wall clock, which well-behaved calls never do:
//!
//! 1. A call with limit `D` starts with an epoch deadline of `D`, noting the time the ticker
//!    last read (an atomic load, no clock read).
//! 2. At the first epoch callback (the call has taken `D` of wall time) the thread's CPU clock
//!    is read as a mark, and the call goes on.
//! 3. At each later callback the CPU used since the mark is compared with `D`; once it has
//!    reached `D` the call is interrupted.
//!
//! A call is therefore never stopped before it used `D` of CPU time, and a call that spins is
//! stopped after at most `2D` of it (`D` of wall time, at most all of it on the CPU, then `D`
//! measured). A backstop also stops a call that has taken [`WALL_FACTOR`]` × D` (at least
//! [`MIN_WALL_LIMIT`]) of wall time whatever its CPU use: a call that waits instead of
//! computing. The runtime refuses the WASI calls a plugin could sleep with, so the backstop is
//! for ways to block nobody has thought of (a guest blocked in the host is only seen when it
//! returns to wasm, so the backstop counts from the call's start, not from the mark). Its clock
//! is the ticker's, at most a tick behind, so it errs towards patience. Where no
//! thread CPU clock exists (not Unix), the first callback stops the call: the plain wall-clock
//! limit.
//!
//! The ticker rests while no call runs ([`EpochClock`]). Deadlines only matter inside a call,
//! and an idle server, or one with DSpark on, whose path tree answers almost every mask
//! without a call, had the ticker wake a thousand times a second for nothing (3.3% of the CPU
//! samples of a profile of the server at concurrency 1, mostly context switches, each taking a
//! core from the forward pass; DSpark at concurrency 1 served 2-10% more requests per second
//! without them). A call that finds it resting reads the clock itself and wakes it; it rests
//! again after [`IDLE_TICKS`] ticks without a call.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How many times its limit a call may take on the wall clock before it is stopped anyway.
pub const WALL_FACTOR: u32 = 20;

/// The least wall-clock time a call is given before the backstop stops it.
pub const MIN_WALL_LIMIT: Duration = Duration::from_secs(1);

/// Why a call was interrupted; kept so the error can say which limit it ran into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stop {
    /// It used its whole limit of CPU time.
    Cpu,
    /// It took the backstop's wall-clock time, having used `cpu` of CPU time since the mark.
    Wall { cpu: Duration },
}

/// What the epoch callback does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Go on; call back after this many ticks.
    Continue(u64),
    /// Interrupt the call.
    Interrupt,
}

/// Ticks without a call after which the epoch ticker rests.
pub const IDLE_TICKS: u32 = 50;

/// What the epoch ticker shares with the calls: its coarse clock, and whether it may rest.
#[derive(Debug)]
pub struct EpochClock {
    start: Instant,
    /// Microseconds since `start`, as last read by the ticker (or by a call that woke it).
    clock_us: AtomicU64,
    /// Calls armed and not yet over: the ticker never rests while one runs.
    active: AtomicU64,
    /// Calls armed since the start, so the ticker sees calls that began and ended between
    /// two of its ticks.
    started: AtomicU64,
    /// Set by the ticker before it parks; a call that swaps it back wakes the ticker.
    resting: AtomicBool,
    /// The ticker's thread, to unpark.
    ticker: OnceLock<std::thread::Thread>,
}

impl Default for EpochClock {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            clock_us: AtomicU64::new(0),
            active: AtomicU64::new(0),
            started: AtomicU64::new(0),
            resting: AtomicBool::new(false),
            ticker: OnceLock::new(),
        }
    }
}

impl EpochClock {
    /// Microseconds since the clock started, as last read (at most a tick old while a call
    /// runs).
    pub fn now_us(&self) -> u64 {
        self.clock_us.load(Ordering::Relaxed)
    }

    /// Reads the time into the coarse clock.
    pub fn read(&self) {
        self.clock_us.store(self.start.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// Whether the ticker is resting (parked until a call comes).
    pub fn resting(&self) -> bool {
        self.resting.load(Ordering::SeqCst)
    }

    /// Names the thread that ticks (the one [`Self::tick_or_rest`] parks); the ticker calls
    /// it before its first tick.
    pub fn set_ticker(&self, thread: std::thread::Thread) {
        let _ = self.ticker.set(thread);
    }

    /// Wakes the resting ticker, e.g. so that it sees the runtime is gone and stops.
    pub fn wake_ticker(&self) {
        if let Some(t) = self.ticker.get() {
            t.unpark();
        }
    }

    /// A call starts: counted, and if the ticker rests, the clock is read here (the call's
    /// start must not be dated from when the ticker stopped) and the ticker woken.
    fn call_started(&self) {
        self.started.fetch_add(1, Ordering::SeqCst);
        self.active.fetch_add(1, Ordering::SeqCst);
        // After the increment: either the ticker sees this call before it parks, or this sees
        // that it rests (sequentially consistent), and an unpark before its park is kept.
        if self.resting.swap(false, Ordering::SeqCst) {
            self.read();
            self.wake_ticker();
        }
    }

    /// A call is over.
    fn call_ended(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// The ticker's loop body after each tick: `idle` counts the ticks since the last call
    /// (`seen` is the count of calls it last saw). After [`IDLE_TICKS`] of them, and with no
    /// call running, it parks until a call wakes it or `rest` passes.
    pub fn tick_or_rest(&self, idle: &mut u32, seen: &mut u64, rest: Duration) {
        let started = self.started.load(Ordering::SeqCst);
        if started != *seen || self.active.load(Ordering::SeqCst) > 0 {
            (*idle, *seen) = (0, started);
            return;
        }
        *idle += 1;
        if *idle < IDLE_TICKS {
            return;
        }
        self.resting.store(true, Ordering::SeqCst);
        if self.active.load(Ordering::SeqCst) == 0 && self.started.load(Ordering::SeqCst) == *seen {
            std::thread::park_timeout(rest);
        }
        self.read();
        self.resting.store(false, Ordering::SeqCst);
        // The next tick rests again, unless a call came meanwhile (the check at the top sees
        // it): a rest that ran out is not followed by another `IDLE_TICKS` ticks.
        *idle = IDLE_TICKS - 1;
    }
}

/// The deadline of the call a Store is running; one per Store, armed by every call.
#[derive(Debug)]
pub(crate) struct CallDeadline {
    tick: Duration,
    /// The epoch ticker's clock.
    clock: Arc<EpochClock>,
    /// Whether a call is armed and not yet disarmed (counted in the clock's running calls).
    armed: bool,
    limit: Duration,
    /// `clock_us` when the call started.
    started_us: u64,
    /// The thread's CPU clock when the call first outlived `limit` on the wall clock.
    cpu_mark: Option<Duration>,
    stopped: Option<Stop>,
}

impl CallDeadline {
    /// A deadline on epoch ticks `tick` long, with the ticker's clock `clock_us`; armed by
    /// [`CallDeadline::arm`].
    pub(crate) fn new(tick: Duration, clock: Arc<EpochClock>) -> Self {
        Self { tick, clock, armed: false, limit: Duration::ZERO, started_us: 0, cpu_mark: None, stopped: None }
    }

    /// Starts a call with `limit` of CPU time (waking the ticker if it rests); returns the
    /// epoch deadline to set, in ticks. Pair with [`Self::disarm`] when the call is over (a
    /// deadline left armed only keeps the ticker awake).
    pub(crate) fn arm(&mut self, limit: Duration) -> u64 {
        if !self.armed {
            self.armed = true;
            self.clock.call_started();
        }
        self.arm_at(limit, self.clock.now_us())
    }

    /// The call is over: the ticker may rest. What [`Self::limit`] and [`Self::stopped`]
    /// say about it stays.
    pub(crate) fn disarm(&mut self) {
        if std::mem::take(&mut self.armed) {
            self.clock.call_ended();
        }
    }

    fn arm_at(&mut self, limit: Duration, now_us: u64) -> u64 {
        self.limit = limit;
        self.started_us = now_us;
        self.cpu_mark = None;
        self.stopped = None;
        ticks(limit, self.tick)
    }

    /// The limit of the call last armed.
    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// Why the last call was interrupted, if it was.
    pub(crate) fn stopped(&self) -> Option<Stop> {
        self.stopped
    }

    /// The epoch callback: reads the calling thread's CPU clock and decides.
    pub(crate) fn on_epoch(&mut self) -> Verdict {
        self.decide(thread_cpu_time(), self.clock.now_us())
    }

    /// The decision of [`CallDeadline::on_epoch`] given the thread's CPU clock and the
    /// ticker's.
    fn decide(&mut self, cpu_now: Option<Duration>, now_us: u64) -> Verdict {
        let Some(cpu_now) = cpu_now else {
            self.stopped = Some(Stop::Cpu);
            return Verdict::Interrupt;
        };
        let used = match self.cpu_mark {
            Some(mark) => cpu_now.saturating_sub(mark),
            None => {
                self.cpu_mark = Some(cpu_now);
                Duration::ZERO
            }
        };
        if used >= self.limit {
            self.stopped = Some(Stop::Cpu);
            return Verdict::Interrupt;
        }
        if Duration::from_micros(now_us.saturating_sub(self.started_us)) >= wall_limit(self.limit) {
            self.stopped = Some(Stop::Wall { cpu: used });
            return Verdict::Interrupt;
        }
        Verdict::Continue(ticks(self.limit - used, self.tick))
    }
}

impl Drop for CallDeadline {
    fn drop(&mut self) {
        self.disarm();
    }
}

/// The wall-clock time after which the backstop stops a call with `limit` of CPU time.
pub fn wall_limit(limit: Duration) -> Duration {
    (limit * WALL_FACTOR).max(MIN_WALL_LIMIT)
}

/// `d` in epoch ticks of length `tick`, rounded up, at least one.
pub(crate) fn ticks(d: Duration, tick: Duration) -> u64 {
    (d.as_micros().div_ceil(tick.as_micros().max(1)) as u64).max(1)
}

/// The CPU time the calling thread has used, where the system has a clock for it.
#[cfg(unix)]
fn thread_cpu_time() -> Option<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

#[cfg(not(unix))]
fn thread_cpu_time() -> Option<Duration> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A deadline on 1 ms ticks armed with `limit` at `t0` µs, and `t0`.
    fn armed(limit: Duration) -> (CallDeadline, u64) {
        let mut d = CallDeadline::new(MS, Arc::default());
        let t0 = 7_000;
        assert_eq!(d.arm_at(limit, t0), limit.as_millis() as u64);
        (d, t0)
    }

    /// Waits up to 10 s for `done`.
    fn eventually(done: impl Fn() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while !done() {
            if Instant::now() > until {
                return false;
            }
            std::thread::sleep(MS);
        }
        true
    }

    /// The ticker rests after `IDLE_TICKS` ticks without a call, never while a call runs;
    /// a call that finds it resting dates its start from a fresh clock and wakes it.
    #[test]
    fn the_ticker_rests_between_calls_and_a_call_wakes_it() {
        let clock = Arc::new(EpochClock::default());
        let stop = Arc::new(AtomicBool::new(false));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = {
            let (clock, stop, ticks) = (clock.clone(), stop.clone(), ticks.clone());
            std::thread::spawn(move || {
                let (mut idle, mut seen) = (0, 0);
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(MS);
                    clock.read();
                    ticks.fetch_add(1, Ordering::SeqCst);
                    // A rest far longer than the test: only a call (or the stop) ends it.
                    clock.tick_or_rest(&mut idle, &mut seen, Duration::from_secs(600));
                }
            })
        };
        clock.set_ticker(ticker.thread().clone());
        assert!(eventually(|| clock.resting()), "the ticker never rested");
        let parked_at = ticks.load(Ordering::SeqCst);
        std::thread::sleep(20 * MS);
        assert_eq!(ticks.load(Ordering::SeqCst), parked_at, "a resting ticker ticked");
        let stale = clock.now_us();
        let before = clock.start.elapsed().as_micros() as u64;
        let mut d = CallDeadline::new(MS, clock.clone());
        assert_eq!(d.arm(10 * MS), 10);
        assert!(d.started_us >= before && before >= stale + 20_000, "{stale} {before} {}", d.started_us);
        assert!(eventually(|| ticks.load(Ordering::SeqCst) > parked_at + 3 * u64::from(IDLE_TICKS)));
        assert!(!clock.resting(), "the ticker rested while a call ran");
        d.disarm();
        assert!(eventually(|| clock.resting()), "the ticker never rested after the call");
        stop.store(true, Ordering::SeqCst);
        clock.wake_ticker();
        ticker.join().expect("the ticker stops when woken");
    }

    /// A ticker whose rest ran out with no call rests again at its next tick; after a call
    /// it ticks `IDLE_TICKS` more times first.
    #[test]
    fn a_ticker_woken_by_its_timeout_alone_rests_again_at_once() {
        let clock = Arc::new(EpochClock::default());
        let (mut idle, mut seen) = (0, 0);
        for _ in 0..IDLE_TICKS {
            clock.tick_or_rest(&mut idle, &mut seen, MS);
        }
        assert_eq!(idle, IDLE_TICKS - 1);
        let mut d = CallDeadline::new(MS, clock.clone());
        d.arm(MS);
        d.disarm();
        clock.tick_or_rest(&mut idle, &mut seen, MS);
        assert_eq!((idle, seen), (0, 1));
    }

    /// Calls that start and end between two ticks keep the ticker awake too, and a dropped
    /// deadline counts as over.
    #[test]
    fn short_calls_between_ticks_count() {
        let clock = Arc::new(EpochClock::default());
        let (mut idle, mut seen) = (0, 0);
        for _ in 0..IDLE_TICKS - 1 {
            clock.tick_or_rest(&mut idle, &mut seen, MS);
        }
        assert_eq!(idle, IDLE_TICKS - 1);
        let mut d = CallDeadline::new(MS, clock.clone());
        d.arm(MS);
        d.arm(MS);
        drop(d);
        assert_eq!(clock.active.load(Ordering::SeqCst), 0);
        clock.tick_or_rest(&mut idle, &mut seen, MS);
        assert_eq!((idle, seen), (0, 1));
    }

    #[test]
    fn the_first_callback_only_marks() {
        let (mut d, t0) = armed(10 * MS);
        assert_eq!(d.decide(Some(5 * MS), t0 + 10_000), Verdict::Continue(10));
        assert_eq!(d.stopped(), None);
    }

    #[test]
    fn a_call_is_stopped_once_it_used_its_limit_of_cpu_after_the_mark() {
        let (mut d, t0) = armed(10 * MS);
        d.decide(Some(100 * MS), t0);
        // 4 ms of CPU in 10 ms of wall time: 6 ms of CPU left.
        assert_eq!(d.decide(Some(104 * MS), t0 + 10_000), Verdict::Continue(6));
        assert_eq!(d.decide(Some(109 * MS), t0 + 20_000), Verdict::Continue(1));
        assert_eq!(d.decide(Some(110 * MS), t0 + 21_000), Verdict::Interrupt);
        assert_eq!(d.stopped(), Some(Stop::Cpu));
    }

    #[test]
    fn a_starved_call_goes_on_until_the_backstop() {
        let (mut d, t0) = armed(10 * MS);
        d.decide(Some(Duration::ZERO), t0 + 10_000);
        // A thread that gets little CPU is not the plugin's fault...
        assert!(matches!(d.decide(Some(2 * MS), t0 + 500_000), Verdict::Continue(8)));
        // ...until the call has taken the backstop's wall time (1 s here: 20 × 10 ms is less).
        assert_eq!(d.decide(Some(3 * MS), t0 + 999_000), Verdict::Continue(7));
        assert_eq!(d.decide(Some(3 * MS), t0 + 1_000_000), Verdict::Interrupt);
        assert_eq!(d.stopped(), Some(Stop::Wall { cpu: 3 * MS }));
    }

    #[test]
    fn a_call_blocked_past_the_backstop_is_stopped_at_its_first_callback() {
        let (mut d, t0) = armed(10 * MS);
        assert_eq!(d.decide(Some(MS), t0 + 1_500_000), Verdict::Interrupt);
        assert_eq!(d.stopped(), Some(Stop::Wall { cpu: Duration::ZERO }));
    }

    #[test]
    fn arming_forgets_the_last_call() {
        let (mut d, t0) = armed(10 * MS);
        d.decide(Some(Duration::ZERO), t0 + 10_000);
        d.decide(Some(10 * MS), t0 + 20_000);
        assert_eq!(d.stopped(), Some(Stop::Cpu));
        assert_eq!(d.arm_at(50 * MS, t0 + 30_000), 50);
        assert_eq!((d.stopped(), d.limit()), (None, 50 * MS));
        assert_eq!(d.decide(Some(10 * MS), t0 + 80_000), Verdict::Continue(50));
    }

    #[test]
    fn without_a_cpu_clock_the_first_callback_stops_the_call() {
        let (mut d, t0) = armed(10 * MS);
        assert_eq!(d.decide(None, t0 + 10_000), Verdict::Interrupt);
        assert_eq!(d.stopped(), Some(Stop::Cpu));
    }

    #[test]
    fn the_backstop_is_twenty_limits_and_at_least_a_second() {
        assert_eq!(wall_limit(10 * MS), Duration::from_secs(1));
        assert_eq!(wall_limit(Duration::from_secs(10)), Duration::from_secs(200));
    }

    #[cfg(unix)]
    #[test]
    fn the_thread_cpu_clock_advances_with_work() {
        let a = thread_cpu_time().expect("a thread CPU clock on Unix");
        let mut x = 0u64;
        while thread_cpu_time().unwrap() < a + 2 * MS {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(x > 0);
    }
}
