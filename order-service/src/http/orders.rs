//! Buyer-facing order routes: a user sees only their own orders.
//!
//! ```text
//! GET  /api/orders
//! GET  /api/orders/{order_id}
//! POST /api/orders/{order_id}/pay       a simulated payment within the payment window
//! POST /api/orders/{order_id}/cancel    gives an unpaid order up; its unit goes back on sale
//! ```

use axum::Json;
use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use seckill_auth::Identity;
use seckill_http::{ErrorBody, PathId};

use crate::error::ApiError;
use crate::http::AppState;
use crate::orders::{self, Order};

/// The order routes, each with its OpenAPI description.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(get_one))
        .routes(routes!(pay))
        .routes(routes!(cancel))
}

/// `GET /api/orders`: the caller's orders.
#[utoipa::path(
    get,
    path = "/api/orders",
    operation_id = "list_orders",
    tag = "orders",
    summary = "The caller's orders, newest first (100 at most)",
    responses(
        (status = 200, description = "The caller's orders.", body = Vec<Order>),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
async fn list(
    State(state): State<AppState>,
    identity: Identity,
) -> Result<Json<Vec<Order>>, ApiError> {
    Ok(Json(
        orders::list_for_user(&state.db, identity.user_id).await?,
    ))
}

/// `GET /api/orders/{id}`: one of the caller's orders (another user's is "not found").
#[utoipa::path(
    get,
    path = "/api/orders/{order_id}",
    operation_id = "get_order",
    tag = "orders",
    summary = "One of the caller's orders",
    params(("order_id" = i64, Path, description = "The order's id (a positive integer).", minimum = 1)),
    responses(
        (status = 200, description = "The order.", body = Order),
        (status = 400, description = "`invalid_request`: the id is not a positive integer.", body = ErrorBody),
        (status = 404, description = "`order_not_found`: no such order of the caller's.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
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
#[utoipa::path(
    post,
    path = "/api/orders/{order_id}/pay",
    operation_id = "pay_order",
    tag = "orders",
    summary = "Pay an order (simulated) within its payment window",
    description = "Paying a paid order again answers it as it is.",
    params(("order_id" = i64, Path, description = "The order's id (a positive integer).", minimum = 1)),
    responses(
        (status = 200, description = "The order, paid.", body = Order),
        (status = 400, description = "`invalid_request`: the id is not a positive integer.", body = ErrorBody),
        (status = 404, description = "`order_not_found`: no such order of the caller's.", body = ErrorBody),
        (status = 409, description = "`order_cancelled` or `payment_window_expired`.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
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
#[utoipa::path(
    post,
    path = "/api/orders/{order_id}/cancel",
    operation_id = "cancel_order",
    tag = "orders",
    summary = "Cancel an unpaid order; its unit goes back on sale",
    description = "Cancelling a cancelled order again answers it as it is.",
    params(("order_id" = i64, Path, description = "The order's id (a positive integer).", minimum = 1)),
    responses(
        (status = 200, description = "The order, cancelled.", body = Order),
        (status = 400, description = "`invalid_request`: the id is not a positive integer.", body = ErrorBody),
        (status = 404, description = "`order_not_found`: no such order of the caller's.", body = ErrorBody),
        (status = 409, description = "`order_paid`: a paid order cannot be cancelled.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
async fn cancel(
    State(state): State<AppState>,
    identity: Identity,
    PathId(order_id): PathId,
) -> Result<Json<Order>, ApiError> {
    Ok(Json(
        orders::cancel(&state.db, identity.user_id, order_id).await?,
    ))
}
