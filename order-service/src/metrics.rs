//! The names of order-service's message-lifecycle metrics, in one place, with their help
//! text (docs/metrics.md lists every metric, and which alert or panel reads it).
//!
//! [`describe`] gives each one a `# HELP` line on `/metrics` and registers, at zero, the
//! labelled counters an alert divides or sums: a series that does not exist yet reads as
//! "no data" in PromQL, not as 0, and a rule over it would never fire (or never clear).

use std::sync::atomic::{AtomicBool, Ordering};

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

use seckill_messaging::Topology;

/// Messages taken from the main queue into a batch (retries included).
pub const ORDERS_CONSUMED: &str = "orders_consumed_total";
/// Orders written (first writes only, not duplicates).
pub const ORDERS_CREATED: &str = "orders_created_total";
/// Second purchases of a buyer who held the product's live order, given up with their unit.
pub const ORDERS_SUPERSEDED: &str = "orders_superseded_total";
/// Messages published to a retry tier, by `tier` (its delay, `1000ms`).
pub const ORDERS_RETRIED: &str = "orders_retried_total";
/// Messages dead-lettered, by `reason` (the `x-error-code` they carry).
pub const ORDERS_DEAD_LETTERED: &str = "orders_dead_lettered_total";
/// Acks (or nacks, rejects) the broker could not be sent: the channel had died.
pub const ORDERS_ACK_FAILURES: &str = "orders_ack_failures_total";
/// Now minus the accept time of the oldest purchase in the last batch consumed.
pub const ORDERS_CONSUMER_LAG: &str = "orders_consumer_lag_seconds";
/// From a retry's publish to its tier until it is consumed again, by `tier`.
pub const ORDERS_RETRY_LATENCY: &str = "orders_retry_latency_seconds";
/// Messages ready in each queue of the topology, by `queue` and `role`.
pub const AMQP_QUEUE_MESSAGES: &str = "amqp_queue_messages";
/// Consumers of each queue of the topology, by `queue` and `role`.
pub const AMQP_QUEUE_CONSUMERS: &str = "amqp_queue_consumers";
/// The breaker's state: 0 closed, 1 open, 2 half-open, 3 forced open, 4 forced closed.
pub const BREAKER_STATE: &str = "order_breaker_state";
/// The breaker's transitions, by `from` and `to` (snake_case states).
pub const BREAKER_TRANSITIONS: &str = "order_breaker_transitions_total";
/// 1 while the consumer is paused by the breaker.
pub const CONSUMER_PAUSED: &str = "order_consumer_paused";
/// Dead letters recorded in the parking lot, by `reason`.
pub const ORDERS_PARKED: &str = "orders_parked_total";

/// Dead-letter reasons the service itself gives (the database's rejections, the signature
/// check's refusals, the body's, the retries' and a handler's panic).
pub const DEAD_LETTER_REASONS: [&str; 7] = [
    "unknown_product",
    "out_of_stock",
    "unsigned",
    "bad_signature",
    "unparseable",
    "retries_exhausted",
    "panic",
];

/// The role of a queue in the topology, the `role` label of the queue gauges.
pub mod role {
    /// The queue order-service consumes.
    pub const MAIN: &str = "main";
    /// A retry tier (no consumer by design: its TTL sends messages back).
    pub const RETRY: &str = "retry";
    /// The dead-letter queue, drained into the parking lot.
    pub const DEAD_LETTER: &str = "dead_letter";
}

/// Describes every metric above and registers at zero the counters alerts read; once per
/// process (several services in one test process share the recorder).
pub fn describe(topology: &Topology) {
    static DESCRIBED: AtomicBool = AtomicBool::new(false);
    // The recorder must exist before anything is registered with it.
    let _ = seckill_telemetry::metrics_handle();
    if !DESCRIBED.swap(true, Ordering::Relaxed) {
        describe_counter!(
            ORDERS_CONSUMED,
            "Messages taken from the main queue into a batch."
        );
        describe_counter!(ORDERS_CREATED, "Orders written (duplicates not counted).");
        describe_counter!(
            ORDERS_SUPERSEDED,
            "Second purchases of a buyer holding the product's live order, given up."
        );
        describe_counter!(
            ORDERS_RETRIED,
            "Messages published to a retry tier, by tier."
        );
        describe_counter!(ORDERS_DEAD_LETTERED, "Messages dead-lettered, by reason.");
        describe_counter!(
            ORDERS_ACK_FAILURES,
            "Acks, nacks or rejects that could not be sent to the broker."
        );
        describe_gauge!(
            ORDERS_CONSUMER_LAG,
            Unit::Seconds,
            "Now minus the accept time of the oldest purchase in the last batch consumed \
             (0 once the main queue is found empty)."
        );
        describe_histogram!(
            ORDERS_RETRY_LATENCY,
            Unit::Seconds,
            "From a retry's publish to its tier until it is consumed again, by tier."
        );
        describe_gauge!(
            AMQP_QUEUE_MESSAGES,
            "Messages ready in a queue (passive declare)."
        );
        describe_gauge!(
            AMQP_QUEUE_CONSUMERS,
            "Consumers of a queue (passive declare)."
        );
        describe_gauge!(
            BREAKER_STATE,
            "Breaker state: 0 closed, 1 open, 2 half-open, 3 forced open, 4 forced closed."
        );
        describe_counter!(BREAKER_TRANSITIONS, "Breaker transitions, by from and to.");
        describe_gauge!(
            CONSUMER_PAUSED,
            "1 while the consumer is paused by the breaker."
        );
        describe_counter!(ORDERS_PARKED, "Dead letters recorded in the parking lot.");
    }
    metrics::counter!(ORDERS_CONSUMED).increment(0);
    metrics::counter!(ORDERS_CREATED).increment(0);
    metrics::counter!(ORDERS_ACK_FAILURES).increment(0);
    for reason in DEAD_LETTER_REASONS {
        metrics::counter!(ORDERS_DEAD_LETTERED, "reason" => reason).increment(0);
    }
    for &delay_ms in &topology.retry_tiers_ms {
        metrics::counter!(ORDERS_RETRIED, "tier" => tier_label(delay_ms)).increment(0);
        // Registered, a histogram renders (with empty buckets) before its first retry.
        let _ = metrics::histogram!(ORDERS_RETRY_LATENCY, "tier" => tier_label(delay_ms));
    }
    metrics::gauge!(CONSUMER_PAUSED).increment(0.0);
    metrics::gauge!(ORDERS_CONSUMER_LAG).increment(0.0);
}

/// The `tier` label of a retry tier: its delay, `1000ms`.
pub fn tier_label(delay_ms: u64) -> String {
    format!("{delay_ms}ms")
}
