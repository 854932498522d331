//! The RabbitMQ consumer: manual ack, bounded prefetch, batched writes.
//!
//! Deliveries are gathered into batches (up to `batch_size`, or whatever arrived within
//! `batch_linger` of the first) and each batch is written in one transaction
//! ([`orders::record_batch`]); several batches are in flight at once, bounded by prefetch.
//!
//! Every AMQP choice here protects "never lose an accepted purchase":
//! - manual ack, sent only after the batch's transaction committed and the buyers' results
//!   were written; a crash before that means redelivery, which the idempotent write absorbs;
//! - `prefetch` bounds unacked deliveries, and so the concurrent writes, per replica;
//! - a transient failure (database or Redis down) requeues the message after a delay,
//!   instead of acking or dead-lettering it;
//! - a permanent failure (unparseable body, unknown product, no stock in the database) is
//!   rejected without requeue, so the queue's dead-letter exchange keeps it for the operator.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::FieldTable;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use seckill_messaging::{HEADER_REQUEST_ID, OrderMessage, Topology};
use seckill_store::{PurchaseResult, RedisKeys};

use crate::orders::{self, Recorded};

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
    /// Unacked deliveries at once.
    pub prefetch: u16,
    /// Most messages written in one transaction.
    pub batch_size: usize,
    /// How long a batch waits for more messages after its first one.
    pub batch_linger: Duration,
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

impl OrderConsumer {
    /// Runs until `cancel`, reconnecting with backoff when the broker goes away.
    pub async fn run(self, cancel: CancellationToken) -> anyhow::Result<()> {
        let mut backoff = Duration::from_millis(200);
        while !cancel.is_cancelled() {
            match self.consume(&cancel).await {
                Ok(()) => break,
                Err(e) => {
                    self.connected.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        error = format!("{e:#}"),
                        ?backoff,
                        "order consumer interrupted"
                    );
                    metrics::counter!("order_consumer_interruptions_total").increment(1);
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        tracing::info!("order consumer stopped");
        Ok(())
    }

    async fn consume(&self, cancel: &CancellationToken) -> anyhow::Result<()> {
        let connection =
            seckill_messaging::connect(&self.amqp_url, "order-service", Duration::ZERO).await?;
        let channel = connection.create_channel().await?;
        self.topology
            .declare(&channel)
            .await
            .context("declare topology")?;
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .context("set prefetch")?;
        let tag = format!("order-service-{}", uuid::Uuid::new_v4().simple());
        let mut deliveries = channel
            .basic_consume(
                self.topology.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .context("start consuming")?;
        self.connected.store(true, Ordering::Relaxed);
        tracing::info!(queue = %self.topology.queue, prefetch = self.prefetch, "consuming");

        let mut in_flight = JoinSet::new();
        let mut batch: Vec<Delivery> = Vec::with_capacity(self.batch_size);
        // Far future while the batch is empty; first delivery + linger once it is not.
        let idle = || tokio::time::Instant::now() + Duration::from_secs(3600);
        let mut flush_at = idle();
        let ended = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        if batch.is_empty() {
                            flush_at = tokio::time::Instant::now() + self.batch_linger;
                        }
                        batch.push(delivery);
                        if batch.len() >= self.batch_size {
                            let full = std::mem::replace(&mut batch, Vec::with_capacity(self.batch_size));
                            in_flight.spawn(self.clone().settle_even_on_panic(full));
                            flush_at = idle();
                        }
                    }
                    Some(Err(e)) => break Err(anyhow::Error::from(e).context("delivery stream")),
                    None => break Err(anyhow::anyhow!("delivery stream ended")),
                },
                _ = tokio::time::sleep_until(flush_at), if !batch.is_empty() => {
                    let due = std::mem::replace(&mut batch, Vec::with_capacity(self.batch_size));
                    in_flight.spawn(self.clone().settle_even_on_panic(due));
                    flush_at = idle();
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    if let Err(e) = done {
                        tracing::error!(error = %e, "delivery task panicked");
                    }
                }
            }
        };
        if ended.is_ok() {
            // Stop new deliveries, then handle those the broker already pushed to us (the
            // stream ends after them), so a clean stop redelivers nothing.
            let _ = channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await;
            let buffered = async {
                while let Some(Ok(delivery)) = deliveries.next().await {
                    batch.push(delivery);
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), buffered)
                .await
                .is_err()
            {
                tracing::warn!("consumer did not end after cancel; the broker requeues the rest");
            }
        }
        if !batch.is_empty() {
            in_flight.spawn(self.clone().settle_even_on_panic(batch));
        }
        while in_flight.join_next().await.is_some() {}
        self.connected.store(false, Ordering::Relaxed);
        let _ = channel.close(200, "order-service stopping".into()).await;
        let _ = connection.close(200, "order-service stopping".into()).await;
        ended
    }

    /// Handles one batch; if that panics (a bug), dead-letters what it had not settled
    /// rather than leaving it unacked — lapin does not settle a dropped delivery, so it would
    /// hold a prefetch slot until the channel closes and then be redelivered into the same
    /// panic. (An acker already used refuses a second settlement, so settled ones are safe.)
    async fn settle_even_on_panic(self, batch: Vec<Delivery>) {
        let ackers: Vec<_> = batch.iter().map(|d| d.acker.clone()).collect();
        let handled = AssertUnwindSafe(self.handle_batch(batch))
            .catch_unwind()
            .await;
        if handled.is_err() {
            tracing::error!("order handler panicked, dead-lettering its batch");
            for acker in ackers {
                if acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .is_ok()
                {
                    metrics::counter!("orders_dead_lettered_total", "reason" => "panic")
                        .increment(1);
                }
            }
        }
    }

    /// Parses a batch, writes what parsed in one transaction, then settles each delivery.
    async fn handle_batch(&self, batch: Vec<Delivery>) {
        metrics::counter!("orders_consumed_total").increment(batch.len() as u64);
        let mut parsed = Vec::with_capacity(batch.len());
        for delivery in batch {
            match serde_json::from_slice::<OrderMessage>(&delivery.data) {
                Ok(msg) => parsed.push((delivery, msg)),
                Err(e) => {
                    let span = delivery_span(&delivery);
                    let _entered = span.enter();
                    tracing::error!(error = %e, "unparseable order message, dead-lettering");
                    metrics::counter!("orders_dead_lettered_total", "reason" => "unparseable")
                        .increment(1);
                    let _ = delivery.reject(BasicRejectOptions { requeue: false }).await;
                }
            }
        }
        if parsed.is_empty() {
            return;
        }
        let msgs: Vec<OrderMessage> = parsed.iter().map(|(_, msg)| msg.clone()).collect();
        metrics::histogram!("orders_batch_size").record(msgs.len() as f64);
        let started = std::time::Instant::now();
        let recorded = orders::record_batch(&self.db, &msgs).await;
        metrics::histogram!("order_write_seconds").record(started.elapsed().as_secs_f64());
        match recorded {
            Ok(outcomes) => {
                let settles = parsed
                    .into_iter()
                    .zip(outcomes)
                    .map(|((delivery, msg), outcome)| self.settle(delivery, msg, outcome));
                futures_util::future::join_all(settles).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, count = msgs.len(), "order batch failed, requeueing");
                let requeues = parsed.iter().map(|(delivery, _)| self.requeue(delivery));
                futures_util::future::join_all(requeues).await;
            }
        }
    }

    /// Writes the buyer's result for one written message, then acks or dead-letters it.
    async fn settle(&self, delivery: Delivery, msg: OrderMessage, outcome: Recorded) {
        let span = delivery_span(&delivery);
        let (result, settle) = match outcome {
            Recorded::Created { order_id } => {
                metrics::counter!("orders_created_total").increment(1);
                (PurchaseResult::Success { order_id }, Settle::Ack)
            }
            Recorded::Duplicate { order_id } => {
                metrics::counter!("orders_duplicates_total").increment(1);
                (PurchaseResult::Success { order_id }, Settle::Ack)
            }
            Recorded::Rejected { reason } => {
                span.in_scope(|| {
                    tracing::error!(
                        reason,
                        user_id = msg.user_id,
                        product_id = msg.product_id,
                        "order rejected, dead-lettering"
                    )
                });
                metrics::counter!("orders_dead_lettered_total", "reason" => reason).increment(1);
                let reason = reason.to_string();
                (PurchaseResult::Failed { reason }, Settle::DeadLetter)
            }
        };
        if let Err(e) = self.write_result(&msg, &result).await {
            // The order is committed; redelivery will find it and write the result again.
            span.in_scope(|| tracing::warn!(error = %e, "result write failed, requeueing"));
            self.requeue(&delivery).await;
            return;
        }
        let settled = match settle {
            Settle::Ack => delivery.ack(BasicAckOptions::default()).await,
            Settle::DeadLetter => delivery.reject(BasicRejectOptions { requeue: false }).await,
        };
        if let Err(e) = settled {
            // The channel died: the broker will redeliver, and the write is idempotent.
            span.in_scope(|| tracing::warn!(error = %e, "could not settle delivery"));
        }
    }

    async fn requeue(&self, delivery: &Delivery) {
        metrics::counter!("orders_requeued_total").increment(1);
        tokio::time::sleep(self.requeue_delay).await;
        let options = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        if let Err(e) = delivery.nack(options).await {
            tracing::warn!(error = %e, "could not requeue delivery");
        }
    }

    /// How many buckets the product's stock is split into; 1 for an unknown product (its
    /// purchase was never accepted in Redis, so any key will do for its `failed` result).
    async fn bucket_count(&self, product_id: i64) -> anyhow::Result<u16> {
        let db = self.db.clone();
        self.buckets
            .try_get_with(product_id, async move {
                let buckets: Option<i16> =
                    sqlx::query_scalar("SELECT stock_buckets FROM products WHERE id = $1")
                        .bind(product_id)
                        .fetch_optional(&db)
                        .await?;
                Ok::<u16, sqlx::Error>(buckets.and_then(|b| u16::try_from(b).ok()).unwrap_or(1))
            })
            .await
            .map_err(|e| anyhow::anyhow!("bucket count of product {product_id}: {e}"))
    }

    async fn write_result(
        &self,
        msg: &OrderMessage,
        result: &PurchaseResult,
    ) -> anyhow::Result<()> {
        let buckets = self.bucket_count(msg.product_id).await?;
        let mut conn = self.redis.get().await?;
        redis::cmd("HSET")
            .arg(self.keys.result_of(msg.product_id, buckets, msg.user_id))
            .arg(msg.user_id)
            .arg(result.encode())
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
}

enum Settle {
    Ack,
    DeadLetter,
}

/// A span naming the delivery's message id and the purchase's HTTP request id, so one id
/// follows a purchase from the gateway to its order in the logs.
fn delivery_span(delivery: &Delivery) -> tracing::Span {
    let properties = &delivery.properties;
    let message_id = properties
        .message_id()
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    let request_id = properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(HEADER_REQUEST_ID))
        .and_then(|v| v.as_long_string())
        .map(|s| s.to_string())
        .unwrap_or_default();
    tracing::info_span!("delivery", message_id, request_id)
}
