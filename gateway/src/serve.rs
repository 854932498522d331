//! The gateway's accept loop: hyper's HTTP/1 server with bounded request heads, and
//! connections spread over one single-threaded runtime per core.
//!
//! `axum::serve` does not expose hyper's HTTP/1 settings, and the public door needs them:
//! a request whose line and headers exceed `max_header_bytes`, or that has more than
//! `max_headers` headers, is answered `431 Request Header Fields Too Large` by hyper and the
//! connection closed, before any of it is buffered further or reaches a handler. A client
//! that trickles its headers is cut off after hyper's 30 s header read timeout.
//!
//! Thread per core, as nginx runs: one thread accepts and hands each connection, in turn,
//! to one of `workers` threads, each running a current-thread runtime. A connection and
//! every request on it then stay on one thread, with that thread's upstream connections
//! (see `proxy::pool`): no work stealing and no cross-thread wake-up on the hot path, which
//! on a multi-threaded runtime cost more CPU per request than a second thread gave back.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use crate::door::Door;

/// Limits on a request's head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Request line plus headers, bytes.
    pub max_header_bytes: usize,
    /// Number of headers.
    pub max_headers: usize,
}

/// How long in-flight requests may take to finish once shutdown began.
const DRAIN: Duration = Duration::from_secs(30);

/// Threads that each run a current-thread runtime until stopped.
struct Workers {
    handles: Vec<Handle>,
    next: usize,
    stop: CancellationToken,
}

impl Workers {
    fn start(count: NonZeroUsize) -> std::io::Result<Self> {
        let stop = CancellationToken::new();
        let mut handles = Vec::with_capacity(count.get());
        for index in 0..count.get() {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(format!("gateway-worker-{index}"))
                .spawn(move || runtime.block_on(stop.cancelled()))?;
        }
        Ok(Self {
            handles,
            next: 0,
            stop,
        })
    }

    /// The runtime for the next connection: the workers in turn.
    fn next(&mut self) -> &Handle {
        self.next = (self.next + 1) % self.handles.len();
        &self.handles[self.next]
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Answers requests on `listener` through `door` until SIGINT/SIGTERM or `cancel`, then stops
/// accepting and lets in-flight requests finish. Cancels `cancel` on the way out.
/// Connections are served on `workers` threads of their own.
pub async fn serve(
    listener: TcpListener,
    door: Arc<Door>,
    cancel: CancellationToken,
    limits: HeadLimits,
    workers: NonZeroUsize,
) -> std::io::Result<()> {
    let mut workers = Workers::start(workers)?;
    tokio::spawn(seckill_http::shutdown::cancel_on_signal(cancel.clone()));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .max_header_size(limits.max_header_bytes)
        .max_headers(limits.max_headers);
    let graceful = GracefulShutdown::new();
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
        let door = door.clone();
        let http = http.clone();
        let watcher = graceful.watcher();
        workers.next().spawn(async move {
            let stream = match TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "could not register the connection");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                door.clone().answer(request, peer)
            });
            let connection = watcher.watch(http.serve_connection(TokioIo::new(stream), service));
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
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
