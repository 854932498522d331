//! Operator routes (role `admin`, reached through the gateway).
//!
//! - [`dlq`] — the parking lot of dead letters: list, redrive, ignore, clear, audit.
//! - [`breaker`] — the circuit breaker's state and the mode every replica follows.

mod breaker;
mod dlq;

use axum::Router;

use super::AppState;

/// The operator routes.
pub(super) fn router() -> Router<AppState> {
    Router::new().merge(dlq::router()).merge(breaker::router())
}
