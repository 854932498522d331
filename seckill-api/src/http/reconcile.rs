//! `GET /admin/products/{id}/stock`: does every unit add up?

use axum::Json;
use axum::extract::State;
use serde::Serialize;

use seckill_auth::AdminIdentity;
use seckill_http::{ErrorBody, PathId};
use seckill_store::PurchaseResult;

use super::AppState;
use crate::error::ApiError;

/// Where every unit of a product is. Once the system is quiet, `drift` is 0: each unit is
/// either still on sale in Redis, accepted and on its way, or an order.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct StockReport {
    /// Units put on sale.
    pub stock_total: i64,
    /// Units Redis can still sell (`stock_total - orders` when not loaded yet).
    pub redis_remaining: i64,
    /// Whether Redis holds the stock yet (it loads on the first purchase).
    pub loaded: bool,
    /// `in_redis`, `not_loaded`, or `rebuilding`: Redis lost the ledger and sales wait until
    /// every purchase in flight has landed (as this replica sees it).
    #[schema(pattern = "^(in_redis|not_loaded|rebuilding)$", example = "in_redis")]
    pub ledger: &'static str,
    /// Accepted purchases whose order is not written yet (buyer results still `queued`):
    /// in the outbox, in RabbitMQ, or being written.
    pub in_flight: i64,
    /// Of those, entries still in the outbox streams (not yet confirmed by RabbitMQ).
    pub outbox: i64,
    /// Buckets the stock is split into.
    pub buckets: u16,
    /// Whether the sold-out flag is up.
    pub sold_out_flag: bool,
    /// Live orders in Postgres.
    pub orders: i64,
    /// `stock_total - redis_remaining - in_flight - orders`: units unaccounted for (e.g. a
    /// purchase that failed permanently and whose unit was not returned).
    pub drift: i64,
}

/// Reconciles Redis and Postgres for one product.
#[utoipa::path(
    get,
    path = "/admin/products/{product_id}/stock",
    operation_id = "product_stock",
    tag = "admin",
    summary = "Where every unit of a product is (reconciliation)",
    params(("product_id" = i64, Path, description = "The product's id (a positive integer).", minimum = 1)),
    responses(
        (status = 200, description = "The units, accounted for.", body = StockReport),
        (status = 400, description = "`invalid_request`: the id is not a positive integer.", body = ErrorBody),
        (status = 404, description = "`product_not_found`.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
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
    let remaining = state.stock.remaining(&product).await?;
    let buckets = product.buckets();
    let (mut in_flight, mut outbox) = (0i64, 0i64);
    for bucket in 0..buckets {
        let mut conn = state.redis.get().await?;
        let results: Vec<String> = redis::cmd("HVALS")
            .arg(state.keys.results(product_id, bucket))
            .query_async(&mut conn)
            .await?;
        in_flight += results
            .iter()
            .filter(|r| {
                matches!(
                    PurchaseResult::decode(r),
                    Some(PurchaseResult::Queued { .. })
                )
            })
            .count() as i64;
        let len: i64 = redis::cmd("XLEN")
            .arg(state.keys.outbox(product_id, bucket))
            .query_async(&mut conn)
            .await?;
        outbox += len;
    }
    let sold_out_flag = state.stock.is_flagged_sold_out(product_id).await?;
    let stock_total = i64::from(product.stock_total);
    let redis_remaining = remaining.unwrap_or(stock_total - orders);
    Ok(Json(StockReport {
        stock_total,
        redis_remaining,
        loaded: remaining.is_some(),
        ledger: match remaining {
            _ if state.stock.is_fenced(product_id) => "rebuilding",
            Some(_) => "in_redis",
            None => "not_loaded",
        },
        in_flight,
        outbox,
        buckets,
        sold_out_flag,
        orders,
        drift: stock_total - redis_remaining - in_flight - orders,
    }))
}
