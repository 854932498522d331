//! Buyer-facing order routes: a user sees only their own orders.

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use sqlx::PgPool;

use seckill_auth::{Identity, IdentitySigner};
use seckill_http::{PathId, error_response};

use crate::orders::{self, Order};

/// Handles shared by the order routes.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Orders.
    pub db: PgPool,
    /// Verifies the gateway's identity headers.
    pub signer: IdentitySigner,
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
        .with_state(state)
}

/// Errors of the order routes.
#[derive(Debug, thiserror::Error)]
pub enum OrderApiError {
    /// 404: no such order for this user (another user's order is "not found" too).
    #[error("order not found")]
    NotFound,
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
