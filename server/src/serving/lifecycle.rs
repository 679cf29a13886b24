//! Shutdown that loses nothing: SIGTERM or SIGINT *drains* the server.
//!
//! 1. The listener stops accepting, `/health/ready` answers 503 (so a load balancer or
//!    Kubernetes stops sending), and a request that arrives on a connection already open gets
//!    a 503 `server_shutting_down` with `Retry-After`, for the client to retry elsewhere.
//! 2. Requests in flight run to their end, for up to the grace period (`--shutdown-timeout`,
//!    30 s by default, to match a Kubernetes pod's default termination grace).
//! 3. Whatever still runs then is ended: a stream gets an error event and `[DONE]`, a waiting
//!    non-streamed request a 503 body. The process exits 0 once every connection is closed.
//!
//! A second signal during the drain ends the rest at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;

/// Where the server is in its life, shared by every handler.
pub struct Lifecycle {
    draining: AtomicBool,
    ended: watch::Sender<bool>,
    grace: Duration,
}

impl Lifecycle {
    /// A serving lifecycle whose drain lasts at most `grace`.
    pub fn new(grace: Duration) -> Self {
        Self { draining: AtomicBool::new(false), ended: watch::Sender::new(false), grace }
    }

    /// Whether the server is draining (no new requests).
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// The grace period of a drain.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Starts draining.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Ends every request still in flight.
    pub fn end_in_flight(&self) {
        self.begin_drain();
        self.ended.send_replace(true);
    }

    /// Resolves when requests in flight must end (never, unless the server drains past its
    /// grace period).
    pub async fn in_flight_ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
    }
}

/// Which signal asked the server to stop: waits for SIGTERM or SIGINT (Ctrl-C).
pub async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
            (Ok(mut term), Ok(mut int)) => tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            },
            _ => {
                let _ = tokio::signal::ctrl_c().await;
                "Ctrl-C"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ending_wakes_every_waiter_and_later_ones_at_once() {
        let lifecycle = std::sync::Arc::new(Lifecycle::new(Duration::from_secs(30)));
        assert!(!lifecycle.draining());
        let waiter = {
            let l = lifecycle.clone();
            tokio::spawn(async move { l.in_flight_ended().await })
        };
        lifecycle.begin_drain();
        assert!(lifecycle.draining());
        assert!(!waiter.is_finished());
        lifecycle.end_in_flight();
        waiter.await.unwrap();
        tokio::time::timeout(Duration::from_secs(1), lifecycle.in_flight_ended()).await.unwrap();
    }
}
