//! The parking-lot recorder: drains the dead-letter queue into Postgres (`dead_letters`),
//! where an operator can list, redrive or ignore each entry ([`crate::parking`]).
//!
//! A dead letter is acked only after its row committed, so a crash or a database outage
//! leaves it in the queue; recording is idempotent per event id, so a redelivery is one row.
//!
//! The dead-letter exchange is open to anyone who can publish, and a dead letter's reason is
//! only a header: the recorder checks each one's signature as the consumer does, and parks
//! one that fails as refused for its signature (holding nothing) whatever reason it claims.

use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use seckill_messaging::{Health, OrderSigner, Supervised, Supervisor, Topology};

#[cfg(feature = "failpoints")]
use crate::failpoints::channel_lost;
use crate::parking::{self, Arrival};

/// Consumes the dead-letter queue.
#[derive(Debug, Clone)]
pub struct Recorder {
    /// Where entries are written.
    pub db: PgPool,
    /// Broker.
    pub amqp_url: String,
    /// Queue names.
    pub topology: Topology,
    /// The consumer's signature check: a dead letter it does not accept is parked as refused
    /// for its signature, whatever reason its headers give (see [`Arrival::from_message`]).
    pub signer: OrderSigner,
    /// Redrives after which an entry that fails again is quarantined.
    pub quarantine_after: i32,
    /// Wait before handing a dead letter back after a failed write.
    pub retry_delay: Duration,
}

impl Recorder {
    /// Runs until `cancel`, reconnecting with backoff.
    pub async fn run(mut self, cancel: CancellationToken) {
        Supervisor::new("dead-letter recorder")
            .run(&mut self, &cancel)
            .await;
    }

    async fn consume(&self, health: &mut Health, cancel: &CancellationToken) -> anyhow::Result<()> {
        let connection =
            seckill_messaging::connect(&self.amqp_url, "order-service-dlq", Duration::ZERO).await?;
        let channel = connection.create_channel().await?;
        self.topology
            .declare(&channel)
            .await
            .context("declare topology")?;
        channel
            .basic_qos(32, BasicQosOptions::default())
            .await
            .context("set prefetch")?;
        let mut deliveries = channel
            .basic_consume(
                self.topology.dead_letter_queue.as_str().into(),
                "order-service-recorder".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .context("consume the dead-letter queue")?;
        health.healthy();
        let ended = loop {
            let delivery = tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => delivery,
                    Some(Err(e)) => break Err(anyhow::Error::from(e).context("dead-letter stream")),
                    None => break Err(anyhow::anyhow!("dead-letter stream ended")),
                },
            };
            match self.park(&delivery).await {
                Ok(()) => {
                    seckill_http::failpoint!("record::after_insert", Err(channel_lost()));
                    if let Err(e) = delivery.ack(BasicAckOptions::default()).await {
                        tracing::warn!(error = %e, "could not ack a parked dead letter");
                    }
                    seckill_http::failpoint!("record::after_ack", Err(channel_lost()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not park a dead letter, handing it back");
                    tokio::time::sleep(self.retry_delay).await;
                    let _ = delivery
                        .nack(BasicNackOptions {
                            requeue: true,
                            multiple: false,
                        })
                        .await;
                }
            }
        };
        let _ = connection.close(200, "order-service stopping".into()).await;
        ended
    }

    /// Parks what a dead letter carries: one entry, or one per purchase of a batch (which
    /// reaches the dead-letter queue whole only when the broker dead-letters it itself, at
    /// the delivery limit). Each is recorded as its own dead letter, so a batch's purchases
    /// are redriven or ignored one by one.
    async fn park(&self, delivery: &lapin::message::Delivery) -> anyhow::Result<()> {
        let arrivals = match seckill_messaging::batch::is_batch(&delivery.properties)
            .then(|| seckill_messaging::batch::unpack(&delivery.data, &delivery.properties))
        {
            Some(Ok(parts)) => parts
                .iter()
                .map(|part| Arrival::from_message(&part.data, &part.properties, &self.signer))
                .collect(),
            Some(Err(e)) => {
                tracing::error!(error = %e, "unreadable batch in the dead-letter queue, parked whole");
                vec![Arrival::from_message(
                    &delivery.data,
                    &delivery.properties,
                    &self.signer,
                )]
            }
            None => vec![Arrival::from_message(
                &delivery.data,
                &delivery.properties,
                &self.signer,
            )],
        };
        for arrival in &arrivals {
            let status = parking::record(&self.db, arrival, self.quarantine_after).await?;
            metrics::counter!(crate::metrics::ORDERS_PARKED, "reason" => arrival.error_code.clone())
                .increment(1);
            if status == "quarantined" {
                tracing::error!(event_id = %arrival.event_id, error_code = %arrival.error_code,
                    "dead letter failed again after its last allowed redrive: quarantined");
            } else {
                tracing::warn!(event_id = %arrival.event_id, error_code = %arrival.error_code,
                    status, "dead letter parked");
            }
        }
        Ok(())
    }
}

impl Supervised for Recorder {
    /// Connects and records dead letters until `cancel` or until the broker goes away.
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        self.consume(health, cancel).await
    }
}
