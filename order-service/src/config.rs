//! order-service settings: `SECKILL_*` shared with the other services, `SECKILL_ORDER_*` its own.

use serde::{Deserialize, Serialize};

use seckill_config::{BackendSettings, Validate};

/// Everything order-service reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Stores, namespace, identity key and logging, shared with seckill-api.
    #[serde(flatten)]
    pub backend: BackendSettings,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// Unacknowledged deliveries the broker hands this replica at once; also how many are
    /// written concurrently.
    pub prefetch: u16,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
    /// Redis connections in the pool.
    pub redis_pool_size: usize,
    /// Delay before a message that hit a transient failure is requeued.
    pub requeue_delay_ms: u64,
    /// Most messages written in one transaction (1 = one transaction per message).
    pub batch_size: usize,
    /// How long a batch waits for more messages after its first one, milliseconds.
    pub batch_linger_ms: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            backend: BackendSettings::default(),
            port: 8082,
            prefetch: 64,
            db_pool_size: 16,
            redis_pool_size: 16,
            requeue_delay_ms: 1_000,
            batch_size: 64,
            batch_linger_ms: 5,
        }
    }
}

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        self.backend.validate()?;
        if self.prefetch == 0
            || self.db_pool_size == 0
            || self.redis_pool_size == 0
            || self.batch_size == 0
        {
            return Err("prefetch, batch_size and pool sizes must be positive".into());
        }
        Ok(())
    }
}
