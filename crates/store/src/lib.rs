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
///
/// Commands time out after 2 s (redis-rs defaults to 500 ms, short enough that a Redis
/// pause during a burst would turn already-executed purchase scripts into client errors).
pub fn redis_pool(url: &str, max_size: usize) -> anyhow::Result<deadpool_redis::Pool> {
    let timeout = Some(std::time::Duration::from_secs(2));
    let connection = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout);
    let manager = deadpool_redis::Manager::new_with_config(url, connection)?;
    let pool = deadpool_redis::Pool::builder(manager)
        .max_size(max_size)
        .wait_timeout(timeout)
        .create_timeout(timeout)
        .recycle_timeout(timeout)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()?;
    Ok(pool)
}
