//! seckill-api settings: `SECKILL_*` shared with the other services, `SECKILL_API_*` its own.

use serde::{Deserialize, Serialize};

use seckill_config::{DEV_INTERNAL_KEY, Secret, Validate};

/// Everything seckill-api reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Interface to bind.
    pub host: String,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// Postgres, including the database name (created if missing).
    pub database_url: Secret,
    /// Redis.
    pub redis_url: Secret,
    /// RabbitMQ.
    pub amqp_url: Secret,
    /// Prefix of every Redis key and AMQP name: isolates tests and tenants.
    pub namespace: String,
    /// Key of the gateway's identity signature (shared with the gateway).
    pub internal_key: Secret,
    /// How old a gateway identity signature may be.
    pub identity_max_age_ms: i64,
    /// Redis connections in the pool.
    pub redis_pool_size: usize,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
    /// How long start-up waits for Postgres/RabbitMQ before giving up.
    pub startup_patience_secs: u64,
    /// Lazy-load lock lifetime; shorter than a request's deadline so a dead loader frees it.
    pub load_lock_ttl_ms: u64,
    /// How long a request waits for another replica's load before answering 503.
    pub load_wait_ms: u64,
    /// Product metadata L1 cache lifetime (randomised ±20 % per entry).
    pub product_cache_ttl_secs: u64,
    /// Outbox entries the relay reads and publishes per round.
    pub relay_batch: usize,
    /// Outbox entries pending longer than this on another consumer are reclaimed.
    pub relay_reclaim_idle_ms: u64,
    /// `json` or `pretty`.
    pub log_format: String,
    /// `EnvFilter` directive when `RUST_LOG` is unset.
    pub log_filter: String,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            host: "0.0.0.0".into(),
            port: 8081,
            database_url: "postgres://postgres:postgres@127.0.0.1:5432/seckill".into(),
            redis_url: "redis://127.0.0.1:6379".into(),
            amqp_url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            namespace: "seckill".into(),
            internal_key: DEV_INTERNAL_KEY.into(),
            identity_max_age_ms: 30_000,
            redis_pool_size: 64,
            db_pool_size: 10,
            startup_patience_secs: 60,
            load_lock_ttl_ms: 3_000,
            load_wait_ms: 5_000,
            product_cache_ttl_secs: 30,
            relay_batch: 256,
            relay_reclaim_idle_ms: 30_000,
            log_format: "json".into(),
            log_filter: "info".into(),
        }
    }
}

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        seckill_config::validate_namespace(&self.namespace)?;
        if self.redis_pool_size == 0 || self.db_pool_size == 0 || self.relay_batch == 0 {
            return Err("pool sizes and relay_batch must be positive".into());
        }
        if self.load_lock_ttl_ms == 0 || self.load_lock_ttl_ms >= self.load_wait_ms {
            return Err("load_lock_ttl_ms must be positive and below load_wait_ms".into());
        }
        Ok(())
    }
}
