//! order-service settings: `SECKILL_*` shared with the other services, `SECKILL_ORDER_*` its own.

use serde::{Deserialize, Serialize};

use seckill_config::{DEV_INTERNAL_KEY, Secret, Validate};

/// Everything order-service reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Interface to bind.
    pub host: String,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// Postgres, including the database name (created if missing).
    pub database_url: Secret,
    /// Redis (buyer results).
    pub redis_url: Secret,
    /// RabbitMQ.
    pub amqp_url: Secret,
    /// Prefix of every Redis key and AMQP name.
    pub namespace: String,
    /// Key of the gateway's identity signature (shared with the gateway).
    pub internal_key: Secret,
    /// How old a gateway identity signature may be.
    pub identity_max_age_ms: i64,
    /// Unacknowledged deliveries the broker hands this replica at once; also how many are
    /// written concurrently.
    pub prefetch: u16,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
    /// Redis connections in the pool.
    pub redis_pool_size: usize,
    /// How long start-up waits for Postgres/RabbitMQ before giving up.
    pub startup_patience_secs: u64,
    /// Delay before a message that hit a transient failure is requeued.
    pub requeue_delay_ms: u64,
    /// `json` or `pretty`.
    pub log_format: String,
    /// `EnvFilter` directive when `RUST_LOG` is unset.
    pub log_filter: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 8082,
            database_url: "postgres://postgres:postgres@127.0.0.1:5432/seckill".into(),
            redis_url: "redis://127.0.0.1:6379".into(),
            amqp_url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            namespace: "seckill".into(),
            internal_key: DEV_INTERNAL_KEY.into(),
            identity_max_age_ms: 30_000,
            prefetch: 64,
            db_pool_size: 16,
            redis_pool_size: 16,
            startup_patience_secs: 60,
            requeue_delay_ms: 1_000,
            log_format: "json".into(),
            log_filter: "info".into(),
        }
    }
}

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        seckill_config::validate_namespace(&self.namespace)?;
        if self.prefetch == 0 || self.db_pool_size == 0 || self.redis_pool_size == 0 {
            return Err("prefetch and pool sizes must be positive".into());
        }
        Ok(())
    }
}
