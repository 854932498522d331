//! The circuit breaker as an operator sees and forces it.
//!
//! ```text
//! GET /admin/orders/breaker                       this replica's state and the shared mode
//! PUT /admin/orders/breaker {"mode": "open"|"closed"|"auto"}
//! ```

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};

use seckill_auth::AdminIdentity;
use seckill_http::JsonBody;

use crate::breaker::{self, Mode};
use crate::error::ApiError;
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
    pub state: breaker::State,
    /// The mode every replica follows (`auto` unless an operator forced one).
    pub mode: Mode,
}

/// The body of `PUT /admin/orders/breaker`.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetMode {
    /// `open`, `closed` or `auto`.
    pub mode: Mode,
}

/// `GET /admin/orders/breaker`.
async fn breaker_status(
    State(state): State<AppState>,
    _admin: AdminIdentity,
) -> Result<Json<BreakerStatus>, ApiError> {
    let mode = breaker::read_mode(&state.redis, &state.keys.breaker_forced()).await?;
    Ok(Json(BreakerStatus {
        state: state.breaker.state(),
        mode,
    }))
}

/// `PUT /admin/orders/breaker {"mode": "open"|"closed"|"auto"}`: forces (or releases) the
/// breaker of every replica; kept in Redis, so it survives restarts.
async fn set_breaker_mode(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(body): JsonBody<SetMode>,
) -> Result<Json<BreakerStatus>, ApiError> {
    let key = state.keys.breaker_forced();
    breaker::write_mode(&state.redis, &key, body.mode).await?;
    tracing::warn!(admin = admin.0.user_id, mode = ?body.mode, "breaker mode set by an operator");
    state.breaker.apply(body.mode);
    Ok(Json(BreakerStatus {
        state: state.breaker.state(),
        mode: body.mode,
    }))
}
