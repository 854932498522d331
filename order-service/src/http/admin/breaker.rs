//! The circuit breaker as an operator sees and forces it.
//!
//! ```text
//! GET /admin/orders/breaker                       this replica's state and the shared mode
//! PUT /admin/orders/breaker {"mode": "open"|"closed"|"auto"}
//! ```

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use seckill_auth::AdminIdentity;
use seckill_http::{ErrorBody, JsonBody};

use crate::breaker::{self, Mode};
use crate::error::ApiError;
use crate::http::AppState;

/// The breaker routes.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(breaker_status, set_breaker_mode))
}

/// The breaker as an operator sees it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct BreakerStatus {
    /// This replica's state.
    pub state: breaker::State,
    /// The mode every replica follows (`auto` unless an operator forced one).
    pub mode: Mode,
}

/// The body of `PUT /admin/orders/breaker`.
#[derive(Debug, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetMode {
    /// `open`, `closed` or `auto`.
    pub mode: Mode,
}

/// `GET /admin/orders/breaker`.
#[utoipa::path(
    get,
    path = "/admin/orders/breaker",
    operation_id = "breaker_status",
    tag = "admin",
    summary = "This replica's breaker state and the mode every replica follows",
    responses(
        (status = 200, description = "The breaker.", body = BreakerStatus),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
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
#[utoipa::path(
    put,
    path = "/admin/orders/breaker",
    operation_id = "set_breaker_mode",
    tag = "admin",
    summary = "Force the breaker of every replica open or closed, or release it",
    request_body = SetMode,
    responses(
        (status = 200, description = "The breaker, as set.", body = BreakerStatus),
        (status = 400, description = "`invalid_request`: malformed JSON or an unknown mode.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
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
