//! The quarantine policy: telling a faulty plugin from a costly input.
//!
//! A plugin call can trap for two different reasons, and only one of them is the plugin's:
//!
//! - **A costly input** exhausts a resource: the call used its CPU-time limit, its memory limit
//!   or its stack (a schema nested 100,000 deep, a catastrophic pattern). The request fails with
//!   a clear error, and that constraint — by the sha256 of its kind, source and options — is
//!   *refused* for [`RuntimeConfig::refusal_period`]: the same input is answered at once, without
//!   entering the plugin again. This counts nothing against the plugin: any user can write a
//!   costly schema, and no user may disable a plugin for the others.
//! - **A fault** is anything else: a panic, an invalid answer, a trap at `init`. It is a strike,
//!   remembered with the constraint it happened under. The plugin is quarantined when faults
//!   under [`RuntimeConfig::strike_limit`] *distinct* constraints (faults outside any constraint,
//!   such as `init`, each count as distinct) fall within [`RuntimeConfig::strike_window`]; older
//!   faults are forgotten. One hostile input repeated cannot quarantine a plugin; a plugin that
//!   fails on many inputs is broken, and stops being offered.
//!
//! A quarantine is written to the state directory (`quarantine/<sha256>`) so that `dspark
//! plugins list` shows it and `dspark plugins unquarantine NAME` can lift it (a running server
//! sees the record removed at its next registry scan). It survives a restart only when the
//! operator asks (`dspark serve --persist-quarantine`); otherwise the server calls
//! [`PluginRuntime::forget_quarantines`] at start and every plugin starts afresh.
//!
//! [`RuntimeConfig::refusal_period`]: super::RuntimeConfig::refusal_period
//! [`RuntimeConfig::strike_limit`]: super::RuntimeConfig::strike_limit
//! [`RuntimeConfig::strike_window`]: super::RuntimeConfig::strike_window
//! [`PluginRuntime::forget_quarantines`]: super::PluginRuntime::forget_quarantines

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// What stopped a call that trapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrapCause {
    /// It used its CPU-time limit (or waited past the wall-clock backstop).
    Deadline,
    /// It asked for more linear memory than its limit.
    Memory,
    /// It overflowed its stack.
    Stack,
    /// Anything else: a panic, an unreachable instruction, a host refusal.
    Fault,
}

impl TrapCause {
    /// Whether the trap is an exhausted resource, which an input can cause in a correct plugin.
    pub fn is_resource(self) -> bool {
        !matches!(self, TrapCause::Fault)
    }
}

/// A constraint's identity for the policy: the first 8 bytes of the sha256 of its kind, source
/// and options (a collision would need a sha256 prefix collision, which a client cannot aim).
pub fn constraint_key(kind: &str, source: &str, options: &str) -> u64 {
    let mut h = Sha256::new();
    for part in [kind, source, options] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    u64::from_le_bytes(digest[..8].try_into().unwrap_or_default())
}

/// The most refused constraints remembered per plugin; the oldest go first.
const MAX_REFUSALS: usize = 4096;

/// A constraint refused after it exhausted a resource.
#[derive(Clone, Debug)]
struct Refusal {
    at: Instant,
    reason: String,
}

/// The fault and refusal records of one loaded plugin.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// (when, constraint) of each fault in the window; `None` for a fault outside a constraint.
    faults: Mutex<VecDeque<(Instant, Option<u64>)>>,
    refusals: Mutex<HashMap<u64, Refusal>>,
}

impl Health {
    /// Records a fault; returns the number of distinct constraints with a fault in `window`.
    pub(crate) fn fault(&self, constraint: Option<u64>, window: Duration) -> u32 {
        let now = Instant::now();
        let mut faults = lock(&self.faults);
        faults.push_back((now, constraint));
        while faults.front().is_some_and(|(at, _)| now.duration_since(*at) > window) {
            faults.pop_front();
        }
        distinct(&faults)
    }

    /// Distinct constraints with a fault in `window`, as of now.
    pub(crate) fn strikes(&self, window: Duration) -> u32 {
        let now = Instant::now();
        let faults = lock(&self.faults);
        let recent: VecDeque<_> = faults.iter().filter(|(at, _)| now.duration_since(*at) <= window).copied().collect();
        distinct(&recent)
    }

    /// Forgets every fault (the quarantine was lifted).
    pub(crate) fn clear_faults(&self) {
        lock(&self.faults).clear();
    }

    /// Refuses `constraint` for a while, because of `reason`.
    pub(crate) fn refuse(&self, constraint: u64, reason: String) {
        let mut refusals = lock(&self.refusals);
        if refusals.len() >= MAX_REFUSALS
            && let Some(oldest) = refusals.iter().min_by_key(|(_, r)| r.at).map(|(k, _)| *k)
        {
            refusals.remove(&oldest);
        }
        refusals.insert(constraint, Refusal { at: Instant::now(), reason });
    }

    /// Why `constraint` is refused and for how much longer, if it is within `period` of its
    /// refusal.
    pub(crate) fn refusal(&self, constraint: u64, period: Duration) -> Option<(String, Duration)> {
        let mut refusals = lock(&self.refusals);
        let refusal = refusals.get(&constraint)?;
        let age = refusal.at.elapsed();
        if age >= period {
            refusals.remove(&constraint);
            return None;
        }
        Some((refusal.reason.clone(), period - age))
    }
}

/// Locks a mutex whose data stays consistent through a panic in another holder (each update
/// is one push, pop, insert or remove).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn distinct(faults: &VecDeque<(Instant, Option<u64>)>) -> u32 {
    let mut keyed: Vec<u64> = faults.iter().filter_map(|(_, c)| *c).collect();
    keyed.sort_unstable();
    keyed.dedup();
    let unkeyed = faults.iter().filter(|(_, c)| c.is_none()).count();
    (keyed.len() + unkeyed) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strikes_count_distinct_constraints_and_decay() {
        let h = Health::default();
        let window = Duration::from_secs(60);
        for _ in 0..5 {
            h.fault(Some(1), window);
        }
        assert_eq!(h.strikes(window), 1, "one input repeated is one strike");
        assert_eq!(h.fault(Some(2), window), 2);
        assert_eq!(h.fault(None, window), 3);
        assert_eq!(h.fault(None, window), 4, "faults outside a constraint each count");
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(h.strikes(Duration::from_millis(10)), 0, "old faults are forgotten");
        assert_eq!(h.fault(Some(3), Duration::from_millis(10)), 1);
        h.clear_faults();
        assert_eq!(h.strikes(window), 0);
    }

    #[test]
    fn refusals_expire() {
        let h = Health::default();
        h.refuse(7, "overflowed its stack".into());
        let (why, left) = h.refusal(7, Duration::from_secs(60)).unwrap();
        assert_eq!(why, "overflowed its stack");
        assert!(left <= Duration::from_secs(60));
        assert!(h.refusal(8, Duration::from_secs(60)).is_none());
        assert!(h.refusal(7, Duration::ZERO).is_none());
        assert!(h.refusal(7, Duration::from_secs(60)).is_none(), "an expired refusal is dropped");
    }

    #[test]
    fn keys_separate_kind_source_and_options() {
        assert_ne!(constraint_key("a", "bc", ""), constraint_key("ab", "c", ""));
        assert_ne!(constraint_key("regex", "x", ""), constraint_key("regex", "x", "{}"));
        assert_eq!(constraint_key("regex", "x", "{}"), constraint_key("regex", "x", "{}"));
    }
}
