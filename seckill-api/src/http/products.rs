//! Product routes: public reads, the admin create and the admin edit.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;

use seckill_auth::{AdminIdentity, Identity};
use seckill_http::{ErrorBody, JsonBody, PathId};

use super::AppState;
use crate::catalog::{Edit, NewProduct, Product, ProductChanges};
use crate::error::ApiError;

/// A product with its approximate remaining stock.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ProductView {
    #[serde(flatten)]
    product: Product,
    /// Units left in Redis; the total while the stock is not loaded yet.
    remaining_approx: i64,
    /// Whether the sale window is open now.
    active: bool,
}

async fn view(state: &AppState, product: Product) -> Result<ProductView, ApiError> {
    let remaining = state
        .stock
        .remaining(&product)
        .await?
        .unwrap_or(i64::from(product.stock_total));
    Ok(ProductView {
        active: product.is_active(chrono::Utc::now()),
        remaining_approx: remaining,
        product,
    })
}

/// `GET /api/products/{id}`.
#[utoipa::path(
    get,
    path = "/api/products/{product_id}",
    operation_id = "get_product",
    tag = "products",
    summary = "One product, its sale window and approximate remaining stock",
    params(("product_id" = i64, Path, description = "The product's id (a positive integer).", minimum = 1)),
    responses(
        (status = 200, description = "The product.", body = ProductView),
        (status = 400, description = "`invalid_request`: the id is not a positive integer.", body = ErrorBody),
        (status = 404, description = "`product_not_found`.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
pub async fn get(
    State(state): State<AppState>,
    _identity: Identity,
    PathId(product_id): PathId,
) -> Result<Json<ProductView>, ApiError> {
    let product = state
        .catalog
        .get(product_id)
        .await?
        .ok_or(ApiError::ProductNotFound)?;
    Ok(Json(view(&state, product).await?))
}

/// `GET /api/products`: the 100 newest.
#[utoipa::path(
    get,
    path = "/api/products",
    operation_id = "list_products",
    tag = "products",
    summary = "The 100 newest products",
    responses(
        (status = 200, description = "Newest first.", body = Vec<ProductView>),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
pub async fn list(
    State(state): State<AppState>,
    _identity: Identity,
) -> Result<Json<Vec<ProductView>>, ApiError> {
    let mut views = Vec::new();
    for product in state.catalog.list(100).await? {
        views.push(view(&state, product).await?);
    }
    Ok(Json(views))
}

/// `POST /admin/products`: creates a product; its stock loads lazily on first purchase. A
/// product with a waiting room has the room's set-up written into Redis before the answer
/// (or by the rooms' sync soon after, when Redis fails here).
#[utoipa::path(
    post,
    path = "/admin/products",
    operation_id = "create_product",
    tag = "admin",
    summary = "Put a product on sale",
    request_body = NewProduct,
    responses(
        (status = 201, description = "Created.", body = Product),
        (status = 400, description = "`invalid_request`: malformed JSON (an unknown \
            `waiting_room` among it) or a broken rule (the message says which).", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
#[tracing::instrument(skip_all, fields(admin = admin.0.user_id))]
pub async fn create(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(new): JsonBody<NewProduct>,
) -> Result<(StatusCode, Json<Product>), ApiError> {
    new.validate().map_err(ApiError::InvalidRequest)?;
    let product = state.catalog.create(&new, state.default_buckets).await?;
    state.rooms.write_after_edit(&product).await;
    tracing::info!(
        product_id = product.id,
        stock = product.stock_total,
        waiting_room = %product.waiting_room,
        "product created"
    );
    Ok((StatusCode::CREATED, Json(product)))
}

/// `PATCH /admin/products/{id}`: changes the name, price, sale window or waiting-room mode.
/// Every replica drops its cached copy (through the update trigger); the loaded stock
/// buckets get the new window here, so the answer means purchases already follow it. The
/// waiting room's set-up in Redis is rewritten here too (a failure is left to the rooms'
/// sync, see `crate::room`).
#[utoipa::path(
    patch,
    path = "/admin/products/{product_id}",
    operation_id = "update_product",
    tag = "admin",
    summary = "Change a product's name, price, sale window or waiting room",
    params(("product_id" = i64, Path, description = "The product's id (a positive integer).", minimum = 1)),
    request_body = ProductChanges,
    responses(
        (status = 200, description = "The product as it is now.", body = Product),
        (status = 400, description = "`invalid_request`: a bad id, malformed JSON (an unknown \
            `waiting_room` among it), nothing to change, an unknown field (stock and buckets are \
            fixed) or a broken rule.", body = ErrorBody),
        (status = 404, description = "`product_not_found`.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
#[tracing::instrument(skip_all, fields(admin = admin.0.user_id, product_id = product_id))]
pub async fn update(
    State(state): State<AppState>,
    admin: AdminIdentity,
    PathId(product_id): PathId,
    JsonBody(changes): JsonBody<ProductChanges>,
) -> Result<Json<Product>, ApiError> {
    changes.validate().map_err(ApiError::InvalidRequest)?;
    let product = match state.catalog.update(product_id, &changes).await? {
        Edit::Applied(product) => product,
        Edit::NotFound => return Err(ApiError::ProductNotFound),
        Edit::Rejected(reason) => return Err(ApiError::InvalidRequest(reason)),
    };
    state.rooms.write_after_edit(&product).await;
    // Postgres already holds the change, so a failure here is a 503 the admin retries (the
    // same PATCH again is harmless); the other replicas' change listeners apply it too.
    state.stock.update_window(&product).await?;
    tracing::info!(
        start_at = %product.start_at,
        end_at = %product.end_at,
        price_cents = product.price_cents,
        waiting_room = %product.waiting_room,
        "product changed"
    );
    Ok(Json(product))
}
