//! Redriving: dead letters back to the orders exchange, each flipped to `redriven` in a
//! transaction that commits only after the broker confirmed its publish (see the parent
//! module's docs), paced by a [`RedrivePace`].

use std::time::Duration;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use sqlx::PgPool;

use seckill_messaging::{
    CONFIRM_TIMEOUT, ConfirmedPublisher, HEADER_ATTEMPT, HEADER_SIGNATURE, HEADER_TRACEPARENT,
    PublishError, Topology,
};

use super::pace::RedrivePace;
use super::selection::{ParkingError, Report, Selection};
use super::store::{audit, select_ids};
#[cfg(feature = "failpoints")]
use crate::failpoints::{channel_lost, postgres_lost};

/// A redriven entry's body, redrive count, signature and traceparent.
type Redriven = (Vec<u8>, i32, Option<String>, Option<String>);

/// AMQP header of a redriven message: how many times the operator redrove it.
pub const HEADER_REDRIVE: &str = "x-redrive";

/// Where redrives are published, and how fast.
#[derive(Debug)]
pub struct Redriver {
    /// Broker URL (a connection is opened per redrive: operator actions are rare).
    amqp_url: String,
    /// Exchange and routing key of the orders queue.
    topology: Topology,
    /// Paces the publishes; shared by concurrent redrives of one process.
    pace: RedrivePace,
}

impl Redriver {
    /// Redrives to `topology`'s orders exchange on `amqp_url`, at most `per_sec` a second
    /// in bursts of up to `burst` (see [`RedrivePace`]).
    pub fn new(amqp_url: String, topology: Topology, per_sec: f64, burst: f64) -> Self {
        Self {
            amqp_url,
            topology,
            pace: RedrivePace::new(per_sec, burst),
        }
    }

    /// Sends the pending entries of `selection` back to the orders queue, paced; each entry
    /// at most once (see the module docs). A dry run changes nothing but the audit trail.
    pub async fn redrive(
        &self,
        db: &PgPool,
        selection: &Selection,
        operator: &str,
    ) -> Result<Report, ParkingError> {
        selection.check()?;
        let candidates = select_ids(db, selection, &["pending"]).await?;
        let mut done = Vec::new();
        let outcome = if selection.dry_run || candidates.is_empty() {
            done = candidates;
            Ok(())
        } else {
            self.publish_each(db, &candidates, operator, &mut done)
                .await
        };
        seckill_http::failpoint!("redrive::before_audit", Err(postgres_lost()));
        let mut conn = db.acquire().await?;
        audit(&mut conn, operator, "redrive", selection, &done).await?;
        outcome?;
        if !selection.dry_run {
            metrics::counter!("orders_redriven_total").increment(done.len() as u64);
            tracing::warn!(operator, count = done.len(), "dead letters redriven");
        }
        Ok(Report {
            action: "redrive".into(),
            dry_run: selection.dry_run,
            event_ids: done,
            compensated: 0,
        })
    }

    async fn publish_each(
        &self,
        db: &PgPool,
        candidates: &[String],
        operator: &str,
        done: &mut Vec<String>,
    ) -> Result<(), ParkingError> {
        let failed = |done: &Vec<String>, reason: String| ParkingError::Publish {
            done: done.len(),
            reason,
        };
        let connection =
            seckill_messaging::connect(&self.amqp_url, "order-service-redrive", Duration::ZERO)
                .await
                .map_err(|e| failed(done, format!("{e:#}")))?;
        let publisher = ConfirmedPublisher::open(&connection, CONFIRM_TIMEOUT)
            .await
            .map_err(|e| failed(done, e.to_string()))?;
        let mut result = Ok(());
        for event_id in candidates {
            self.pace.take().await;
            match self.publish_one(db, &publisher, event_id, operator).await {
                Ok(true) => done.push(event_id.clone()),
                // Redriven, ignored or cleared by someone else meanwhile.
                Ok(false) => {}
                Err(reason) => {
                    result = Err(failed(done, reason));
                    break;
                }
            }
        }
        let _ = connection.close(200, "redrive done".into()).await;
        result
    }

    /// Flips one entry to `redriven` and publishes it, committing only after the broker
    /// confirmed; false if it was no longer pending.
    async fn publish_one(
        &self,
        db: &PgPool,
        publisher: &ConfirmedPublisher,
        event_id: &str,
        operator: &str,
    ) -> Result<bool, String> {
        let mut tx = db.begin().await.map_err(|e| e.to_string())?;
        let row: Option<Redriven> = sqlx::query_as(
            "UPDATE dead_letters SET status = 'redriven', redrives = redrives + 1, operator = $2 \
             WHERE event_id = $1 AND status = 'pending' \
             RETURNING body, redrives, signature, traceparent",
        )
        .bind(event_id)
        .bind(operator)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let Some((body, redrives, signature, traceparent)) = row else {
            return Ok(false);
        };
        seckill_http::failpoint!("redrive::after_update", Err(channel_lost().to_string()));
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from(HEADER_ATTEMPT), AMQPValue::LongInt(0));
        headers.insert(
            ShortString::from(HEADER_REDRIVE),
            AMQPValue::LongInt(redrives),
        );
        // The signature it arrived with, as it was: order-service holds the key but never
        // signs, or a message forged straight into the dead-letter queue would come back
        // from a redrive as genuine. One that had none is refused again, as it should be.
        if let Some(signature) = signature {
            headers.insert(
                ShortString::from(HEADER_SIGNATURE),
                AMQPValue::LongString(signature.into()),
            );
        }
        // The purchase's trace goes on: the order a redrive makes belongs to the click.
        if let Some(traceparent) = traceparent {
            headers.insert(
                ShortString::from(HEADER_TRACEPARENT),
                AMQPValue::LongString(traceparent.into()),
            );
        }
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(event_id.into())
            .with_headers(headers);
        publisher
            .publish(
                &self.topology.exchange,
                &self.topology.routing_key,
                &body,
                properties,
            )
            .await
            .map_err(|e| match e {
                PublishError::Channel(e) => e.to_string(),
                // "the broker did not take the message: …", or no confirm in time.
                other => other.to_string(),
            })?;
        seckill_http::failpoint!(
            "redrive::after_publish",
            Err(postgres_lost::<sqlx::Error>().to_string())
        );
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(true)
    }
}
