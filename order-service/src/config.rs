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
    /// Unacknowledged deliveries the broker hands this replica at once; with `batch_size`
    /// it bounds the batches written concurrently (prefetch / batch_size).
    pub prefetch: u16,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
    /// Multiplexed Redis connections (1–8; each carries any number of concurrent commands).
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
    /// Circuit breaker window: `count` (the last `breaker_window_size` batch writes) or
    /// `time` (those of the last `breaker_window_size` seconds).
    pub breaker_window: String,
    /// Size of the breaker window (calls or seconds).
    pub breaker_window_size: usize,
    /// Calls the window must hold before the breaker may open.
    pub breaker_minimum_calls: usize,
    /// Failure rate (percent) that opens the breaker.
    pub breaker_failure_rate: f64,
    /// Slow-call rate (percent) that opens the breaker.
    pub breaker_slow_call_rate: f64,
    /// A batch write slower than this is slow, milliseconds.
    pub breaker_slow_call_ms: u64,
    /// How long the breaker stays open before trial calls, milliseconds.
    pub breaker_wait_open_ms: u64,
    /// Trial calls in half-open.
    pub breaker_half_open_calls: usize,
    /// How often the operator's forced mode is read from Redis, milliseconds.
    pub breaker_mode_poll_ms: u64,
    /// Seconds a new order has to be paid before it is cancelled and its unit goes back on
    /// sale; 0: orders never expire.
    pub payment_window_secs: u64,
    /// How often the payment-window sweep and the compensation relay look for work when
    /// they found none, milliseconds.
    pub compensation_poll_ms: u64,
    /// Redrives after which a dead letter that fails again is quarantined.
    pub quarantine_after_redrives: i32,
    /// Redriven messages published per second at most (a token bucket, per replica)…
    pub redrive_per_sec: f64,
    /// …and at once.
    pub redrive_burst: f64,
}

impl Settings {
    /// The circuit breaker's settings (validation guarantees they make sense).
    pub fn breaker(&self) -> crate::breaker::Config {
        use std::time::Duration;
        let size = self.breaker_window_size;
        crate::breaker::Config {
            window: if self.breaker_window == "time" {
                crate::breaker::Window::Time(Duration::from_secs(size as u64))
            } else {
                crate::breaker::Window::Count(size)
            },
            minimum_calls: self.breaker_minimum_calls,
            failure_rate_threshold: self.breaker_failure_rate,
            slow_call_rate_threshold: self.breaker_slow_call_rate,
            slow_call_duration: Duration::from_millis(self.breaker_slow_call_ms),
            wait_in_open: Duration::from_millis(self.breaker_wait_open_ms),
            permitted_in_half_open: self.breaker_half_open_calls,
        }
    }

    /// The payment window, if orders have one.
    pub fn payment_window(&self) -> Option<std::time::Duration> {
        (self.payment_window_secs > 0)
            .then(|| std::time::Duration::from_secs(self.payment_window_secs))
    }

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
            prefetch: 256,
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
            breaker_window: "count".into(),
            breaker_window_size: 20,
            breaker_minimum_calls: 5,
            breaker_failure_rate: 50.0,
            breaker_slow_call_rate: 100.0,
            breaker_slow_call_ms: 5_000,
            breaker_wait_open_ms: 5_000,
            breaker_half_open_calls: 2,
            breaker_mode_poll_ms: 1_000,
            payment_window_secs: 900,
            compensation_poll_ms: 500,
            quarantine_after_redrives: 3,
            redrive_per_sec: 50.0,
            redrive_burst: 50.0,
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
        if !matches!(self.breaker_window.as_str(), "count" | "time")
            || self.breaker_window_size == 0
            || self.breaker_minimum_calls == 0
            || self.breaker_half_open_calls == 0
            || self.breaker_mode_poll_ms == 0
        {
            return Err("breaker_window must be count or time, and its sizes positive".into());
        }
        let percent = 0.0..=100.0;
        if !percent.contains(&self.breaker_failure_rate)
            || !percent.contains(&self.breaker_slow_call_rate)
        {
            return Err("breaker rates are percentages (0-100)".into());
        }
        if self.max_attempts == 0 || self.lock_timeout_ms == 0 {
            return Err("max_attempts and lock_timeout_ms must be positive".into());
        }
        if !(0.0..=10.0).contains(&self.retry_budget_ratio) || self.retry_budget_min_per_sec < 0.0 {
            return Err("retry budget must be a ratio in 0..=10 and a non-negative rate".into());
        }
        if self.compensation_poll_ms == 0 || self.quarantine_after_redrives <= 0 {
            return Err(
                "compensation_poll_ms and quarantine_after_redrives must be positive".into(),
            );
        }
        if !(self.redrive_per_sec > 0.0 && self.redrive_burst >= 1.0) {
            return Err("redrive_per_sec must be positive and redrive_burst at least 1".into());
        }
        Ok(())
    }
}
