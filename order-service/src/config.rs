//! order-service settings: `SECKILL_*` shared with the other services, `SECKILL_ORDER_*` its own.

use std::time::Duration;

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
    /// Upgrade only (`SECKILL_ORDER_ACCEPT_UNSIGNED`): accept order messages that carry no
    /// signature, so the purchases accepted before signing was deployed (in the queues, in
    /// the parking lot) still become orders; a wrong signature is refused all the same.
    /// Counted in `orders_unsigned_accepted_total`; turn it off once that stops growing.
    pub accept_unsigned: bool,
    /// Unacknowledged deliveries the broker hands this replica at once; with `batch_size`
    /// it bounds the batches written concurrently (prefetch / batch_size).
    pub prefetch: u16,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
    /// Multiplexed Redis connections (1–8; each carries any number of concurrent commands).
    pub redis_pool_size: usize,
    /// Delay before a message that hit a transient failure is requeued (`requeue_delay_ms`).
    #[serde(rename = "requeue_delay_ms", with = "seckill_config::formats::millis")]
    pub requeue_delay: Duration,
    /// Purchases gathered for one transaction (1 = one transaction per message). A message
    /// carrying several purchases (group commit) counts each, and is never split: its
    /// purchases share one transaction, even past this number.
    pub batch_size: usize,
    /// How long a batch waits for more messages after its first one (`batch_linger_ms`).
    #[serde(rename = "batch_linger_ms", with = "seckill_config::formats::millis")]
    pub batch_linger: Duration,
    /// Retry tier delays, shortest first (`retry_tiers_ms`, comma-separated milliseconds).
    #[serde(
        rename = "retry_tiers_ms",
        with = "seckill_config::formats::millis_list"
    )]
    pub retry_tiers: Vec<Duration>,
    /// Deliveries of one message at most (the first included) before it is dead-lettered.
    pub max_attempts: u32,
    /// Retries may add this fraction of the traffic (the retry budget)…
    pub retry_budget_ratio: f64,
    /// …plus this many per second.
    pub retry_budget_min_per_sec: f64,
    /// How long an order transaction waits for a lock before it counts as a transient
    /// failure (`lock_timeout_ms`).
    #[serde(rename = "lock_timeout_ms", with = "seckill_config::formats::millis")]
    pub lock_timeout: Duration,
    /// Circuit breaker window: `count` (the last `breaker_window_size` batch writes) or
    /// `time` (those of the last `breaker_window_size` seconds).
    pub breaker_window: BreakerWindow,
    /// Size of the breaker window (calls or seconds).
    pub breaker_window_size: usize,
    /// Calls the window must hold before the breaker may open.
    pub breaker_minimum_calls: usize,
    /// Failure rate (percent) that opens the breaker.
    pub breaker_failure_rate: f64,
    /// Slow-call rate (percent) that opens the breaker.
    pub breaker_slow_call_rate: f64,
    /// A batch write slower than this is slow (`breaker_slow_call_ms`).
    #[serde(
        rename = "breaker_slow_call_ms",
        with = "seckill_config::formats::millis"
    )]
    pub breaker_slow_call: Duration,
    /// How long the breaker stays open before trial calls (`breaker_wait_open_ms`).
    #[serde(
        rename = "breaker_wait_open_ms",
        with = "seckill_config::formats::millis"
    )]
    pub breaker_wait_open: Duration,
    /// Trial calls in half-open.
    pub breaker_half_open_calls: usize,
    /// How often the operator's forced mode is read from Redis (`breaker_mode_poll_ms`).
    #[serde(
        rename = "breaker_mode_poll_ms",
        with = "seckill_config::formats::millis"
    )]
    pub breaker_mode_poll: Duration,
    /// How long a new order has to be paid before it is cancelled and its unit goes back on
    /// sale (`payment_window_secs`); 0: orders never expire.
    #[serde(rename = "payment_window_secs", with = "seckill_config::formats::secs")]
    pub payment_window: Duration,
    /// How often the payment-window sweep and the compensation relay look for work when
    /// they found none (`compensation_poll_ms`).
    #[serde(
        rename = "compensation_poll_ms",
        with = "seckill_config::formats::millis"
    )]
    pub compensation_poll: Duration,
    /// How often the queues' depth and consumers are read for the metrics
    /// (`queue_watch_ms`, see `crate::queue_watch`).
    #[serde(rename = "queue_watch_ms", with = "seckill_config::formats::millis")]
    pub queue_watch: Duration,
    /// Redrives after which a dead letter that fails again is quarantined.
    pub quarantine_after_redrives: i32,
    /// Redriven messages published per second at most (a token bucket, per replica)…
    pub redrive_per_sec: f64,
    /// …and at once.
    pub redrive_burst: f64,
}

/// How the circuit breaker's window is measured.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BreakerWindow {
    /// The last `breaker_window_size` batch writes.
    #[default]
    Count,
    /// The batch writes of the last `breaker_window_size` seconds.
    Time,
}

impl Settings {
    /// The circuit breaker's settings (validation guarantees they make sense).
    pub fn breaker(&self) -> crate::breaker::Config {
        let size = self.breaker_window_size;
        crate::breaker::Config {
            window: match self.breaker_window {
                BreakerWindow::Time => {
                    crate::breaker::Window::Time(Duration::from_secs(size as u64))
                }
                BreakerWindow::Count => crate::breaker::Window::Count(size),
            },
            minimum_calls: self.breaker_minimum_calls,
            failure_rate_threshold: self.breaker_failure_rate,
            slow_call_rate_threshold: self.breaker_slow_call_rate,
            slow_call_duration: self.breaker_slow_call,
            wait_in_open: self.breaker_wait_open,
            permitted_in_half_open: self.breaker_half_open_calls,
        }
    }

    /// The payment window, if orders have one.
    pub fn payment_window(&self) -> Option<Duration> {
        (!self.payment_window.is_zero()).then_some(self.payment_window)
    }

    /// The retry tiers in milliseconds, the unit of their queues' names and message TTLs.
    pub fn retry_tiers_ms(&self) -> Vec<u64> {
        self.retry_tiers
            .iter()
            .map(|tier| u64::try_from(tier.as_millis()).unwrap_or(u64::MAX))
            .collect()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            backend: BackendSettings::default(),
            port: 8082,
            accept_unsigned: false,
            prefetch: 256,
            db_pool_size: 16,
            redis_pool_size: 16,
            requeue_delay: Duration::from_secs(1),
            batch_size: 64,
            batch_linger: Duration::from_millis(5),
            retry_tiers: [1, 5, 30].map(Duration::from_secs).to_vec(),
            max_attempts: 5,
            retry_budget_ratio: 0.2,
            retry_budget_min_per_sec: 10.0,
            lock_timeout: Duration::from_secs(2),
            breaker_window: BreakerWindow::Count,
            breaker_window_size: 20,
            breaker_minimum_calls: 5,
            breaker_failure_rate: 50.0,
            breaker_slow_call_rate: 100.0,
            breaker_slow_call: Duration::from_secs(5),
            breaker_wait_open: Duration::from_secs(5),
            breaker_half_open_calls: 2,
            breaker_mode_poll: Duration::from_secs(1),
            payment_window: Duration::from_secs(900),
            compensation_poll: Duration::from_millis(500),
            queue_watch: crate::queue_watch::WATCH_EVERY,
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
        if self.retry_tiers.is_empty() || self.retry_tiers.iter().any(Duration::is_zero) {
            return Err("retry_tiers_ms must list positive millisecond delays".into());
        }
        // A purchase waiting in a tier is noted in transit, and a note holds a rebuilt
        // ledger's fence for `HOLDS_FOR` at most: the copy must be back well within it.
        if self
            .retry_tiers
            .iter()
            .any(|tier| *tier > seckill_store::transit::HOLDS_FOR / 2)
        {
            return Err(format!(
                "retry_tiers_ms must each be at most {} (half of how long a transit note holds)",
                (seckill_store::transit::HOLDS_FOR / 2).as_millis()
            ));
        }
        if self.breaker_window_size == 0
            || self.breaker_minimum_calls == 0
            || self.breaker_half_open_calls == 0
            || self.breaker_mode_poll.is_zero()
        {
            return Err(
                "breaker_window_size, breaker_minimum_calls, breaker_half_open_calls \
                 and breaker_mode_poll_ms must be positive"
                    .into(),
            );
        }
        let percent = 0.0..=100.0;
        if !percent.contains(&self.breaker_failure_rate)
            || !percent.contains(&self.breaker_slow_call_rate)
        {
            return Err("breaker rates are percentages (0-100)".into());
        }
        if self.max_attempts == 0 || self.lock_timeout.is_zero() {
            return Err("max_attempts and lock_timeout_ms must be positive".into());
        }
        if !(0.0..=10.0).contains(&self.retry_budget_ratio) || self.retry_budget_min_per_sec < 0.0 {
            return Err("retry budget must be a ratio in 0..=10 and a non-negative rate".into());
        }
        if self.compensation_poll.is_zero()
            || self.queue_watch.is_zero()
            || self.quarantine_after_redrives <= 0
        {
            return Err(
                "compensation_poll_ms, queue_watch_ms and quarantine_after_redrives must be \
                 positive"
                    .into(),
            );
        }
        if !(self.redrive_per_sec > 0.0 && self.redrive_burst >= 1.0) {
            return Err("redrive_per_sec must be positive and redrive_burst at least 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_tier_longer_than_half_a_transit_note_is_refused() {
        let mut settings = Settings::default();
        assert_eq!(settings.validate(), Ok(()));
        settings.retry_tiers = vec![Duration::from_secs(1), Duration::from_secs(151)];
        let refused = settings.validate().expect_err("a 151 s tier");
        assert!(refused.contains("retry_tiers_ms"), "{refused}");
        settings.retry_tiers = vec![Duration::from_secs(150)];
        assert_eq!(settings.validate(), Ok(()));
    }
}
