//! Operator routes (role `admin`, reached through the gateway).
//!
//! - [`dlq`] — the parking lot of dead letters: list, redrive, ignore, clear, audit.
//! - [`breaker`] — the circuit breaker's state and the mode every replica follows.

mod breaker;
mod dlq;

use utoipa_axum::router::OpenApiRouter;

use super::AppState;

/// The operator routes, each with its OpenAPI description.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(dlq::router())
        .merge(breaker::router())
}
