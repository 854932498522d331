//! Process shutdown: SIGINT or SIGTERM cancels one token that every task watches.

use tokio_util::sync::CancellationToken;

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
