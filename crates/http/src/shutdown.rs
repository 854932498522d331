//! Process shutdown: SIGINT or SIGTERM cancels one token that every task watches.

use std::net::SocketAddr;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Serves `router` on `listener` until SIGINT/SIGTERM or `token` is cancelled, then stops
/// accepting and lets in-flight requests finish. Cancels `token` on the way out either way,
/// so sibling tasks watching it stop too. Peer addresses are available as `ConnectInfo`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    token: CancellationToken,
) -> std::io::Result<()> {
    tokio::spawn(cancel_on_signal(token.clone()));
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(token.clone().cancelled_owned())
    .await;
    token.cancel();
    match &served {
        Ok(()) => tracing::info!("http server stopped"),
        Err(e) => tracing::error!(error = %e, "http server failed"),
    }
    served
}

/// Cancels `token` on the first SIGINT or SIGTERM; returns when either arrives or the
/// token is cancelled by someone else (a test stopping the app).
pub async fn cancel_on_signal(token: CancellationToken) {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();

    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        _ = terminate => tracing::info!("SIGTERM received, shutting down"),
        _ = token.cancelled() => return,
    }
    token.cancel();
}
