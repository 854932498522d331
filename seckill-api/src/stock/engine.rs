//! The engine's handle: its stores, timings, fence and durability wait, and the reads the
//! routes make of the ledger.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use seckill_store::ledger::{Holding, Ledger};
use seckill_store::{Dedicated, Redis, RedisConn, WaitFor, home_bucket};

use super::fence::Fence;
use crate::catalog::Product;
use crate::error::ApiError;

/// The engine's timing settings.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Lazy-load lock lifetime.
    pub lock_ttl: Duration,
    /// How long a request waits for another loader.
    pub load_wait: Duration,
    /// How long after its reservation a sweep may take a unit.
    pub sweep_fence: Duration,
    /// Extra age before an abandoned reservation is resolved (clock skew between nodes).
    pub skew_margin: Duration,
}

/// Deducts stock in Redis; cheap to clone.
#[derive(Clone)]
pub struct StockEngine {
    /// Where the ledger lives.
    pub(super) redis: Redis,
    /// Where loads read their snapshot.
    pub(super) db: PgPool,
    /// The ledger's scripts and keys.
    pub(super) ledger: Ledger,
    pub(super) timings: Timings,
    /// Tells when a product whose ledger Redis lost may be loaded again; `None`: never
    /// automatically (such a product stays refused).
    pub(super) fence: Option<std::sync::Arc<Fence>>,
    /// Copies (replicas, local AOF) an accepted purchase's write waits for, and the
    /// dedicated connections it writes and waits on; `None`: none asked for.
    copies: Option<(WaitFor, Dedicated)>,
}

impl std::fmt::Debug for StockEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockEngine")
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

impl StockEngine {
    /// An engine over these stores.
    pub fn new(redis: Redis, db: PgPool, keys: seckill_store::RedisKeys, timings: Timings) -> Self {
        Self {
            redis,
            db,
            ledger: Ledger::new(keys),
            timings,
            fence: None,
            copies: None,
        }
    }

    /// The same engine, waiting for `wait`'s copies of every accepted purchase's write. A
    /// `WAIT` holds back everything sent behind it on its connection, and counts the writes
    /// of that connection only: so with a wait, a purchase's script and its `WAIT` run on a
    /// dedicated connection, one of at most `connections` (`seckill_store::dedicated`).
    /// Without one, every purchase stays on the multiplexed connections.
    pub fn with_wait(mut self, wait: Option<WaitFor>, connections: usize) -> anyhow::Result<Self> {
        self.copies = match wait {
            Some(wait) => Some((wait, self.redis.dedicated(connections, wait.timeout)?)),
            None => None,
        };
        Ok(self)
    }

    /// The connection a purchase's write runs on: a dedicated one when its copies are
    /// waited for (see [`Self::with_wait`]), else a multiplexed one.
    pub(super) async fn writer(&self) -> Result<RedisConn, ApiError> {
        match &self.copies {
            Some((_, dedicated)) => Ok(dedicated.get().await?),
            None => Ok(self.redis.get().await?),
        }
    }

    /// Waits for the copies asked for of the purchase just written through `conn` (from
    /// [`Self::writer`]) to a bucket of `product_id`. The purchase stands either way (its
    /// unit is taken and its intent recorded); a short count means a failover or a crash of
    /// this Redis could still lose it, so it is logged and counted for the operator. Without
    /// a wait asked for, it costs nothing (not even the key).
    pub(super) async fn await_copies(&self, conn: &mut RedisConn, product_id: i64, bucket: u16) {
        let Some((wait, _)) = self.copies else {
            return;
        };
        let key = self.ledger.keys().stock(product_id, bucket);
        let short = match conn.wait_for(&key, wait).await {
            Ok(all_there) => !all_there,
            Err(e) => {
                tracing::warn!(error = %e, "waiting for copies of a purchase failed");
                true
            }
        };
        if short {
            metrics::counter!("seckill_redis_wait_short_total").increment(1);
            tracing::warn!(
                replicas = wait.replicas,
                local_aof = wait.local_aof,
                "an accepted purchase has fewer Redis copies than asked for"
            );
        }
    }

    /// The same engine, telling lost ledgers apart with `fence` (see [`super::fence`]).
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(std::sync::Arc::new(fence));
        self
    }

    /// Another replica rebuilt the product's ledger: this one's fence for it is done.
    pub(super) fn lift_fence(&self, product_id: i64) {
        if let Some(fence) = &self.fence {
            fence.lift(product_id);
        }
    }

    /// Whether this replica holds a product's sales for a ledger Redis lost.
    pub fn is_fenced(&self, product_id: i64) -> bool {
        self.fence.as_ref().is_some_and(|f| f.is_up(product_id))
    }

    /// Units left in Redis over all buckets, or `None` when no bucket is loaded.
    pub async fn remaining(&self, product: &Product) -> Result<Option<i64>, ApiError> {
        let mut total = None;
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            let remaining = self.ledger.remaining(&mut conn, product.id, bucket).await?;
            if let Some(units) = remaining {
                total = Some(total.unwrap_or(0) + units);
            }
        }
        Ok(total)
    }

    /// What the buyer's marker says of purchase `request_id`.
    pub async fn holding(
        &self,
        product: &Product,
        user_id: i64,
        request_id: uuid::Uuid,
    ) -> Result<Holding, ApiError> {
        let home = home_bucket(user_id, product.buckets());
        let mut conn = self.redis.get().await?;
        Ok(self
            .ledger
            .holding(&mut conn, product.id, home, user_id, request_id)
            .await?)
    }

    /// Whether the product's sold-out flag is up in Redis.
    pub async fn is_flagged_sold_out(&self, product_id: i64) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        Ok(self.ledger.is_sold_out(&mut conn, product_id).await?)
    }
}

pub(super) fn record_lua(script: &'static str, started: Instant) {
    metrics::histogram!("seckill_lua_seconds", "script" => script)
        .record(started.elapsed().as_secs_f64());
}
