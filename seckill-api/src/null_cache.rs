//! The Redis null cache: "no such product" for ids the bloom filter let through.
//!
//! A bloom false positive would otherwise reach Postgres on every request (after each short
//! Moka negative entry expires, on every replica). One `SET ... PX` shared by all replicas
//! turns that into one Postgres query per id per TTL. It is an optimisation only: when
//! Redis fails, lookups go on to Postgres rather than fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use seckill_store::{Redis, RedisKeys};

/// At most one warning per this period about Redis failing under the null cache; the rest go
/// to debug, since during an outage every lookup would log.
const WARN_EVERY_MS: i64 = 10_000;

/// Remembers missing product ids in Redis for a short, jittered time.
#[derive(Clone)]
pub struct NullCache {
    redis: Redis,
    keys: RedisKeys,
    /// Entry lifetime before jitter.
    ttl: Duration,
    /// Unix ms of the last warning, shared by clones so the limit is per process.
    last_warning_ms: Arc<AtomicI64>,
}

impl std::fmt::Debug for NullCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NullCache")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl NullCache {
    /// Entries under `keys`, living about `ttl` (±20 %, so ids cached together do not all
    /// expire and hit Postgres together).
    pub fn new(redis: Redis, keys: RedisKeys, ttl: Duration) -> Self {
        Self {
            redis,
            keys,
            ttl,
            last_warning_ms: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Whether Redis says `id` is not a product. False when it does not know or cannot answer.
    pub async fn is_missing(&self, id: i64) -> bool {
        let answer: Result<Option<String>, redis::RedisError> = async {
            let mut conn = self.redis.get().await?;
            redis::cmd("GET")
                .arg(self.keys.missing_product(id))
                .query_async(&mut conn)
                .await
        }
        .await;
        let (missing, result) = match answer {
            Ok(Some(_)) => (true, "hit"),
            Ok(None) => (false, "miss"),
            Err(e) => {
                self.warn(id, "read", &e);
                (false, "error")
            }
        };
        metrics::counter!("seckill_null_cache_total", "result" => result).increment(1);
        missing
    }

    /// Records that `id` is not a product.
    pub async fn remember(&self, id: i64) {
        let ttl_ms = (self.ttl.as_millis() as f64 * rand::random_range(0.8..1.2)).max(1.0) as u64;
        let written: Result<(), redis::RedisError> = async {
            let mut conn = self.redis.get().await?;
            redis::cmd("SET")
                .arg(self.keys.missing_product(id))
                .arg(1)
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut conn)
                .await
        }
        .await;
        let result = match written {
            Ok(()) => "set",
            Err(e) => {
                self.warn(id, "write", &e);
                "error"
            }
        };
        metrics::counter!("seckill_null_cache_total", "result" => result).increment(1);
    }

    /// Forgets that `id` was missing: it exists now.
    pub async fn forget(&self, id: i64) {
        let deleted: Result<i64, redis::RedisError> = async {
            let mut conn = self.redis.get().await?;
            redis::cmd("DEL")
                .arg(self.keys.missing_product(id))
                .query_async(&mut conn)
                .await
        }
        .await;
        match deleted {
            // Only a key that was there is worth counting: most new ids never had one.
            Ok(0) => {}
            Ok(_) => {
                metrics::counter!("seckill_null_cache_total", "result" => "cleared").increment(1)
            }
            Err(e) => {
                // A stale entry outlives this by at most its TTL.
                self.warn(id, "clear", &e);
                metrics::counter!("seckill_null_cache_total", "result" => "error").increment(1);
            }
        }
    }

    fn warn(&self, id: i64, op: &'static str, e: &redis::RedisError) {
        let now = chrono::Utc::now().timestamp_millis();
        let last = self.last_warning_ms.load(Ordering::Relaxed);
        let first_in_period = now - last >= WARN_EVERY_MS
            && self
                .last_warning_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if first_in_period {
            tracing::warn!(product_id = id, op, error = %e,
                "null cache unavailable; lookups go to postgres (further errors at debug for 10s)");
        } else {
            tracing::debug!(product_id = id, op, error = %e, "null cache unavailable");
        }
    }
}
