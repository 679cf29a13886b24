//! The HTTP listener, with the limits that keep a slow or greedy client from holding the
//! server: at most `max_connections` connections at once (the next waits in the kernel's
//! backlog), a request head must arrive within `header_timeout` (which also closes a
//! keep-alive connection idle that long: hyper starts the same clock while it waits for the
//! next request), and a request body within `body_timeout` (a 408 otherwise). A shutdown
//! stops accepting and lets the open connections finish (see [`lifecycle`](super::lifecycle)).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The transport limits.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Open connections at most.
    pub max_connections: usize,
    /// Time to send a request's head, and the longest a keep-alive connection stays idle.
    pub header_timeout: Duration,
    /// Time to send a request's body.
    pub body_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves, then waits for the open connections.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = permits.clone().acquire_owned() => permit?,
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout).keep_alive(true);
        let connection =
            graceful.watch(http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone())));
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = connection.await {
                tracing::debug!("connection ended: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
