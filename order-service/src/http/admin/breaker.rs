//! The circuit breaker as an operator sees and forces it.
//!
//! ```text
//! GET /admin/orders/breaker                       this replica's state and the shared mode
//! PUT /admin/orders/breaker {"mode": "open"|"closed"|"auto"}
//! ```

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use seckill_http::error_response;

use crate::http::AppState;

/// The breaker routes.
pub(super) fn router() -> Router<AppState> {
    Router::new().route(
        "/admin/orders/breaker",
        get(breaker_status).put(set_breaker_mode),
    )
}

/// The breaker as an operator sees it.
#[derive(Debug, serde::Serialize)]
pub struct BreakerStatus {
    /// This replica's state.
    pub state: crate::breaker::State,
    /// The mode every replica follows (`auto` unless an operator forced one).
    pub mode: crate::breaker::Mode,
}

/// The body of `PUT /admin/orders/breaker`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetMode {
    /// `open`, `closed` or `auto`.
    pub mode: crate::breaker::Mode,
}

/// `GET /admin/orders/breaker`.
pub async fn breaker_status(
    State(state): State<AppState>,
    _admin: seckill_auth::AdminIdentity,
) -> Response {
    match crate::breaker::read_mode(&state.redis, &state.keys.breaker_forced()).await {
        Ok(mode) => Json(BreakerStatus {
            state: state.breaker.state(),
            mode,
        })
        .into_response(),
        Err(e) => redis_unavailable(&e),
    }
}

/// `PUT /admin/orders/breaker {"mode": "open"|"closed"|"auto"}`: forces (or releases) the
/// breaker of every replica; kept in Redis, so it survives restarts.
pub async fn set_breaker_mode(
    State(state): State<AppState>,
    admin: seckill_auth::AdminIdentity,
    seckill_http::JsonBody(body): seckill_http::JsonBody<SetMode>,
) -> Response {
    let key = state.keys.breaker_forced();
    if let Err(e) = crate::breaker::write_mode(&state.redis, &key, body.mode).await {
        return redis_unavailable(&e);
    }
    tracing::warn!(admin = admin.0.user_id, mode = ?body.mode, "breaker mode set by an operator");
    state.breaker.apply(body.mode);
    Json(BreakerStatus {
        state: state.breaker.state(),
        mode: body.mode,
    })
    .into_response()
}

pub(crate) fn redis_unavailable(e: &redis::RedisError) -> Response {
    tracing::warn!(error = %e, "answering 503");
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "temporarily unavailable, retry shortly",
    )
}
