//! Handling one batch of deliveries: parse the messages they carry (a delivery may be a
//! batch of purchases itself), write what parsed in one transaction, then finish each
//! message by what the write said (`super::delivery`).

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use lapin::options::BasicRejectOptions;
use tracing::Instrument as _;

use seckill_messaging::{DELIVERY_LIMIT, OrderMessage};
use seckill_store::{PurchaseResult, postgres};

use super::OrderConsumer;
use super::delivery::{Exhausted, Out};
use super::headers::{
    attempt_of, delivery_count, delivery_span, retried_at, signature_of, trace_of,
};
use super::message::{Msg, Pending, Received};
use crate::metrics as names;
use crate::orders;

impl OrderConsumer {
    /// Handles one batch. If that panics (a bug), what it had not settled is settled here
    /// rather than left unacked — lapin does not settle a dropped delivery, so it would hold a
    /// prefetch slot until the channel closes and then be redelivered into the same panic.
    /// The panic may have come after the batch's transaction committed: each delivery whose
    /// purchase the database now holds is finished as a redelivery of it would be (its
    /// buyer's result written, acked), and only the others are dead-lettered. Deliveries the
    /// batch already finished are left alone: one may be awaiting its (coalesced) ack.
    pub(super) async fn handle_even_on_panic(self, batch: Vec<Received>, out: Out) {
        // At most prefetch / batch_size batches write at once; the others wait their turn
        // with their deliveries in hand (reported, so the fence sees them).
        let Ok(_writing) = out.writers.clone().acquire_owned().await else {
            return;
        };
        let tags: Vec<u64> = batch.iter().map(Received::tag).collect();
        let mut kept = Vec::with_capacity(batch.len());
        for received in batch {
            // One crash short of the delivery limit, the broker would dead-letter it itself
            // should this one crash too: its purchases' transit is noted first
            // (`crate::in_flight`), or it goes back to the queue.
            if delivery_count(&received.delivery.properties) + 1 >= DELIVERY_LIMIT
                && !self.note_all_passing_on(&received.messages()).await
            {
                self.requeue_delivery(&out, &received).await;
            } else {
                kept.push(received);
            }
        }
        let batch = kept;
        let messages: Vec<Msg<'_>> = batch.iter().flat_map(Received::messages).collect();
        let handled = AssertUnwindSafe(self.handle_batch(&messages, &out))
            .catch_unwind()
            .await;
        if handled.is_ok() {
            out.holdings.released(&tags);
            return;
        }
        tracing::error!("order handler panicked; finishing what it wrote, dead-lettering the rest");
        // A batch whose parts were all settled may have lost its own ack or nack with the
        // panic: send it now. One this ledger does not know is taken as wholly unsettled.
        let unsettled = out.acks.still_in_hand(&tags).await;
        for received in batch
            .iter()
            .filter(|r| r.part_count() > 0 && unsettled.contains(&r.tag()))
        {
            match out.parts.pending(received.tag()) {
                Pending::Whole(whole) => {
                    self.settle_whole(&out, &received.delivery, whole).await;
                }
                Pending::Unknown => out.parts.open(received.tag(), received.part_count()),
                Pending::Parts(_) => {}
            }
        }
        let unsettled = out.acks.still_in_hand(&tags).await;
        let in_hand: Vec<Msg<'_>> = batch
            .iter()
            .filter(|r| unsettled.contains(&r.tag()))
            .flat_map(|r| r.unsettled(&out.parts))
            .collect();
        let finished = AssertUnwindSafe(self.finish_committed(&in_hand, &out))
            .catch_unwind()
            .await;
        if finished.is_err() {
            tracing::error!("finishing a panicked batch panicked too, dead-lettering the rest");
        }
        let unsettled = out.acks.still_in_hand(&tags).await;
        for received in batch.iter().filter(|r| unsettled.contains(&r.tag())) {
            for message in received.unsettled(&out.parts) {
                if message.part.is_some() {
                    if out.parts.going_back(message.tag()) {
                        // Its batch goes back to the queue whole anyway: this part with it.
                        self.hand_back(&out, message).await;
                    } else {
                        // A part goes to the dead-letter exchange as its own message.
                        self.dead_letter(&out, message, "panic", "its handler panicked")
                            .await;
                    }
                    continue;
                }
                let delivery = message.delivery;
                if !self.note_passing_on(message).await {
                    self.hand_back_delivery(&out, delivery).await;
                    continue;
                }
                if delivery
                    .reject(BasicRejectOptions { requeue: false })
                    .await
                    .is_ok()
                {
                    metrics::counter!(names::ORDERS_DEAD_LETTERED, "reason" => "panic")
                        .increment(1);
                } else {
                    metrics::counter!(names::ORDERS_ACK_FAILURES).increment(1);
                }
                out.acks.settled_elsewhere(delivery.delivery_tag).await;
            }
        }
        let still = out.acks.still_in_hand(&tags).await;
        for tag in tags.iter().filter(|tag| !still.contains(tag)) {
            out.parts.forget(*tag);
        }
        out.holdings.released(&tags);
    }

    /// After a panic: finishes each message of `in_hand` whose purchase the database holds
    /// (its live order: the buyer's result is written and it is acked; its cancelled one: it
    /// is acked), as [`Self::handle_batch`] would have had its answer not been lost. It trusts
    /// a message as that does: only once its signature verifies and its body parses. The
    /// others, and all of them if the database cannot say, stay in hand.
    async fn finish_committed(&self, in_hand: &[Msg<'_>], out: &Out) {
        let trusted: Vec<(Msg<'_>, OrderMessage)> = in_hand
            .iter()
            .filter(|m| {
                self.signer
                    .verify(m.data, signature_of(m.properties))
                    .is_ok()
            })
            .filter_map(|m| Some((*m, serde_json::from_slice::<OrderMessage>(m.data).ok()?)))
            .collect();
        if trusted.is_empty() {
            return;
        }
        let request_ids: Vec<uuid::Uuid> = trusted.iter().map(|(_, msg)| msg.request_id).collect();
        let written = match orders::written(&self.db, &request_ids).await {
            Ok(written) => written,
            Err(e) => {
                tracing::error!(error = %e, "could not tell which purchases a panicked batch wrote");
                return;
            }
        };
        let finishes = trusted.into_iter().filter_map(|(message, msg)| {
            let outcome = written.get(&msg.request_id)?.clone();
            Some(
                self.finish_written(out, message, msg, outcome)
                    .instrument(delivery_span(message.properties)),
            )
        });
        futures_util::future::join_all(finishes).await;
    }

    /// Parses a batch's messages, writes what parsed in one transaction, then settles each.
    async fn handle_batch(&self, batch: &[Msg<'_>], out: &Out) {
        let Some(permit) = self.breaker.try_acquire() else {
            // The breaker is refusing calls (the consumer is pausing, or half-open has all
            // the trial calls it allows): hand the batch back, no attempt counted.
            let requeues = batch.iter().map(|delivery| self.requeue(out, *delivery));
            futures_util::future::join_all(requeues).await;
            return;
        };
        metrics::counter!(names::ORDERS_CONSUMED).increment(batch.len() as u64);
        observe_retry_latency(batch);
        let first = batch
            .iter()
            .filter(|d| attempt_of(d.properties) == 0)
            .count();
        self.retry.record_first_attempts(first);
        let mut parsed = Vec::with_capacity(batch.len());
        // Each message's consume span, in its own trace; the batch's span links to them.
        let mut spans = Vec::with_capacity(batch.len());
        let batch_span =
            tracing::info_span!("order.batch", service = "order-service", size = batch.len());
        for &delivery in batch {
            let span = delivery_span(delivery.properties);
            if let Some(trace) = trace_of(delivery.properties) {
                seckill_telemetry::link(&batch_span, &trace);
            }
            // Checked before the body is read at all: an unsigned or forged message is
            // nobody's purchase, and no retry can make it one.
            if let Err(e) = self
                .signer
                .verify(delivery.data, signature_of(delivery.properties))
            {
                span.in_scope(|| {
                    tracing::error!(error = %e, reason = e.code(), "order message refused, dead-lettering");
                });
                self.dead_letter(out, delivery, e.code(), &e.to_string())
                    .instrument(span)
                    .await;
                continue;
            }
            if signature_of(delivery.properties).is_none() {
                // Let through by `accept_unsigned` (an upgrade under way).
                metrics::counter!("orders_unsigned_accepted_total").increment(1);
            }
            match serde_json::from_slice::<OrderMessage>(delivery.data) {
                Ok(msg) => {
                    parsed.push((delivery, msg));
                    spans.push(span);
                }
                Err(e) => {
                    span.in_scope(|| {
                        tracing::error!(error = %e, "unparseable order message, dead-lettering");
                    });
                    self.dead_letter(out, delivery, "unparseable", &e.to_string())
                        .instrument(span)
                        .await;
                }
            }
        }
        if parsed.is_empty() {
            return;
        }
        let msgs: Vec<OrderMessage> = parsed.iter().map(|(_, msg)| msg.clone()).collect();
        // First deliveries only: a retry's age includes its wait in the tiers by design.
        observe_lag(
            parsed
                .iter()
                .filter(|(delivery, _)| attempt_of(delivery.properties) == 0)
                .map(|(_, msg)| msg),
        );
        metrics::histogram!("orders_batch_size").record(msgs.len() as f64);
        let started = std::time::Instant::now();
        // One insert span per message, in its own trace, lasting the batch's transaction:
        // made for the exporter only (no line is emitted inside one), not per purchase for
        // nothing when spans are not exported.
        let inserts: Vec<tracing::Span> = if seckill_telemetry::exporting() {
            parsed
                .iter()
                .zip(&spans)
                .map(|((_, msg), consume)| {
                    tracing::info_span!(parent: consume, "order.insert", service = "order-service", request_id = %msg.request_id)
                })
                .collect()
        } else {
            Vec::new()
        };
        let recorded = orders::record_batch(&self.db, &msgs, self.write)
            .instrument(batch_span)
            .await;
        drop(inserts);
        metrics::histogram!("order_write_seconds").record(started.elapsed().as_secs_f64());
        // Only the database being unavailable (it cannot be reached, is shutting down or out
        // of resources) counts against it; a message's own trouble (a lock timeout, a
        // deadlock) does not. An unavailable database is not the messages' fault either: they
        // wait in the queue without an attempt counted. Every other error counts an attempt
        // and goes through the retry tiers to a dead letter if it persists — a lock timeout
        // or a deadlock, but also an error nobody foresaw — so no message is requeued forever.
        let unavailable = matches!(&recorded, Err(e) if postgres::is_unavailable(e));
        self.breaker.record(permit, unavailable);
        match recorded {
            Ok(outcomes) => {
                let settles = parsed.into_iter().zip(outcomes).zip(spans).map(
                    |(((delivery, msg), outcome), span)| {
                        self.finish_written(out, delivery, msg, outcome)
                            .instrument(span)
                    },
                );
                futures_util::future::join_all(settles).await;
            }
            Err(e) if !postgres::is_unavailable(&e) => {
                tracing::warn!(error = %e, count = msgs.len(), "order batch failed, retrying");
                let error = e.to_string();
                let retries = parsed.iter().zip(&spans).map(|((delivery, _), span)| {
                    self.retry_later(out, *delivery, &error, Exhausted::DeadLetter)
                        .instrument(span.clone())
                });
                futures_util::future::join_all(retries).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, count = msgs.len(), "database unavailable, requeueing");
                let requeues = parsed.iter().zip(&spans).map(|((delivery, _), span)| {
                    self.requeue(out, *delivery).instrument(span.clone())
                });
                futures_util::future::join_all(requeues).await;
            }
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

    /// Writes the buyer's result where their purchase's bucket keeps it.
    pub(super) async fn write_result(
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

/// Sets `orders_consumer_lag_seconds`: how long ago the oldest purchase among this batch's
/// first deliveries was accepted. Retries are left out (their age includes the tier's
/// delay, which is no backlog); a batch of retries only leaves the gauge as it was.
fn observe_lag<'a>(msgs: impl Iterator<Item = &'a OrderMessage>) {
    let now = chrono::Utc::now();
    let Some(lag) = msgs
        .map(|msg| (now - msg.created_at).num_milliseconds())
        .max()
    else {
        return;
    };
    metrics::gauge!(names::ORDERS_CONSUMER_LAG).set(lag.max(0) as f64 / 1000.0);
}

/// Records `orders_retry_latency_seconds` for each delivery coming back from a retry tier:
/// from its publish to the tier until now.
fn observe_retry_latency(batch: &[Msg<'_>]) {
    let now_ms = chrono::Utc::now().timestamp_millis();
    for (retried_at_ms, delay_ms) in batch.iter().filter_map(|m| retried_at(m.properties)) {
        let waited = (now_ms - retried_at_ms).max(0) as f64 / 1000.0;
        metrics::histogram!(names::ORDERS_RETRY_LATENCY, "tier" => names::tier_label(delay_ms))
            .record(waited);
    }
}

#[cfg(test)]
mod tests {
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    #[test]
    fn the_lag_is_the_oldest_purchase_of_the_batch() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let accepted = |secs_ago: i64| OrderMessage {
            request_id: uuid::Uuid::now_v7(),
            user_id: 1,
            product_id: 1,
            price_cents: 100,
            created_at: chrono::Utc::now() - chrono::Duration::seconds(secs_ago),
            bucket: None,
        };
        metrics::with_local_recorder(&recorder, || {
            observe_lag([accepted(3), accepted(90), accepted(10)].iter());
        });
        let text = handle.render();
        let lag: f64 = text
            .lines()
            .find_map(|line| line.strip_prefix("orders_consumer_lag_seconds "))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no lag in {text}"));
        assert!((90.0..91.0).contains(&lag), "lag {lag}");
    }

    #[test]
    fn a_batch_without_first_deliveries_leaves_the_lag_alone() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || observe_lag(std::iter::empty()));
        let text = handle.render();
        assert!(!text.contains("orders_consumer_lag_seconds"), "{text}");
    }
}
