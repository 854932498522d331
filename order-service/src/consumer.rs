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
//! - failures are sorted by [`crate::retry`]: an outage requeues after a delay (no attempt
//!   counted), a transient failure of the message goes to a retry tier, a permanent one to
//!   the dead-letter exchange with its reason; a retry or dead letter is published with a
//!   confirm *before* the original is acked, so a crash in between duplicates, never loses;
//! - a delivery is handed back to the queue at most [`MAX_REQUEUES`] times: one the quorum
//!   queue has already returned that often (`x-delivery-count`) is published again as a
//!   fresh copy instead, so a long outage never brings a message to the queue's delivery
//!   limit, which is left to messages that crash their consumer (see
//!   `seckill_messaging::DELIVERY_LIMIT`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions,
};
use lapin::types::FieldTable;
use sqlx::PgPool;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use lapin::types::{AMQPValue, ShortString};
use lapin::{BasicProperties, Channel};

use seckill_messaging::{
    HEADER_ATTEMPT, HEADER_DELIVERY_COUNT, HEADER_ERROR_CODE, HEADER_ERROR_MESSAGE,
    HEADER_REQUEST_ID, MAX_REQUEUES, OrderMessage, Topology,
};
use seckill_store::{PurchaseResult, RedisKeys};

use crate::ack_window::AckWindow;
use crate::orders::{self, Recorded};
use crate::retry::{Next, RetryPolicy};

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
        // Retries and dead letters are published with confirms, on a channel of their own
        // (confirm mode would also apply to nothing else here, but keeps the two apart).
        let publisher = connection.create_channel().await?;
        publisher
            .confirm_select(Default::default())
            .await
            .context("enable publisher confirms")?;
        self.connected.store(true, Ordering::Relaxed);
        let out = Out {
            publisher: publisher.clone(),
            one_publish: Arc::new(tokio::sync::Mutex::new(())),
            acks: Arc::new(AckWindow::new(channel.clone())),
        };

        let mut in_flight = JoinSet::new();
        let mut changes = self.breaker.subscribe();
        let ended = loop {
            // Paused while the breaker refuses calls: nothing is taken from the queue.
            if self.breaker.state().pauses() {
                tracing::warn!("circuit breaker open: consumer paused");
                metrics::gauge!("order_consumer_paused").set(1.0);
                while self.breaker.state().pauses() {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = changes.changed() => {}
                    }
                }
                metrics::gauge!("order_consumer_paused").set(0.0);
                if cancel.is_cancelled() {
                    break Ok(());
                }
                tracing::info!("consumer resumed");
            }
            // Half-open takes one batch at a time (its trial calls), not a full prefetch
            // that would mostly be handed back; prefetch applies to consumers created after.
            let trial = self.breaker.state() == crate::breaker::State::HalfOpen;
            let prefetch = if trial {
                u16::try_from(self.batch_size).unwrap_or(u16::MAX)
            } else {
                self.prefetch
            };
            if let Err(e) = channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
            {
                break Err(anyhow::Error::from(e).context("set prefetch"));
            }
            match self
                .consume_until_paused(&channel, &out, &mut in_flight, &mut changes, cancel)
                .await
            {
                Ok(Run::Paused | Run::Restart) => continue,
                Ok(Run::Stopped) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        while in_flight.join_next().await.is_some() {}
        self.connected.store(false, Ordering::Relaxed);
        let _ = publisher.close(200, "order-service stopping".into()).await;
        let _ = channel.close(200, "order-service stopping".into()).await;
        let _ = connection.close(200, "order-service stopping".into()).await;
        ended
    }

    /// Consumes (batching deliveries) until the breaker pauses it, `cancel`, or an error.
    /// On a pause or a stop the broker consumer is cancelled first; what the broker had
    /// already pushed is handed back to the queue (pause) or handled (stop), so a clean stop
    /// redelivers nothing and a pause keeps everything in the queue.
    async fn consume_until_paused(
        &self,
        channel: &Channel,
        out: &Out,
        in_flight: &mut JoinSet<()>,
        changes: &mut tokio::sync::watch::Receiver<crate::breaker::State>,
        cancel: &CancellationToken,
    ) -> anyhow::Result<Run> {
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
        tracing::info!(queue = %self.topology.queue, prefetch = self.prefetch, "consuming");
        let mut batch: Vec<Delivery> = Vec::with_capacity(self.batch_size);
        // Far future while the batch is empty; first delivery + linger once it is not.
        let idle = || tokio::time::Instant::now() + Duration::from_secs(3600);
        let mut flush_at = idle();
        let trial = self.breaker.state() == crate::breaker::State::HalfOpen;
        // The confirm channel can close on its own (a channel error, such as publishing to
        // an exchange deleted under us) while this one consumes on: every retry and dead
        // letter would then fail and be requeued, forever. Checked every second; reconnecting
        // declares the topology again.
        let mut publisher_check = tokio::time::interval(Duration::from_secs(1));
        let ended = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Ok(Run::Stopped),
                _ = publisher_check.tick() => {
                    if !out.publisher.status().connected() {
                        break Err(anyhow::anyhow!("the publisher channel closed"));
                    }
                }
                _ = changes.changed() => {
                    let state = self.breaker.state();
                    if state.pauses() {
                        break Ok(Run::Paused);
                    }
                    if trial != (state == crate::breaker::State::HalfOpen) {
                        // Half-open ended (or began): consume again with the right prefetch.
                        break Ok(Run::Restart);
                    }
                }
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        out.acks.delivered(delivery.delivery_tag).await;
                        if batch.is_empty() {
                            flush_at = tokio::time::Instant::now() + self.batch_linger;
                        }
                        batch.push(delivery);
                        if batch.len() >= self.batch_size {
                            let full = std::mem::replace(&mut batch, Vec::with_capacity(self.batch_size));
                            in_flight.spawn(self.clone().settle_even_on_panic(full, out.clone()));
                            flush_at = idle();
                        }
                    }
                    Some(Err(e)) => break Err(anyhow::Error::from(e).context("delivery stream")),
                    None => break Err(anyhow::anyhow!("delivery stream ended")),
                },
                _ = tokio::time::sleep_until(flush_at), if !batch.is_empty() => {
                    let due = std::mem::replace(&mut batch, Vec::with_capacity(self.batch_size));
                    in_flight.spawn(self.clone().settle_even_on_panic(due, out.clone()));
                    flush_at = idle();
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    if let Err(e) = done {
                        tracing::error!(error = %e, "delivery task panicked");
                    }
                }
            }
        };
        let mut ended = ended;
        if ended.is_ok() {
            // Stop new deliveries; the stream ends after those the broker already pushed.
            let _ = channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await;
            let buffered = async {
                while let Some(Ok(delivery)) = deliveries.next().await {
                    out.acks.delivered(delivery.delivery_tag).await;
                    batch.push(delivery);
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), buffered)
                .await
                .is_err()
            {
                // Deliveries still unread are unknown to the ack window: on this channel the
                // next consumer's coalesced ack would cover them unprocessed. Ending with an
                // error closes the channel, and the broker requeues them.
                tracing::warn!("consumer did not end after cancel; closing its channel");
                ended = Err(anyhow::anyhow!(
                    "consumer did not end within 5 s of its cancel"
                ));
            }
        }
        match ended {
            Ok(Run::Paused) => {
                for delivery in &batch {
                    self.hand_back(out, delivery).await;
                }
            }
            _ if !batch.is_empty() => {
                in_flight.spawn(self.clone().settle_even_on_panic(batch, out.clone()));
            }
            _ => {}
        }
        ended
    }

    /// Handles one batch; if that panics (a bug), dead-letters what it had not settled
    /// rather than leaving it unacked — lapin does not settle a dropped delivery, so it would
    /// hold a prefetch slot until the channel closes and then be redelivered into the same
    /// panic. Only deliveries still in hand are rejected: one the batch already finished may
    /// be awaiting its (coalesced) ack, and its order is written.
    async fn settle_even_on_panic(self, batch: Vec<Delivery>, out: Out) {
        let ackers: Vec<_> = batch
            .iter()
            .map(|d| (d.delivery_tag, d.acker.clone()))
            .collect();
        let handled = AssertUnwindSafe(self.handle_batch(batch, &out))
            .catch_unwind()
            .await;
        if handled.is_err() {
            tracing::error!("order handler panicked, dead-lettering its batch");
            let tags: Vec<u64> = ackers.iter().map(|(tag, _)| *tag).collect();
            let unsettled = out.acks.still_in_hand(&tags).await;
            for (tag, acker) in ackers {
                if !unsettled.contains(&tag) {
                    continue;
                }
                if acker
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .is_ok()
                {
                    metrics::counter!("orders_dead_lettered_total", "reason" => "panic")
                        .increment(1);
                }
                out.acks.settled_elsewhere(tag).await;
            }
        }
    }

    /// Parses a batch, writes what parsed in one transaction, then settles each delivery.
    async fn handle_batch(&self, batch: Vec<Delivery>, out: &Out) {
        let Some(permit) = self.breaker.try_acquire() else {
            // The breaker is refusing calls (the consumer is pausing, or half-open has all
            // the trial calls it allows): hand the batch back, no attempt counted.
            let requeues = batch.iter().map(|delivery| self.requeue(out, delivery));
            futures_util::future::join_all(requeues).await;
            return;
        };
        metrics::counter!("orders_consumed_total").increment(batch.len() as u64);
        let first = batch.iter().filter(|d| attempt_of(d) == 0).count();
        self.retry.record_first_attempts(first);
        let mut parsed = Vec::with_capacity(batch.len());
        for delivery in batch {
            match serde_json::from_slice::<OrderMessage>(&delivery.data) {
                Ok(msg) => parsed.push((delivery, msg)),
                Err(e) => {
                    let span = delivery_span(&delivery);
                    let _entered = span.enter();
                    tracing::error!(error = %e, "unparseable order message, dead-lettering");
                    self.dead_letter(out, &delivery, "unparseable", &e.to_string())
                        .await;
                }
            }
        }
        if parsed.is_empty() {
            return;
        }
        let msgs: Vec<OrderMessage> = parsed.iter().map(|(_, msg)| msg.clone()).collect();
        metrics::histogram!("orders_batch_size").record(msgs.len() as f64);
        let started = std::time::Instant::now();
        let recorded = orders::record_batch(&self.db, &msgs, self.write).await;
        metrics::histogram!("order_write_seconds").record(started.elapsed().as_secs_f64());
        // Only the database being unavailable counts against it; a message's own trouble
        // (a lock timeout) does not.
        let unavailable = matches!(&recorded, Err(e) if orders::is_database_unavailable(e));
        self.breaker.record(permit, unavailable);
        match recorded {
            Ok(outcomes) => {
                let settles = parsed
                    .into_iter()
                    .zip(outcomes)
                    .map(|((delivery, msg), outcome)| self.settle(out, delivery, msg, outcome));
                futures_util::future::join_all(settles).await;
            }
            Err(e) if !orders::is_database_unavailable(&e) => {
                tracing::warn!(error = %e, count = msgs.len(), "order batch failed, retrying");
                let error = e.to_string();
                let retries = parsed.iter().map(|(delivery, _)| {
                    self.retry_later(out, delivery, &error, Exhausted::DeadLetter)
                });
                futures_util::future::join_all(retries).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, count = msgs.len(), "database unavailable, requeueing");
                let requeues = parsed
                    .iter()
                    .map(|(delivery, _)| self.requeue(out, delivery));
                futures_util::future::join_all(requeues).await;
            }
        }
    }

    /// Writes the buyer's result for one written message, then acks or dead-letters it.
    async fn settle(&self, out: &Out, delivery: Delivery, msg: OrderMessage, outcome: Recorded) {
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
            Recorded::Cancelled { order_id } => {
                // Its result was written when it was cancelled, and the buyer may have bought
                // again since: whatever this copy wrote could only be stale.
                metrics::counter!("orders_duplicates_total").increment(1);
                span.in_scope(|| {
                    tracing::info!(order_id, "copy of a cancelled purchase, nothing to do")
                });
                out.acks.ack(delivery.delivery_tag).await;
                return;
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
                let reason = reason.to_string();
                (PurchaseResult::Failed { reason }, Settle::DeadLetter)
            }
        };
        if let Err(e) = self.write_result(&msg, &result).await {
            span.in_scope(|| tracing::warn!(error = %e, "result write failed"));
            if matches!(settle, Settle::Ack) {
                // The order is committed: a retry (counted, through the tiers) finds it and
                // writes the result again; past the last one the order stands and the
                // message is acked, its buyer's result left to the next write.
                self.retry_later(out, &delivery, &e.to_string(), Exhausted::OrderStands)
                    .await;
                return;
            }
            // A rejected purchase is dead-lettered all the same: giving it up (an operator's
            // ignore) writes its buyer's result.
        }
        match (settle, result) {
            (Settle::DeadLetter, PurchaseResult::Failed { reason }) => {
                self.dead_letter(out, &delivery, &reason, "rejected by the database")
                    .await;
            }
            // Acked with the run of finished deliveries it belongs to.
            _ => out.acks.ack(delivery.delivery_tag).await,
        }
    }

    /// Sends a message that failed transiently to its next retry tier (or, past the cap, as
    /// `exhausted` says), then acks the original.
    async fn retry_later(&self, out: &Out, delivery: &Delivery, error: &str, exhausted: Exhausted) {
        let attempt = attempt_of(delivery);
        match self.retry.next(attempt) {
            Next::GiveUp if exhausted == Exhausted::OrderStands => {
                metrics::counter!("orders_results_abandoned_total").increment(1);
                tracing::error!(
                    error,
                    "the buyer's result could not be written after every retry; the order stands"
                );
                out.acks.ack(delivery.delivery_tag).await;
            }
            Next::GiveUp => {
                self.dead_letter(out, delivery, "retries_exhausted", error)
                    .await;
            }
            Next::Retry { delay_ms, attempt } => {
                let routing_key = Topology::retry_routing_key(delay_ms);
                let headers = [
                    (HEADER_ATTEMPT, AMQPValue::LongInt(attempt as i32)),
                    (HEADER_ERROR_MESSAGE, AMQPValue::LongString(error.into())),
                ];
                let published = self
                    .republish(
                        out,
                        &self.topology.retry_exchange,
                        &routing_key,
                        delivery,
                        &headers,
                    )
                    .await;
                if published {
                    metrics::counter!("orders_retried_total", "tier" => format!("{delay_ms}ms"))
                        .increment(1);
                    out.acks.ack(delivery.delivery_tag).await;
                } else {
                    self.requeue(out, delivery).await;
                }
            }
        }
    }

    /// Publishes the message to the dead-letter exchange with its reason, then acks the
    /// original; if that publish fails, rejects it into the same exchange without a reason.
    async fn dead_letter(&self, out: &Out, delivery: &Delivery, code: &str, error: &str) {
        metrics::counter!("orders_dead_lettered_total", "reason" => code.to_string()).increment(1);
        let headers = [
            (HEADER_ERROR_CODE, AMQPValue::LongString(code.into())),
            (HEADER_ERROR_MESSAGE, AMQPValue::LongString(error.into())),
            (
                HEADER_ATTEMPT,
                AMQPValue::LongInt(attempt_of(delivery) as i32),
            ),
        ];
        let exchange = &self.topology.dead_letter_exchange;
        if self.republish(out, exchange, "", delivery, &headers).await {
            out.acks.ack(delivery.delivery_tag).await;
        } else {
            let _ = delivery.reject(BasicRejectOptions { requeue: false }).await;
            out.acks.settled_elsewhere(delivery.delivery_tag).await;
        }
    }

    /// Publishes a copy of `delivery` (body and properties, plus `headers`) and waits for
    /// the broker's confirm; false unless it was confirmed and routed to a queue.
    async fn republish(
        &self,
        out: &Out,
        exchange: &str,
        routing_key: &str,
        delivery: &Delivery,
        headers: &[(&str, AMQPValue)],
    ) -> bool {
        // The copy is a new message to its queue: the original's delivery count, kept,
        // would read as the copy's own.
        let mut table: FieldTable = delivery
            .properties
            .headers()
            .iter()
            .flat_map(|h| h.inner())
            .filter(|(name, _)| name.as_str() != HEADER_DELIVERY_COUNT)
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect::<std::collections::BTreeMap<_, _>>()
            .into();
        for (name, value) in headers {
            table.insert(ShortString::from(*name), value.clone());
        }
        let properties: BasicProperties = delivery.properties.clone().with_headers(table);
        let _one = out.one_publish.lock().await;
        let published = out
            .publisher
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                lapin::options::BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &delivery.data,
                properties,
            )
            .await;
        let confirmation = match published {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        let refused = match confirmation {
            Ok(confirmation) => match seckill_messaging::taken(&confirmation) {
                Ok(()) => return true,
                Err(refused) => refused.to_string(),
            },
            Err(e) => e.to_string(),
        };
        tracing::warn!(error = refused, exchange, routing_key, "republish failed");
        false
    }

    /// Hands a delivery back to the queue after `requeue_delay`, no attempt counted.
    async fn requeue(&self, out: &Out, delivery: &Delivery) {
        tokio::time::sleep(self.requeue_delay).await;
        self.hand_back(out, delivery).await;
    }

    /// Returns a delivery to the queue: a nack with requeue, or past [`MAX_REQUEUES`]
    /// returns a fresh copy published to the queue (its delivery count starts over) and the
    /// original acked. Should that publish fail, the nack it is.
    async fn hand_back(&self, out: &Out, delivery: &Delivery) {
        metrics::counter!("orders_requeued_total").increment(1);
        if delivery_count(delivery) >= MAX_REQUEUES {
            let recycled = self
                .republish(
                    out,
                    &self.topology.exchange,
                    &self.topology.routing_key,
                    delivery,
                    &[],
                )
                .await;
            if recycled {
                metrics::counter!("orders_recycled_total").increment(1);
                out.acks.ack(delivery.delivery_tag).await;
                return;
            }
        }
        let options = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        if let Err(e) = delivery.nack(options).await {
            tracing::warn!(error = %e, "could not requeue delivery");
        }
        out.acks.settled_elsewhere(delivery.delivery_tag).await;
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

/// Where a batch settles its deliveries: the confirm channel for retries and dead letters,
/// and the consuming channel's ack window.
#[derive(Clone)]
struct Out {
    publisher: Channel,
    /// Held from a publish until its confirm: lapin credits a returned (unroutable) message
    /// to whichever confirm resolves next, and one `ack multiple` resolves several in no
    /// fixed order, so with two publishes pending a return could be read as the other's
    /// and an unrouted copy's original acked. Retries, dead letters and recycled copies
    /// are the rare path; one at a time costs nothing that matters.
    one_publish: Arc<tokio::sync::Mutex<()>>,
    acks: Arc<AckWindow>,
}

/// How a consuming run ended.
enum Run {
    /// The breaker opened.
    Paused,
    /// The breaker left (or entered) half-open: consume again with its prefetch.
    Restart,
    /// Cancelled.
    Stopped,
}

enum Settle {
    Ack,
    DeadLetter,
}

/// What a message that ran out of retries becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exhausted {
    /// A dead letter with reason `retries_exhausted`.
    DeadLetter,
    /// Acked: its order is written, only its buyer's result could not be.
    OrderStands,
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

/// The attempt a delivery carries (0 for a first delivery).
fn attempt_of(delivery: &Delivery) -> u32 {
    count_header(delivery, HEADER_ATTEMPT)
}

/// How often the queue has returned this delivery before (a quorum queue's count; 0 on a
/// classic queue, which keeps none).
fn delivery_count(delivery: &Delivery) -> u32 {
    count_header(delivery, HEADER_DELIVERY_COUNT)
}

/// A numeric header of a delivery, 0 when absent or not a count.
fn count_header(delivery: &Delivery, name: &str) -> u32 {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name))
        .and_then(|v| match v {
            AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
            AMQPValue::ShortInt(n) => u32::try_from(*n).ok(),
            AMQPValue::LongUInt(n) => Some(*n),
            _ => None,
        })
        .unwrap_or(0)
}
