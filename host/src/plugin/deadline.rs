//! [`CallDeadline`]: a plugin call's time limit, counted in the CPU time the call used rather
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

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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

/// The deadline of the call a Store is running; one per Store, armed by every call.
#[derive(Debug)]
pub(crate) struct CallDeadline {
    tick: Duration,
    /// Microseconds since the runtime started, as the epoch ticker last read them.
    clock_us: Arc<AtomicU64>,
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
    pub(crate) fn new(tick: Duration, clock_us: Arc<AtomicU64>) -> Self {
        Self { tick, clock_us, limit: Duration::ZERO, started_us: 0, cpu_mark: None, stopped: None }
    }

    /// Starts a call with `limit` of CPU time; returns the epoch deadline to set, in ticks.
    pub(crate) fn arm(&mut self, limit: Duration) -> u64 {
        self.arm_at(limit, self.clock_us.load(Ordering::Relaxed))
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
        self.decide(thread_cpu_time(), self.clock_us.load(Ordering::Relaxed))
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
