//! The gateway's accept loop: `axum::serve` with bounded request heads.
//!
//! `axum::serve` does not expose hyper's HTTP/1 settings, and the public door needs them:
//! a request whose line and headers exceed `max_header_bytes`, or that has more than
//! `max_headers` headers, is answered `431 Request Header Fields Too Large` by hyper and the
//! connection closed, before any of it is buffered further or reaches a handler. A client
//! that trickles its headers is cut off after hyper's 30 s header read timeout.

use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

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

/// Serves `router` on `listener` until SIGINT/SIGTERM or `cancel`, then stops accepting and
/// lets in-flight requests finish. Cancels `cancel` on the way out. Peer addresses are
/// available to handlers as `ConnectInfo<SocketAddr>`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    cancel: CancellationToken,
    limits: HeadLimits,
) -> std::io::Result<()> {
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
        let router = router.clone();
        // The router for this connection, with the peer address in every request.
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request)
        });
        let connection = http.serve_connection(TokioIo::new(stream), service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
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
    cancel.cancel();
    tracing::info!("http server stopped");
    Ok(())
}
