//! The gateway's accept loop: connections spread over one single-threaded runtime per core,
//! each served by [`seckill_http1`], and drained at shutdown.
//!
//! Thread per core, as nginx runs: one thread accepts and hands each connection, in turn,
//! to one of `workers` threads, each running a current-thread runtime. A connection and
//! every request on it then stay on one thread, with that thread's upstream connections
//! (see `proxy::pool`): no work stealing and no cross-thread wake-up on the hot path, which
//! on a multi-threaded runtime cost more CPU per request than a second thread gave back.
//!
//! Every connection is admitted under the caps on open connections ([`ConnectionCaps`]:
//! `max_connections` overall, `max_connections_per_ip` per TCP peer, trusted proxies
//! exempt from the latter); one past either is answered `503` with `Retry-After` and closed,
//! and counted in `gateway_connections_refused_total{reason}`.
//!
//! Shutdown (SIGINT/SIGTERM or the token): stop accepting, close idle connections, let the
//! requests under way finish for up to 30 s (`DRAIN`; each is answered with
//! `connection: close`), then stop the workers.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use seckill_http1::{ConnectionCaps, ConnectionLimits, refuse_connection, serve_connection};

use crate::error;
use crate::pipeline::Pipeline;

/// How long requests under way may take to finish once shutdown began.
const DRAIN: Duration = Duration::from_secs(30);

/// Threads that each run a current-thread runtime until stopped.
struct Workers {
    /// Each worker's runtime, and the token its connections watch for shutdown: a child of
    /// the shared one, so that connections on different threads never contend for one
    /// token's waiter list.
    workers: Vec<(Handle, CancellationToken)>,
    next: usize,
    stop: CancellationToken,
}

impl Workers {
    fn start(count: NonZeroUsize, closing: &CancellationToken) -> std::io::Result<Self> {
        let stop = CancellationToken::new();
        let mut workers = Vec::with_capacity(count.get());
        for index in 0..count.get() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            workers.push((runtime.handle().clone(), closing.child_token()));
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("gateway-worker-{index}"))
                .spawn(move || {
                    runtime.block_on(async move {
                        tokio::select! {
                            () = stop.cancelled() => {}
                            () = give_memory_back() => {}
                        }
                    });
                })?;
        }
        Ok(Self {
            workers,
            next: 0,
            stop,
        })
    }

    /// The worker for the next connection: the workers in turn.
    fn next(&mut self) -> &(Handle, CancellationToken) {
        self.next = (self.next + 1) % self.workers.len();
        &self.workers[self.next]
    }
}

/// Collects this worker's freed memory ([`seckill_alloc::collect`]) every
/// [`HOUSEKEEPING_INTERVAL`](crate::ratelimit::HOUSEKEEPING_INTERVAL), when the rate limiter's
/// tables are shrunk too, for ever: the pages of the buckets it dropped would otherwise stay
/// with an idle worker.
async fn give_memory_back() {
    let mut tick = tokio::time::interval(crate::ratelimit::HOUSEKEEPING_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        seckill_alloc::collect();
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Answers requests on `listener` through `pipeline` until SIGINT/SIGTERM or `cancel`, then stops
/// accepting and lets requests under way finish. Cancels `cancel` on the way out.
/// Connections are served on `workers` threads of their own.
pub async fn serve(
    listener: TcpListener,
    pipeline: Arc<Pipeline>,
    cancel: CancellationToken,
    limits: ConnectionLimits,
    workers: NonZeroUsize,
) -> std::io::Result<()> {
    let closing = CancellationToken::new();
    let mut workers = Workers::start(workers, &closing)?;
    tokio::spawn(seckill_http::shutdown::cancel_on_signal(cancel.clone()));
    let connections = TaskTracker::new();
    let caps = Arc::new(ConnectionCaps::new(
        limits.max_connections,
        limits.max_connections_per_ip,
    ));
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // Registered again with the reactor of the runtime that serves it.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "could not hand the connection over");
                continue;
            }
        };
        let (runtime, closing) = workers.next();
        let (pipeline, closing, caps) = (pipeline.clone(), closing.clone(), caps.clone());
        runtime.spawn(connections.track_future(async move {
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "could not register the connection");
                    return;
                }
            };
            let per_ip = !pipeline.trusted_proxies.trusts(peer.ip());
            match caps.admit(peer.ip(), per_ip) {
                Ok(_ticket) => serve_connection(stream, peer, &*pipeline, limits, &closing).await,
                Err(reason) => {
                    metrics::counter!(crate::metrics::CONNECTIONS_REFUSED, "reason" => reason.label())
                        .increment(1);
                    tracing::debug!(%peer, reason = reason.label(), "connection refused");
                    let response = error::unavailable("too many connections, retry shortly");
                    refuse_connection(stream, response, limits).await;
                }
            }
        }));
    }
    drop(listener);
    closing.cancel();
    connections.close();
    if tokio::time::timeout(DRAIN, connections.wait())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after the drain period");
    }
    drop(workers);
    cancel.cancel();
    tracing::info!("http server stopped");
    Ok(())
}
