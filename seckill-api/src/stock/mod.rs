//! The Redis stock engine: lazy loading under a lock, and the purchase step.
//!
//! Stock is not preloaded. The first purchase of a product finds its stock hash missing,
//! takes the product's load lock (`SET NX PX` with a random token), loads remaining units
//! and existing buyers from Postgres with a script that refuses to overwrite a loaded hash,
//! and releases the lock by compare-and-delete. Other requests wait with backoff, bounded
//! by `load_wait_ms`, re-checking whether the load happened.
//!
//! The stock hash has no TTL: it lives as long as the sale, so a reload only follows a
//! Redis data loss, and then the buyers set is rebuilt from orders too.

use std::time::{Duration, Instant};

use redis::Script;
use sqlx::PgPool;
use uuid::Uuid;

use seckill_store::RedisKeys;

use crate::catalog::Product;
use crate::error::ApiError;

/// How one purchase attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A unit was reserved and the order intent is in the outbox.
    Accepted,
    /// No units left.
    SoldOut,
    /// This user already holds a unit.
    AlreadyPurchased,
    /// Outside the sale window.
    NotActive,
}

/// One purchase to decide.
#[derive(Debug)]
pub struct PurchaseRequest<'a> {
    /// The product, as the catalog knows it.
    pub product: &'a Product,
    /// The buyer.
    pub user_id: i64,
    /// The purchase id.
    pub request_id: Uuid,
    /// The order message body to put in the outbox.
    pub payload: &'a str,
    /// The HTTP request id, kept with the intent for tracing.
    pub http_request_id: &'a str,
}

/// Deducts stock in Redis; cheap to clone.
#[derive(Clone)]
pub struct StockEngine {
    redis: deadpool_redis::Pool,
    db: PgPool,
    keys: RedisKeys,
    purchase: Script,
    load: Script,
    unlock: Script,
    lock_ttl: Duration,
    load_wait: Duration,
}

impl std::fmt::Debug for StockEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockEngine").finish_non_exhaustive()
    }
}

impl StockEngine {
    /// An engine over these stores; see `Settings` for the two durations.
    pub fn new(
        redis: deadpool_redis::Pool,
        db: PgPool,
        keys: RedisKeys,
        lock_ttl: Duration,
        load_wait: Duration,
    ) -> Self {
        Self {
            redis,
            db,
            keys,
            purchase: Script::new(include_str!("purchase.lua")),
            load: Script::new(include_str!("load.lua")),
            unlock: Script::new(include_str!("unlock.lua")),
            lock_ttl,
            load_wait,
        }
    }

    /// Decides one purchase, loading the product's stock first if Redis does not have it.
    pub async fn purchase(&self, req: &PurchaseRequest<'_>) -> Result<Decision, ApiError> {
        let id = req.product.id;
        for _ in 0..3 {
            let started = Instant::now();
            let mut conn = self.redis.get().await?;
            let invoked: redis::RedisResult<i64> = self
                .purchase
                .key(self.keys.stock(id))
                .key(self.keys.buyers(id))
                .key(self.keys.outbox(id))
                .key(self.keys.results(id))
                .arg(req.user_id)
                .arg(req.request_id.to_string())
                .arg(req.payload)
                .arg(req.http_request_id)
                .invoke_async(&mut conn)
                .await;
            // Give the connection back before a load or a check, which need connections of
            // their own: holding one while waiting for another starves the pool in a burst.
            drop(conn);
            let code = match invoked {
                Ok(code) => code,
                Err(e) => {
                    // A timeout or a dropped connection loses the answer, not necessarily the
                    // effect: if the script ran, this purchase holds a unit and must get 202.
                    if self.was_accepted(req).await {
                        tracing::warn!(error = %e, "purchase script answer lost, but it ran");
                        return Ok(Decision::Accepted);
                    }
                    return Err(e.into());
                }
            };
            metrics::histogram!("seckill_lua_seconds").record(started.elapsed().as_secs_f64());
            match code {
                1 => return Ok(Decision::Accepted),
                0 => return Ok(Decision::SoldOut),
                -1 => return Ok(Decision::AlreadyPurchased),
                -2 => return Ok(Decision::NotActive),
                -3 => self.ensure_loaded(req.product).await?,
                other => {
                    return Err(ApiError::Internal(anyhow::anyhow!(
                        "purchase script returned {other}"
                    )));
                }
            }
        }
        Err(ApiError::Unavailable("stock did not load".into()))
    }

    /// Whether the purchase script recorded this very request: the buyer's result says
    /// queued with this request id. (If order-service already turned it into `success`
    /// within the timeout, this says no and the buyer gets a 503 for a purchase that
    /// stands; the result endpoint still shows it.)
    async fn was_accepted(&self, req: &PurchaseRequest<'_>) -> bool {
        let Ok(mut conn) = self.redis.get().await else {
            return false;
        };
        let stored: Option<String> = redis::cmd("HGET")
            .arg(self.keys.results(req.product.id))
            .arg(req.user_id)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        stored.as_deref() == Some(format!("queued:{}", req.request_id).as_str())
    }

    /// Units left in Redis, or `None` when the stock is not loaded.
    pub async fn remaining(&self, product_id: i64) -> Result<Option<i64>, ApiError> {
        let mut conn = self.redis.get().await?;
        let remaining: Option<i64> = redis::cmd("HGET")
            .arg(self.keys.stock(product_id))
            .arg("remaining")
            .query_async(&mut conn)
            .await?;
        Ok(remaining)
    }

    /// Makes sure the product's stock is in Redis, loading it under the product's lock.
    async fn ensure_loaded(&self, product: &Product) -> Result<(), ApiError> {
        let lock = self.keys.load_lock(product.id);
        let token = Uuid::new_v4().to_string();
        let deadline = Instant::now() + self.load_wait;
        let mut delay = Duration::from_millis(5);
        loop {
            let mut conn = self.redis.get().await?;
            let acquired: Option<String> = redis::cmd("SET")
                .arg(&lock)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(self.lock_ttl.as_millis() as u64)
                .query_async(&mut conn)
                .await?;
            if acquired.is_some() {
                drop(conn);
                let loaded = self.load(product).await;
                let mut conn = self.redis.get().await?;
                let _: i64 = self
                    .unlock
                    .key(&lock)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await?;
                return loaded;
            }
            let exists: bool = redis::cmd("EXISTS")
                .arg(self.keys.stock(product.id))
                .query_async(&mut conn)
                .await?;
            if exists {
                return Ok(());
            }
            if Instant::now() + delay > deadline {
                return Err(ApiError::Unavailable("stock load in progress".into()));
            }
            metrics::counter!("seckill_load_lock_waits_total").increment(1);
            drop(conn);
            tokio::time::sleep(delay.mul_f64(rand::random_range(0.5..1.5))).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// Loads remaining units and existing buyers from Postgres. Called under the lock.
    async fn load(&self, product: &Product) -> Result<(), ApiError> {
        let buyers: Vec<i64> = sqlx::query_scalar(
            "SELECT user_id FROM orders WHERE product_id = $1 AND status <> 'cancelled'",
        )
        .bind(product.id)
        .fetch_all(&self.db)
        .await?;
        let remaining = (i64::from(product.stock_total) - buyers.len() as i64).max(0);
        let mut conn = self.redis.get().await?;
        // Register the outbox (and its consumer group) before any unit can be sold, so the
        // relay knows every stream that can hold an accepted purchase.
        let outbox = self.keys.outbox(product.id);
        let _: i64 = redis::cmd("SADD")
            .arg(self.keys.outbox_registry())
            .arg(&outbox)
            .query_async(&mut conn)
            .await?;
        crate::relay::create_group(&mut conn, &outbox).await?;
        let mut invocation = self.load.prepare_invoke();
        invocation
            .key(self.keys.stock(product.id))
            .key(self.keys.buyers(product.id))
            .arg(remaining)
            .arg(product.stock_total)
            .arg(product.start_at.timestamp_millis())
            .arg(product.end_at.timestamp_millis());
        for buyer in &buyers {
            invocation.arg(buyer);
        }
        let loaded: i64 = invocation.invoke_async(&mut conn).await?;
        if loaded == 1 {
            tracing::info!(
                product_id = product.id,
                remaining,
                "stock loaded into redis"
            );
            metrics::counter!("seckill_stock_loads_total").increment(1);
        }
        Ok(())
    }
}
