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
    /// Retry tier delays, comma-separated milliseconds, shortest first.
    pub retry_tiers_ms: String,
    /// Deliveries of one message at most (the first included) before it is dead-lettered.
    pub max_attempts: u32,
    /// Retries may add this fraction of the traffic (the retry budget)…
    pub retry_budget_ratio: f64,
    /// …plus this many per second.
    pub retry_budget_min_per_sec: f64,
    /// How long an order transaction waits for a lock before it counts as a transient
    /// failure, milliseconds.
    pub lock_timeout_ms: u64,
}

impl Settings {
    /// The retry tiers, parsed (validation guarantees they parse).
    pub fn retry_tiers(&self) -> Vec<u64> {
        seckill_config::split_list(&self.retry_tiers_ms)
            .iter()
            .filter_map(|t| t.parse().ok())
            .collect()
    }
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
            retry_tiers_ms: "1000,5000,30000".into(),
            max_attempts: 5,
            retry_budget_ratio: 0.2,
            retry_budget_min_per_sec: 10.0,
            lock_timeout_ms: 2_000,
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
        let tiers = seckill_config::split_list(&self.retry_tiers_ms);
        let parsed = self.retry_tiers();
        if parsed.is_empty() || parsed.len() != tiers.len() || parsed.contains(&0) {
            return Err("retry_tiers_ms must list positive millisecond delays".into());
        }
        if self.max_attempts == 0 || self.lock_timeout_ms == 0 {
            return Err("max_attempts and lock_timeout_ms must be positive".into());
        }
        if !(0.0..=10.0).contains(&self.retry_budget_ratio) || self.retry_budget_min_per_sec < 0.0 {
            return Err("retry budget must be a ratio in 0..=10 and a non-negative rate".into());
        }
        Ok(())
    }
}
