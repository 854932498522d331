//! Buyer-facing order routes: a user sees only their own orders.
//!
//! ```text
//! GET  /api/orders
//! GET  /api/orders/{order_id}
//! POST /api/orders/{order_id}/pay       a simulated payment within the payment window
//! POST /api/orders/{order_id}/cancel    gives an unpaid order up; its unit goes back on sale
//! ```

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};

use seckill_auth::Identity;
use seckill_http::PathId;

use crate::error::ApiError;
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

/// `GET /api/orders`: the caller's orders.
async fn list(
    State(state): State<AppState>,
    identity: Identity,
) -> Result<Json<Vec<Order>>, ApiError> {
    Ok(Json(
        orders::list_for_user(&state.db, identity.user_id).await?,
    ))
}

/// `GET /api/orders/{id}`: one of the caller's orders (another user's is "not found").
async fn get_one(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, ApiError> {
    orders::get_for_user(&state.db, identity.user_id, order_id)
        .await?
        .map(Json)
        .ok_or(ApiError::OrderNotFound)
}

/// `POST /api/orders/{id}/pay`: a simulated payment within the order's payment window.
async fn pay(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, ApiError> {
    Ok(Json(
        orders::pay(&state.db, identity.user_id, order_id).await?,
    ))
}

/// `POST /api/orders/{id}/cancel`: gives an unpaid order up; its unit goes back on sale.
async fn cancel(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, ApiError> {
    Ok(Json(
        orders::cancel(&state.db, identity.user_id, order_id).await?,
    ))
}
