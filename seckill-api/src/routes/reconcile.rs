//! `GET /admin/products/{id}/stock`: does every unit add up?

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use seckill_auth::AdminIdentity;
use seckill_http::PathId;
use seckill_store::PurchaseResult;

use crate::error::ApiError;
use crate::state::AppState;

/// Where every unit of a product is. Once the system is quiet, `drift` is 0: each unit is
/// either still on sale in Redis, accepted and on its way, or an order.
#[derive(Debug, Serialize)]
pub struct StockReport {
    /// Units put on sale.
    pub stock_total: i64,
    /// Units Redis can still sell (`stock_total - orders` when not loaded yet).
    pub redis_remaining: i64,
    /// Whether Redis holds the stock yet (it loads on the first purchase).
    pub loaded: bool,
    /// Accepted purchases whose order is not written yet (buyer results still `queued`).
    pub in_flight: i64,
    /// Live orders in Postgres.
    pub orders: i64,
    /// `stock_total - redis_remaining - in_flight - orders`: units unaccounted for (e.g. a
    /// purchase that failed permanently and whose unit was not returned).
    pub drift: i64,
}

/// Reconciles Redis and Postgres for one product.
pub async fn stock(
    State(state): State<AppState>,
    _admin: AdminIdentity,
    PathId(product_id): PathId,
) -> Result<Json<StockReport>, ApiError> {
    let product = state
        .catalog
        .get(product_id)
        .await?
        .ok_or(ApiError::ProductNotFound)?;
    let orders: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE product_id = $1 AND status <> 'cancelled'",
    )
    .bind(product_id)
    .fetch_one(state.catalog.db())
    .await?;
    let remaining = state.stock.remaining(product_id).await?;
    let mut conn = state.redis.get().await?;
    let results: Vec<String> = redis::cmd("HVALS")
        .arg(state.keys.results(product_id))
        .query_async(&mut conn)
        .await?;
    let in_flight = results
        .iter()
        .filter(|r| {
            matches!(
                PurchaseResult::decode(r),
                Some(PurchaseResult::Queued { .. })
            )
        })
        .count() as i64;
    let stock_total = i64::from(product.stock_total);
    let redis_remaining = remaining.unwrap_or(stock_total - orders);
    Ok(Json(StockReport {
        stock_total,
        redis_remaining,
        loaded: remaining.is_some(),
        in_flight,
        orders,
        drift: stock_total - redis_remaining - in_flight - orders,
    }))
}
