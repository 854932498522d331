//! Where state lives: the Postgres schema and the Redis key layout, shared by every service
//! (and by the load tester, which checks invariants against both).
//!
//! Layout:
//! - [`postgres`] — connect with retry, create the configured database, run migrations.
//! - [`keys`] — every Redis key, namespaced, with one hash tag per product.
//! - [`result`] — the buyer-visible purchase result as stored in Redis.

pub mod keys;
pub mod postgres;
pub mod probes;
pub mod result;

pub use keys::RedisKeys;
pub use result::PurchaseResult;

/// Builds a Redis connection pool; connections open lazily, so this never blocks on Redis.
pub fn redis_pool(url: &str, max_size: usize) -> anyhow::Result<deadpool_redis::Pool> {
    let cfg = deadpool_redis::Config::from_url(url);
    let pool = cfg
        .builder()?
        .max_size(max_size)
        .wait_timeout(Some(std::time::Duration::from_secs(2)))
        .create_timeout(Some(std::time::Duration::from_secs(2)))
        .recycle_timeout(Some(std::time::Duration::from_secs(2)))
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()?;
    Ok(pool)
}
