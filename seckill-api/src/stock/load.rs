//! Loading: stock is not preloaded. A purchase that finds its bucket missing takes the
//! product's load lock (`SET NX PX` with a random token, TTL shorter than the request
//! deadline), reads one Postgres [`Snapshot`], fills each missing bucket, then releases the
//! lock by compare-and-delete. Others wait with jittered backoff, bounded by `load_wait_ms`.
//! A bucket gets its share of the total less the purchases whose unit came from it, so a load
//! that died half-way is finished later without counting one bucket's sales against another;
//! units given back after the snapshot are added from the bucket's returns hash
//! (`seckill_store::ledger` has the argument). A ledger Redis lost waits for the [`fence`].
//!
//! [`fence`]: super::fence

use std::time::{Duration, Instant};

use chrono::Utc;
use uuid::Uuid;

use seckill_store::ledger::{BucketLoad, HeldUnit};

use super::engine::StockEngine;
use super::snapshot::Snapshot;
use super::window::{EXPIRY_GRACE, window};
use crate::catalog::Product;
use crate::error::ApiError;
#[cfg(feature = "failpoints")]
use crate::failpoints::{postgres_lost, redis_lost};

impl StockEngine {
    /// Makes sure every bucket of the product is in Redis, loading under the product's lock.
    pub(super) async fn ensure_loaded(&self, product: &Product) -> Result<(), ApiError> {
        if let Some(fence) = &self.fence
            && fence.refused_recently(product.id)
        {
            return Err(ApiError::LedgerRebuilding(
                "purchases still in flight".into(),
            ));
        }
        let token = Uuid::new_v4().to_string();
        let deadline = Instant::now() + self.timings.load_wait;
        let mut delay = Duration::from_millis(5);
        loop {
            let mut conn = self.redis.get().await?;
            let acquired = self
                .ledger
                .lock_load(&mut conn, product.id, &token, self.timings.lock_ttl)
                .await?;
            if acquired {
                drop(conn);
                // Another loader may have finished between this request's miss and its lock:
                // then nothing is missing, and nothing was lost.
                let loaded = match self.all_buckets_loaded(product).await {
                    Ok(true) => {
                        self.lift_fence(product.id);
                        Ok(())
                    }
                    Ok(false) => match self.check_fence(product).await {
                        Ok(()) => self.load(product).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                let mut conn = self.redis.get().await?;
                self.ledger
                    .unlock_load(&mut conn, product.id, &token)
                    .await?;
                return loaded;
            }
            let loaded = self.ledger.was_loaded(&mut conn, product.id).await?;
            drop(conn);
            if loaded && self.all_buckets_loaded(product).await? {
                self.lift_fence(product.id);
                return Ok(());
            }
            if Instant::now() + delay > deadline {
                return Err(ApiError::Unavailable("stock load in progress".into()));
            }
            metrics::counter!("seckill_load_lock_waits_total").increment(1);
            tokio::time::sleep(delay.mul_f64(rand::random_range(0.5..1.5))).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// Before a load: if the product's ledger was in Redis and is gone although its keys
    /// cannot have expired yet, Redis lost it, and the load waits until everything in
    /// flight has landed (see [`super::fence`]).
    async fn check_fence(&self, product: &Product) -> Result<(), ApiError> {
        let was_loaded: Option<bool> =
            sqlx::query_scalar("SELECT ledger_loaded FROM products WHERE id = $1")
                .bind(product.id)
                .fetch_optional(&self.db)
                .await?;
        let may_have_expired = Utc::now()
            > product.end_at + chrono::Duration::from_std(EXPIRY_GRACE).unwrap_or_default();
        if !was_loaded.unwrap_or(false) || may_have_expired {
            return Ok(());
        }
        let Some(fence) = &self.fence else {
            return Err(ApiError::LedgerRebuilding(
                "redis lost the ledger and no fence can tell when in-flight purchases landed"
                    .into(),
            ));
        };
        if !fence.is_up(product.id) {
            tracing::error!(
                product_id = product.id,
                "redis lost this product's stock ledger: sales paused until every purchase \
                 in flight has landed, then rebuilt from postgres"
            );
            metrics::counter!("seckill_ledger_losses_total").increment(1);
        }
        let outbox = self.outbox_len(product).await?;
        match fence.drained(product.id, outbox).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::LedgerRebuilding(format!(
                "purchases still in flight ({outbox} in the outbox)"
            ))),
            Err(e) => Err(ApiError::LedgerRebuilding(format!("{e:#}"))),
        }
    }

    /// Entries in the product's outbox streams.
    async fn outbox_len(&self, product: &Product) -> Result<i64, ApiError> {
        let mut total = 0;
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            total += self
                .ledger
                .outbox_len(&mut conn, product.id, bucket)
                .await?;
        }
        Ok(total)
    }

    async fn all_buckets_loaded(&self, product: &Product) -> Result<bool, ApiError> {
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            if !self.ledger.is_loaded(&mut conn, product.id, bucket).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Loads every missing bucket from Postgres. Called under the lock.
    pub(super) async fn load(&self, product: &Product) -> Result<(), ApiError> {
        let started = Instant::now();
        let snapshot = Snapshot::read(&self.db, product).await?;
        seckill_http::failpoint!("load::after_snapshot", Err(postgres_lost()));
        // Before the first bucket is written, since a bucket sells the moment it is: from
        // now on a missing bucket may mean Redis lost units sold from it. Marked after the
        // fill instead, one failed update (or a crash before it) would leave the flag down
        // for good — later purchases find the buckets and never load again — and a later
        // loss would be rebuilt at once, over purchases still in flight. Marked here and the
        // fill failing, the next load merely waits for quiet first, as after a loss.
        sqlx::query("UPDATE products SET ledger_loaded = true WHERE id = $1 AND NOT ledger_loaded")
            .bind(product.id)
            .execute(&self.db)
            .await?;
        seckill_http::failpoint!("load::after_flag", Err(redis_lost()));
        let loaded_now = self.fill(product, &snapshot).await?;
        seckill_http::failpoint!("load::after_fill", Err(redis_lost()));
        if let Some(fence) = &self.fence
            && fence.is_up(product.id)
        {
            fence.lift(product.id);
            tracing::warn!(
                product_id = product.id,
                held = snapshot.held.len(),
                "stock ledger rebuilt from postgres after redis lost it: sales resume"
            );
            metrics::counter!("seckill_ledger_rebuilds_total").increment(1);
        }
        if loaded_now > 0 {
            self.catch_up_window(product).await?;
            tracing::info!(
                product_id = product.id,
                held = snapshot.held.len(),
                version = snapshot.version,
                loaded_now,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "stock loaded into redis"
            );
            metrics::counter!("seckill_stock_loads_total").increment(1);
        }
        Ok(())
    }

    /// Writes every bucket not yet in Redis from `snapshot`; returns how many it wrote.
    pub(super) async fn fill(
        &self,
        product: &Product,
        snapshot: &Snapshot,
    ) -> Result<i64, ApiError> {
        let keys = self.ledger.keys();
        let mut conn = self.redis.get().await?;
        let mut loaded_now = 0;
        for bucket in 0..product.buckets() {
            // Register the outbox (and its consumer group) before any unit can be sold, so
            // the relay knows every stream that can hold an accepted purchase.
            let outbox = keys.outbox(product.id, bucket);
            crate::relay::register(&mut conn, keys, &outbox, product.end_at.timestamp_millis())
                .await?;
            crate::relay::create_group(&mut conn, &outbox).await?;
            let load = BucketLoad {
                units: snapshot.units(bucket),
                version: snapshot.version,
                window: window(product),
            };
            let held = snapshot.homed_in(bucket).map(|held| HeldUnit {
                user_id: held.user_id,
                request_id: held.request_id.to_string(),
                result: held.result(),
            });
            let loaded = self
                .ledger
                .load_bucket(&mut conn, product.id, bucket, &load, held)
                .await?;
            loaded_now += i64::from(loaded);
            seckill_http::failpoint!("load::after_bucket", Err(redis_lost()));
        }
        self.ledger.mark_loaded(&mut conn, product.id).await?;
        drop(conn);
        self.extend_state(product).await?;
        Ok(loaded_now)
    }
}
