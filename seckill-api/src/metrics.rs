//! The names of seckill-api's purchase and outbox metrics, in one place, with their help
//! text (docs/metrics.md lists every metric, and which alert or panel reads it).
//!
//! [`describe`] gives each one a `# HELP` line on `/metrics` and registers, at zero, the
//! labelled counters an alert or a panel reads, so they exist before the first event: PromQL
//! reads a missing series as "no data", not as 0.

use std::sync::atomic::{AtomicBool, Ordering};

use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Purchase decisions, by `outcome` (accepted, sold_out, already_purchased, …).
pub const PURCHASES: &str = "seckill_purchases_total";
/// Accepted purchases, by `durable_in` (`broker`: published before the 202; `outbox`: left
/// to the relay).
pub const ACCEPTED: &str = "seckill_accepted_total";
/// 1 while the replica is subscribed to the announcements of units going back on sale
/// (its local sold-out flags then come down at once, not only after their TTL).
pub const SOLD_OUT_FOLLOWING: &str = "seckill_sold_out_following";
/// Age of the oldest outbox entry not yet confirmed by the broker, by `replica`.
pub const OUTBOX_OLDEST_AGE: &str = "outbox_oldest_age_seconds";
/// Entries over all outbox streams, at the relay's last safety scan.
pub const OUTBOX_BACKLOG: &str = "outbox_backlog";
/// Outbox entries the relay published.
pub const OUTBOX_PUBLISHED: &str = "outbox_published_total";
/// Outbox entries the relay published, saw confirmed and deleted.
pub const OUTBOX_CONFIRMED: &str = "outbox_confirmed_total";
/// Publishes of outbox entries (the relay's or a purchase handler's) without a plain
/// confirm, by `reason`.
pub const OUTBOX_CONFIRM_FAILURES: &str = "outbox_confirm_failures_total";
/// How long the relay waited for a round's confirms.
pub const OUTBOX_CONFIRM_SECONDS: &str = "outbox_confirm_seconds";
/// Purchases a handler's publishing worker left to the relay because their handler had
/// stopped waiting (or its deadline passed) before the worker got to them.
pub const PUBLISH_WITHDRAWN: &str = "seckill_publish_withdrawn_total";
/// Purchases per order message published (group commit, `seckill_messaging::batch`), by
/// the handlers' publishing workers and the relay.
pub const ORDERS_PER_MESSAGE: &str = "seckill_orders_per_message";
/// Purchases noted in transit for the fence (`seckill_store::transit`): published without
/// a confirm in time, or about to be published by the relay; by `outcome` (`noted`,
/// `failed`).
pub const TRANSIT_NOTES: &str = "seckill_transit_notes_total";

/// The `reason`s of [`OUTBOX_CONFIRM_FAILURES`].
pub mod confirm_failure {
    /// Confirmed, but no queue took it (returned as unroutable).
    pub const RETURNED: &str = "returned";
    /// Nacked by the broker.
    pub const NACKED: &str = "nacked";
    /// Published on a channel not in confirm mode.
    pub const NOT_CONFIRMED: &str = "not_confirmed";
    /// No confirm within the bound.
    pub const TIMED_OUT: &str = "timed_out";
    /// The channel failed the publish or its confirm.
    pub const CHANNEL: &str = "channel";
    /// A handler found no connection to the broker.
    pub const NOT_CONNECTED: &str = "not_connected";
    /// Every reason.
    pub const ALL: [&str; 6] = [
        RETURNED,
        NACKED,
        NOT_CONFIRMED,
        TIMED_OUT,
        CHANNEL,
        NOT_CONNECTED,
    ];
}

/// The `reason` of a publish error of the shared publisher.
pub fn confirm_failure_reason(error: &seckill_messaging::PublishError) -> &'static str {
    use seckill_messaging::{NotTaken, PublishError};
    match error {
        PublishError::Channel(_) => confirm_failure::CHANNEL,
        PublishError::TimedOut(_) => confirm_failure::TIMED_OUT,
        PublishError::NotTaken(NotTaken::Returned) => confirm_failure::RETURNED,
        PublishError::NotTaken(NotTaken::Nacked) => confirm_failure::NACKED,
        PublishError::NotTaken(NotTaken::NotConfirmed) => confirm_failure::NOT_CONFIRMED,
    }
}

/// Describes every metric above and registers at zero the series alerts and panels read;
/// `replica` is this replica's relay consumer name.
pub fn describe(replica: &str) {
    static DESCRIBED: AtomicBool = AtomicBool::new(false);
    // The recorder must exist before anything is registered with it.
    let _ = seckill_telemetry::metrics_handle();
    if !DESCRIBED.swap(true, Ordering::Relaxed) {
        describe_counter!(PURCHASES, "Purchase decisions, by outcome.");
        describe_counter!(
            ACCEPTED,
            "Accepted purchases, by where they were durable first."
        );
        describe_gauge!(
            OUTBOX_OLDEST_AGE,
            Unit::Seconds,
            "Age of the oldest outbox entry not yet confirmed by the broker (0: empty)."
        );
        describe_gauge!(OUTBOX_BACKLOG, "Entries over all outbox streams.");
        describe_counter!(OUTBOX_PUBLISHED, "Outbox entries published by the relay.");
        describe_counter!(OUTBOX_CONFIRMED, "Outbox entries confirmed and deleted.");
        describe_counter!(
            OUTBOX_CONFIRM_FAILURES,
            "Publishes of outbox entries without a plain confirm, by reason."
        );
        describe_histogram!(
            OUTBOX_CONFIRM_SECONDS,
            Unit::Seconds,
            "How long the relay waited for a round's confirms."
        );
        describe_counter!(
            PUBLISH_WITHDRAWN,
            "Purchases a publishing worker left to the relay: their handler stopped waiting."
        );
        describe_histogram!(
            ORDERS_PER_MESSAGE,
            "Purchases per order message published (handlers and relay)."
        );
        describe_counter!(
            TRANSIT_NOTES,
            "Purchases noted in transit for the ledger fence, by outcome."
        );
    }
    for outcome in ["accepted", "sold_out", "already_purchased", "error"] {
        metrics::counter!(PURCHASES, "outcome" => outcome).increment(0);
    }
    for durable_in in ["broker", "outbox"] {
        metrics::counter!(ACCEPTED, "durable_in" => durable_in).increment(0);
    }
    for reason in confirm_failure::ALL {
        metrics::counter!(OUTBOX_CONFIRM_FAILURES, "reason" => reason).increment(0);
    }
    for outcome in ["noted", "failed"] {
        metrics::counter!(TRANSIT_NOTES, "outcome" => outcome).increment(0);
    }
    metrics::counter!(OUTBOX_PUBLISHED).increment(0);
    metrics::counter!(OUTBOX_CONFIRMED).increment(0);
    metrics::gauge!(OUTBOX_OLDEST_AGE, "replica" => replica.to_owned()).increment(0.0);
}
