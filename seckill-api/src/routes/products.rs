//! Product routes: public reads and the admin create.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;

use seckill_auth::{AdminIdentity, Identity};
use seckill_http::{JsonBody, PathId};

use crate::catalog::{NewProduct, Product};
use crate::error::ApiError;
use crate::state::AppState;

/// A product with its approximate remaining stock.
#[derive(Debug, Serialize)]
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
        .remaining(product.id)
        .await?
        .unwrap_or(i64::from(product.stock_total));
    Ok(ProductView {
        active: product.is_active(chrono::Utc::now()),
        remaining_approx: remaining,
        product,
    })
}

/// `GET /api/products/{id}`.
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

/// `POST /admin/products`: creates a product; its stock loads lazily on first purchase.
#[tracing::instrument(skip_all, fields(admin = admin.0.user_id))]
pub async fn create(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(new): JsonBody<NewProduct>,
) -> Result<(StatusCode, Json<Product>), ApiError> {
    new.validate().map_err(ApiError::InvalidRequest)?;
    let product = state.catalog.create(&new).await?;
    tracing::info!(
        product_id = product.id,
        stock = product.stock_total,
        "product created"
    );
    Ok((StatusCode::CREATED, Json(product)))
}
