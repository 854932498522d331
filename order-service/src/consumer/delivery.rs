//! What becomes of each message: ack, retry, dead letter, or requeue.
//!
//! A retry or a dead letter is a copy published with a confirm *before* the original is
//! acked, so a crash in between duplicates, never loses. "Settle" means one thing here:
//! telling the broker what became of a delivery (an ack, a nack or a reject). A part of a
//! batch is settled by itself as far as our side goes ([`super::message::Parts`]); its
//! delivery is settled with the broker once every part is.

use std::sync::Arc;

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::options::{BasicNackOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};

use seckill_messaging::{
    ConfirmedPublisher, HEADER_ATTEMPT, HEADER_DELIVERY_COUNT, HEADER_ERROR_CODE,
    HEADER_ERROR_MESSAGE, MAX_REQUEUES, OrderMessage, Topology,
};
use seckill_store::PurchaseResult;

use super::OrderConsumer;
use super::headers::{
    HEADER_RETRIED_AT, HEADER_RETRY_TIER, attempt_of, delivery_count, signature_of,
};
use super::message::{Msg, Parts, Received, Whole};
use crate::ack_window::AckWindow;
use crate::in_flight::Holdings;
use crate::metrics as names;
use crate::orders::Recorded;
use crate::retry::Next;

impl OrderConsumer {
    /// Writes the buyer's result for one written message, then acks or dead-letters it.
    pub(super) async fn finish_written(
        &self,
        out: &Out,
        delivery: Msg<'_>,
        msg: OrderMessage,
        outcome: Recorded,
    ) {
        // The delivery's consume span (`super::batch` runs this in it).
        let span = tracing::Span::current();
        let (result, settle) = match outcome {
            Recorded::Created { order_id } => {
                metrics::counter!(names::ORDERS_CREATED).increment(1);
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
                self.ack(out, delivery).await;
                return;
            }
            Recorded::Superseded { order_id } => {
                // Given up with its unit owed back: the compensation writes the buyer's
                // result once it is in Redis (the live order's success, while that stands),
                // so nothing written here can contradict it.
                metrics::counter!(names::ORDERS_SUPERSEDED).increment(1);
                span.in_scope(|| {
                    tracing::warn!(
                        order_id,
                        user_id = msg.user_id,
                        product_id = msg.product_id,
                        "second purchase of a buyer holding a live order, given up"
                    )
                });
                self.ack(out, delivery).await;
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
                self.retry_later(out, delivery, &e.to_string(), Exhausted::OrderStands)
                    .await;
                return;
            }
            // A rejected purchase is dead-lettered all the same: giving it up (an operator's
            // ignore) writes its buyer's result.
        }
        seckill_http::failpoint!("consume::after_result", ());
        match (settle, result) {
            (Settle::DeadLetter, PurchaseResult::Failed { reason }) => {
                self.dead_letter(out, delivery, &reason, "rejected by the database")
                    .await;
            }
            // Acked with the run of finished deliveries it belongs to.
            _ => self.ack(out, delivery).await,
        }
        seckill_http::failpoint!("consume::after_ack", ());
    }

    /// Sends a message that failed transiently to its next retry tier (or, past the cap, as
    /// `exhausted` says), then acks the original.
    pub(super) async fn retry_later(
        &self,
        out: &Out,
        delivery: Msg<'_>,
        error: &str,
        exhausted: Exhausted,
    ) {
        let attempt = attempt_of(delivery.properties);
        match self.retry.next(attempt) {
            Next::GiveUp if exhausted == Exhausted::OrderStands => {
                metrics::counter!("orders_results_abandoned_total").increment(1);
                tracing::error!(
                    error,
                    "the buyer's result could not be written after every retry; the order stands"
                );
                self.ack(out, delivery).await;
            }
            Next::GiveUp => {
                self.dead_letter(out, delivery, "retries_exhausted", error)
                    .await;
            }
            Next::Retry { delay_ms, attempt } => {
                if !self.note_passing_on(delivery).await {
                    self.requeue(out, delivery).await;
                    return;
                }
                let routing_key = Topology::retry_routing_key(delay_ms);
                let headers = [
                    (HEADER_ATTEMPT, AMQPValue::LongInt(attempt as i32)),
                    (HEADER_ERROR_MESSAGE, AMQPValue::LongString(error.into())),
                    (
                        HEADER_RETRIED_AT,
                        AMQPValue::LongLongInt(chrono::Utc::now().timestamp_millis()),
                    ),
                    (
                        HEADER_RETRY_TIER,
                        AMQPValue::LongLongInt(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
                    ),
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
                    metrics::counter!(names::ORDERS_RETRIED, "tier" => names::tier_label(delay_ms))
                        .increment(1);
                    self.ack(out, delivery).await;
                } else {
                    self.requeue(out, delivery).await;
                }
            }
        }
    }

    /// Publishes the message to the dead-letter exchange with its reason, then acks the
    /// original; if that publish fails, rejects it into the same exchange without a reason.
    pub(super) async fn dead_letter(&self, out: &Out, delivery: Msg<'_>, code: &str, error: &str) {
        metrics::counter!(names::ORDERS_DEAD_LETTERED, "reason" => code.to_string()).increment(1);
        let headers = [
            (HEADER_ERROR_CODE, AMQPValue::LongString(code.into())),
            (HEADER_ERROR_MESSAGE, AMQPValue::LongString(error.into())),
            (
                HEADER_ATTEMPT,
                AMQPValue::LongInt(attempt_of(delivery.properties) as i32),
            ),
        ];
        if !self.note_passing_on(delivery).await {
            // Unnoted, a dead letter in transit would be invisible to a fence: try later.
            self.requeue(out, delivery).await;
            return;
        }
        let exchange = &self.topology.dead_letter_exchange;
        if self.republish(out, exchange, "", delivery, &headers).await {
            self.ack(out, delivery).await;
        } else if delivery.part.is_some() {
            // A part cannot be rejected alone: it waits in the queue with its batch.
            self.requeue(out, delivery).await;
        } else {
            if delivery
                .delivery
                .reject(BasicRejectOptions { requeue: false })
                .await
                .is_err()
            {
                metrics::counter!(names::ORDERS_ACK_FAILURES).increment(1);
            }
            out.acks.settled_elsewhere(delivery.tag()).await;
        }
    }

    /// Notes the purchase a delivery carries as in transit before it is passed on to a retry
    /// tier or the dead-letter exchange (`crate::in_flight`); true when noted, or when the
    /// delivery is no genuine purchase (its signature fails or its body does not parse) and
    /// so holds nothing to note.
    pub(super) async fn note_passing_on(&self, delivery: Msg<'_>) -> bool {
        self.note_all_passing_on(&[delivery]).await
    }

    /// [`Self::note_passing_on`] for several messages at once (one insert).
    pub(super) async fn note_all_passing_on(&self, messages: &[Msg<'_>]) -> bool {
        let purchases: Vec<(uuid::Uuid, i64)> = messages
            .iter()
            .filter(|m| {
                self.signer
                    .verify(m.data, signature_of(m.properties))
                    .is_ok()
            })
            .filter_map(|m| serde_json::from_slice::<OrderMessage>(m.data).ok())
            .map(|msg| (msg.request_id, msg.product_id))
            .collect();
        if purchases.is_empty() {
            return true;
        }
        match seckill_store::transit::note(&self.db, &purchases).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "could not note a purchase in transit; handing it back");
                false
            }
        }
    }

    /// Publishes a copy of a message (body and properties, plus `headers`) and waits for
    /// the broker's confirm; false unless it was confirmed and routed to a queue. A part of
    /// a batch goes as the single-order message it stands for.
    async fn republish(
        &self,
        out: &Out,
        exchange: &str,
        routing_key: &str,
        delivery: Msg<'_>,
        headers: &[(&str, AMQPValue)],
    ) -> bool {
        // The copy is a new message to its queue: the original's delivery count, kept,
        // would read as the copy's own; so would its retry's publish time (a recycled copy
        // or a dead letter is no retry, and would be timed as one from that old publish).
        let mut table: FieldTable = delivery
            .properties
            .headers()
            .iter()
            .flat_map(|h| h.inner())
            .filter(|(name, _)| {
                ![HEADER_DELIVERY_COUNT, HEADER_RETRIED_AT, HEADER_RETRY_TIER]
                    .contains(&name.as_str())
            })
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
            .publish(exchange, routing_key, delivery.data, properties)
            .await;
        if let Err(e) = published {
            tracing::warn!(error = %e, exchange, routing_key, "republish failed");
            return false;
        }
        true
    }

    /// Acks a message: its delivery, or, for a part, once its batch's last part is settled.
    pub(super) async fn ack(&self, out: &Out, delivery: Msg<'_>) {
        match delivery.part {
            None => out.acks.ack(delivery.tag()).await,
            Some(index) => {
                if let Some(whole) = out.parts.settle(delivery.tag(), index, false) {
                    self.settle_whole(out, delivery.delivery, whole).await;
                }
            }
        }
    }

    /// Hands a message back to the queue after `requeue_delay`, no attempt counted.
    pub(super) async fn requeue(&self, out: &Out, delivery: Msg<'_>) {
        tokio::time::sleep(self.requeue_delay).await;
        self.hand_back(out, delivery).await;
    }

    /// Returns a message to the queue: its delivery, or, for a part, its whole batch once
    /// every part is settled (the parts written meanwhile are duplicates when it comes back).
    pub(super) async fn hand_back(&self, out: &Out, delivery: Msg<'_>) {
        match delivery.part {
            None => self.hand_back_delivery(out, delivery.delivery).await,
            Some(index) => {
                if let Some(whole) = out.parts.settle(delivery.tag(), index, true) {
                    self.settle_whole(out, delivery.delivery, whole).await;
                }
            }
        }
    }

    /// Settles a batch delivery whose parts are all settled.
    pub(super) async fn settle_whole(&self, out: &Out, delivery: &Delivery, whole: Whole) {
        match whole {
            Whole::Ack => {
                out.acks.ack(delivery.delivery_tag).await;
                out.parts.forget(delivery.delivery_tag);
            }
            Whole::HandBack => self.hand_back_delivery(out, delivery).await,
        }
    }

    /// Hands a whole delivery back after `requeue_delay`, no attempt counted.
    pub(super) async fn requeue_delivery(&self, out: &Out, received: &Received) {
        tokio::time::sleep(self.requeue_delay).await;
        self.hand_back_delivery(out, &received.delivery).await;
    }

    /// Returns a delivery to the queue: a nack with requeue, or past [`MAX_REQUEUES`]
    /// returns a fresh copy published to the queue (its delivery count starts over) and the
    /// original acked. Should that publish fail, the nack it is.
    pub(super) async fn hand_back_delivery(&self, out: &Out, delivery: &Delivery) {
        metrics::counter!("orders_requeued_total").increment(1);
        if delivery_count(&delivery.properties) >= MAX_REQUEUES {
            let whole = Msg {
                delivery,
                part: None,
                data: &delivery.data,
                properties: &delivery.properties,
            };
            let recycled = self
                .republish(
                    out,
                    &self.topology.exchange,
                    &self.topology.routing_key,
                    whole,
                    &[],
                )
                .await;
            if recycled {
                out.holdings.handed_back();
                metrics::counter!("orders_recycled_total").increment(1);
                out.acks.ack(delivery.delivery_tag).await;
                out.parts.forget(delivery.delivery_tag);
                return;
            }
        }
        let options = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        if let Err(e) = delivery.nack(options).await {
            tracing::warn!(error = %e, "could not requeue delivery");
            metrics::counter!(names::ORDERS_ACK_FAILURES).increment(1);
        }
        out.holdings.handed_back();
        out.acks.settled_elsewhere(delivery.delivery_tag).await;
        out.parts.forget(delivery.delivery_tag);
    }
}

/// Where a batch settles its deliveries: the confirm channel for retries and dead letters,
/// and the consuming channel's ack window.
#[derive(Clone)]
pub(super) struct Out {
    /// Publishes retries, dead letters and recycled copies, each confirmed.
    pub(super) publisher: ConfirmedPublisher,
    /// Held from a publish until its confirm: lapin credits a returned (unroutable) message
    /// to whichever confirm resolves next, and one `ack multiple` resolves several in no
    /// fixed order, so with two publishes pending a return could be read as the other's
    /// and an unrouted copy's original acked. Retries, dead letters and recycled copies
    /// are the rare path; one at a time costs nothing that matters.
    pub(super) one_publish: Arc<tokio::sync::Mutex<()>>,
    /// Acks of the consuming channel, coalesced.
    pub(super) acks: Arc<AckWindow>,
    /// What the consuming connection holds, reported for seckill-api's fence.
    pub(super) holdings: Arc<Holdings>,
    /// Which parts of the batch deliveries in hand are settled.
    pub(super) parts: Arc<Parts>,
    /// Batches written at once: prefetch / batch_size of them, as when every delivery was
    /// one purchase (a delivery of many purchases fills a batch alone).
    pub(super) writers: Arc<tokio::sync::Semaphore>,
}

/// How a written message is settled once its buyer's result is written.
enum Settle {
    Ack,
    DeadLetter,
}

/// What a message that ran out of retries becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exhausted {
    /// A dead letter with reason `retries_exhausted`.
    DeadLetter,
    /// Acked: its order is written, only its buyer's result could not be.
    OrderStands,
}
