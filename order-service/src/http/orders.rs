//! Buyer-facing order routes: a user sees only their own orders.
//!
//! ```text
//! GET  /api/orders
//! GET  /api/orders/{order_id}
//! POST /api/orders/{order_id}/pay       a simulated payment within the payment window
//! POST /api/orders/{order_id}/cancel    gives an unpaid order up; its unit goes back on sale
//! ```

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use seckill_auth::Identity;
use seckill_http::{PathId, error_response};

use crate::http::AppState;
use crate::orders::{self, Order};

/// The order routes.
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/api/orders", get(list))
        .route("/api/orders/{order_id}", get(get_one))
        .route("/api/orders/{order_id}/pay", post(pay))
        .route("/api/orders/{order_id}/cancel", post(cancel))
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
