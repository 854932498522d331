//! seckill-api settings: `SECKILL_*` shared with the other services, `SECKILL_API_*` its own.

use serde::{Deserialize, Serialize};

use seckill_config::{BackendSettings, Validate};

/// Everything seckill-api reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Stores, namespace, identity key and logging, shared with order-service.
    #[serde(flatten)]
    pub backend: BackendSettings,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// Redis connections in the pool.
    pub redis_pool_size: usize,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
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
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            backend: BackendSettings::default(),
            port: 8081,
            redis_pool_size: 64,
            db_pool_size: 10,
            load_lock_ttl_ms: 3_000,
            load_wait_ms: 5_000,
            product_cache_ttl_secs: 30,
            relay_batch: 256,
            relay_reclaim_idle_ms: 30_000,
        }
    }
}

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        self.backend.validate()?;
        if self.redis_pool_size == 0 || self.db_pool_size == 0 || self.relay_batch == 0 {
            return Err("pool sizes and relay_batch must be positive".into());
        }
        if self.load_lock_ttl_ms == 0 || self.load_lock_ttl_ms >= self.load_wait_ms {
            return Err("load_lock_ttl_ms must be positive and below load_wait_ms".into());
        }
        Ok(())
    }
}
