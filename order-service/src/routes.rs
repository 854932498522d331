//! Buyer-facing order routes: a user sees only their own orders.

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use sqlx::PgPool;

use seckill_auth::{Identity, IdentitySigner};
use seckill_http::{PathId, error_response};

use crate::orders::{self, Order};

/// Handles shared by the order routes.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The consumer's circuit breaker (admin routes).
    pub breaker: std::sync::Arc<crate::breaker::CircuitBreaker>,
    /// Where the breaker's forced mode is shared.
    pub redis: seckill_store::Redis,
    /// Key names.
    pub keys: seckill_store::RedisKeys,
    /// Orders.
    pub db: PgPool,
    /// Verifies the gateway's identity headers.
    pub signer: IdentitySigner,
    /// Publishes redriven dead letters, paced.
    pub redriver: std::sync::Arc<crate::parking::Redriver>,
}

impl FromRef<AppState> for IdentitySigner {
    fn from_ref(state: &AppState) -> Self {
        state.signer.clone()
    }
}

/// The order routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/orders", get(list))
        .route("/api/orders/{order_id}", get(get_one))
        .route("/api/orders/{order_id}/pay", post(pay))
        .route("/api/orders/{order_id}/cancel", post(cancel))
        .route(
            "/admin/orders/breaker",
            get(breaker_status).put(set_breaker_mode),
        )
        .merge(crate::admin::router())
        .with_state(state)
}

/// Errors of the order routes.
#[derive(Debug, thiserror::Error)]
pub enum OrderApiError {
    /// 404: no such order for this user (another user's order is "not found" too).
    #[error("order not found")]
    NotFound,
    /// 409: the order's state refuses the change (paid, cancelled, window passed).
    #[error("{message}")]
    Conflict {
        /// snake_case code.
        code: &'static str,
        /// For a human.
        message: &'static str,
    },
    /// 503: the database is unavailable.
    #[error("database unavailable: {0}")]
    Unavailable(#[from] sqlx::Error),
}

impl IntoResponse for OrderApiError {
    fn into_response(self) -> Response {
        match self {
            Self::NotFound => {
                error_response(StatusCode::NOT_FOUND, "order_not_found", "no such order")
            }
            Self::Conflict { code, message } => error_response(StatusCode::CONFLICT, code, message),
            Self::Unavailable(e) => {
                tracing::warn!(error = %e, "answering 503");
                let mut response = error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "temporarily unavailable, retry shortly",
                );
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static("1"),
                );
                response
            }
        }
    }
}

async fn list(
    State(state): State<AppState>,
    identity: Identity,
) -> Result<Json<Vec<Order>>, OrderApiError> {
    Ok(Json(
        orders::list_for_user(&state.db, identity.user_id).await?,
    ))
}

async fn get_one(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, OrderApiError> {
    orders::get_for_user(&state.db, identity.user_id, order_id)
        .await?
        .map(Json)
        .ok_or(OrderApiError::NotFound)
}

impl From<orders::ChangeError> for OrderApiError {
    fn from(e: orders::ChangeError) -> Self {
        match e {
            orders::ChangeError::NotFound => Self::NotFound,
            orders::ChangeError::Conflict { code, message } => Self::Conflict { code, message },
            orders::ChangeError::Database(e) => Self::Unavailable(e),
        }
    }
}

/// `POST /api/orders/{id}/pay`: a simulated payment within the order's payment window.
async fn pay(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, OrderApiError> {
    Ok(Json(
        orders::pay(&state.db, identity.user_id, order_id).await?,
    ))
}

/// `POST /api/orders/{id}/cancel`: gives an unpaid order up; its unit goes back on sale.
async fn cancel(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, OrderApiError> {
    Ok(Json(
        orders::cancel(&state.db, identity.user_id, order_id).await?,
    ))
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
