//! The RabbitMQ consumer: manual ack, bounded prefetch, batched writes.
//!
//! Deliveries are gathered into batches (up to `batch_size`, or whatever arrived within
//! `batch_linger` of the first) and each batch is written in one transaction
//! ([`orders::record_batch`]); several batches are in flight at once, bounded by prefetch.
//!
//! A message is trusted only once its signature ([`seckill_messaging::signature`]) is
//! checked; an unsigned or forged one is dead-lettered (`unsigned`, `bad_signature`) before
//! it is parsed, never retried, and becomes no order.
//!
//! Every AMQP choice here protects "never lose an accepted purchase":
//! - manual ack, sent only after the batch's transaction committed and the buyers' results
//!   were written; a crash before that means redelivery, which the idempotent write absorbs;
//! - `prefetch` bounds unacked deliveries, and so the concurrent writes, per replica;
//! - failures are sorted by [`crate::retry`]: an outage requeues after a delay (no attempt
//!   counted), a transient failure of the message goes to a retry tier, a permanent one to
//!   the dead-letter exchange with its reason; a retry or dead letter is published with a
//!   confirm *before* the original is acked, so a crash in between duplicates, never loses;
//! - a delivery is handed back to the queue at most [`seckill_messaging::MAX_REQUEUES`] times: one the quorum
//!   queue has already returned that often (`x-delivery-count`) is published again as a
//!   fresh copy instead, so a long outage never brings a message to the queue's delivery
//!   limit, which is left to messages that crash their consumer (see
//!   `seckill_messaging::DELIVERY_LIMIT`).
//!
//! A delivery may carry several purchases (`seckill_messaging::batch`, group commit): each is
//! handled as its own message, and the delivery is acked once all of them are settled.
//!
//! Layout (each file adds methods to [`OrderConsumer`]; this file only declares them, so
//! imports run one way: `consume` → `delivery` → `headers`, `batch` → `delivery`, and all
//! of them → `message`):
//! - `consume` — the loop: connect under a [`seckill_messaging::Supervisor`], pause and
//!   resume with the breaker, gather deliveries into batches.
//! - `batch` — handling one batch: parse, write in one transaction, write buyers' results;
//!   after a panic (a bug), finish what the database holds and dead-letter the rest.
//! - `delivery` — what becomes of each delivery: ack, retry, dead letter or requeue, with
//!   retries and dead letters published through a confirmed publisher before the ack.
//! - `headers` — what a message's headers say (attempt, delivery count, request ids).
//! - `message` — what a delivery carries: one purchase's message or a batch's parts, and
//!   which parts are settled.

mod batch;
mod consume;
mod delivery;
mod headers;
mod message;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use sqlx::PgPool;

use seckill_messaging::{OrderSigner, Topology};
use seckill_store::RedisKeys;

use crate::orders;
use crate::retry::RetryPolicy;

/// Consumes accepted purchases and records them as orders.
#[derive(Clone)]
pub struct OrderConsumer {
    /// Where orders are written.
    pub db: PgPool,
    /// Where buyer results are written.
    pub redis: seckill_store::Redis,
    /// Key names.
    pub keys: RedisKeys,
    /// Products' bucket counts (fixed at creation), which place each buyer's result.
    pub buckets: moka::future::Cache<i64, u16>,
    /// Broker.
    pub amqp_url: String,
    /// Queue names.
    pub topology: Topology,
    /// Checks each message's signature: only what seckill-api signed becomes an order.
    pub signer: OrderSigner,
    /// Unacked deliveries at once.
    pub prefetch: u16,
    /// Most purchases gathered for one transaction (a delivery of several counts each; a
    /// batch delivery is never split, so one transaction may hold a little more).
    pub batch_size: usize,
    /// How long a batch waits for more messages after its first one.
    pub batch_linger: Duration,
    /// Retry tiers, cap and budget.
    pub retry: Arc<RetryPolicy>,
    /// The circuit breaker around the database.
    pub breaker: Arc<crate::breaker::CircuitBreaker>,
    /// How orders are written: the `lock_timeout` of their transactions (a message stuck
    /// behind a lock becomes a transient failure and a retry instead of a wait without end)
    /// and their payment window.
    pub write: orders::WriteOptions,
    /// Wait before requeueing after a transient failure, so an outage is not a busy loop.
    pub requeue_delay: Duration,
    /// True while consuming (read by `/readyz`).
    pub connected: Arc<AtomicBool>,
}

impl std::fmt::Debug for OrderConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderConsumer")
            .field("queue", &self.topology.queue)
            .finish_non_exhaustive()
    }
}
