//! The order message contract (DESIGN.md §5) and the RabbitMQ topology both ends declare.
//!
//! Layout:
//! - [`OrderMessage`]: the body seckill-api publishes and order-service consumes.
//! - [`batch`] — group commit: several purchases in one message, each part the signed
//!   single-order message it stands for ([`batch::unpack`]).
//! - [`topology`] — exchange/queue names under a namespace, declared idempotently.
//! - [`publish`] — [`ConfirmedPublisher`]: persistent, `mandatory` publishes whose confirms
//!   are bounded in time and judged by [`taken`]; every publisher of the services uses it.
//!   Order messages are signed there ([`ConfirmedPublisher::send_order`], [`publish_order`]).
//! - [`signature`] — [`OrderSigner`]: the HMAC that lets order-service trust a message.
//! - [`stat`] — [`queue_stat`]: a queue's ready messages and consumers, and when a quorum
//!   queue's answer cannot be believed.
//! - [`worker`] — [`Supervisor`]: runs a background worker's connect-and-work cycle again
//!   after each failure, with jittered exponential backoff, until cancelled.
//! - [`connect`] — an AMQP connection with retry while the broker comes up.

pub mod batch;
pub mod publish;
pub mod signature;
pub mod stat;
pub mod topology;
pub mod worker;

use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use chrono::{DateTime, Utc};
use lapin::{Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use publish::{
    CONFIRM_TIMEOUT, Confirm, ConfirmedPublisher, NotTaken, PublishError, TraceHeaders,
    publish_order, taken,
};
pub use signature::{HEADER_SIGNATURE, OrderSigner, SignatureError};
pub use stat::{QueueStat, queue_stat};
pub use topology::{DEFAULT_RETRY_TIERS_MS, DELIVERY_LIMIT, MAX_REQUEUES, QueueType, Topology};
pub use worker::{Ended, Health, Supervised, Supervisor};

/// An accepted purchase on its way to becoming an order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderMessage {
    /// Unique per purchase; the order's idempotency key and the AMQP `message_id`.
    pub request_id: Uuid,
    /// The buyer.
    pub user_id: i64,
    /// What was bought.
    pub product_id: i64,
    /// The price seckill-api saw, kept for compatibility and for reading only: order-service
    /// never trusts it and writes each order at the product's price in Postgres.
    pub price_cents: i64,
    /// When seckill-api accepted it.
    pub created_at: DateTime<Utc>,
    /// The stock bucket whose unit it took, so a load from Postgres knows which bucket sold
    /// it (absent in messages of older versions: the buyer's home bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<u16>,
}

/// AMQP header carrying the request id of the HTTP request that produced the message.
pub const HEADER_REQUEST_ID: &str = "x-request-id";
/// AMQP header carrying the W3C trace context: the span that published the message.
pub const HEADER_TRACEPARENT: &str = "traceparent";
/// AMQP header carrying the W3C `tracestate` that goes with [`HEADER_TRACEPARENT`].
pub const HEADER_TRACESTATE: &str = "tracestate";
/// AMQP header counting delivery attempts made by retries (0 on first publish).
pub const HEADER_ATTEMPT: &str = "x-attempt";
/// AMQP header of a dead letter: why it was given up (snake_case code).
pub const HEADER_ERROR_CODE: &str = "x-error-code";
/// AMQP header of a dead letter or a retry: the last error, for the operator.
pub const HEADER_ERROR_MESSAGE: &str = "x-error-message";
/// AMQP header a quorum queue sets on a redelivery: how often it returned the message.
pub const HEADER_DELIVERY_COUNT: &str = "x-delivery-count";

/// Longest one connection attempt (TCP connect and AMQP handshake) may take: RabbitMQ's
/// own `handshake_timeout` default. lapin's connect can wait forever when the broker closes
/// the connection just after `Connection.Tune` (a broker stopping as a worker connects), and
/// a worker stuck in its connect never reconnects. An attempt given up on leaves its socket
/// to whichever end closes it first (RabbitMQ ends a handshake after those same 10 s).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a connection to `url`, retrying with backoff for about `patience`; each attempt is
/// bounded by [`CONNECT_TIMEOUT`], and all of them together by about `patience` +
/// [`CONNECT_TIMEOUT`] (the backoff counts only its own waits, not the attempts).
pub async fn connect(url: &str, name: &str, patience: Duration) -> anyhow::Result<Connection> {
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    let attempt = || async {
        match tokio::time::timeout(
            CONNECT_TIMEOUT,
            Connection::connect(url, properties.clone()),
        )
        .await
        {
            Ok(connected) => connected.map_err(anyhow::Error::from),
            Err(_) => Err(anyhow::anyhow!(
                "no AMQP handshake within {} s",
                CONNECT_TIMEOUT.as_secs()
            )),
        }
    };
    let attempts = attempt
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(3))
                .with_total_delay(Some(patience))
                .without_max_times()
                .with_jitter(),
        )
        .notify(|e, wait| {
            tracing::warn!(
                error = format!("{e:#}"),
                ?wait,
                "rabbitmq not ready, retrying"
            )
        });
    // A second more, so that an attempt under way ends with its own error.
    let deadline = patience + CONNECT_TIMEOUT + Duration::from_secs(1);
    match tokio::time::timeout(deadline, attempts).await {
        Ok(connected) => connected.context("connect to rabbitmq"),
        Err(_) => Err(anyhow::anyhow!(
            "connect to rabbitmq: no connection within {} s",
            deadline.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_body_has_exactly_the_contract_fields() {
        let msg = OrderMessage {
            request_id: Uuid::nil(),
            user_id: 1,
            product_id: 2,
            price_cents: 300,
            created_at: DateTime::from_timestamp(0, 0).expect("epoch"),
            bucket: Some(3),
        };
        let value = serde_json::to_value(&msg).expect("serialize");
        let mut keys: Vec<_> = value.as_object().expect("object").keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "bucket",
                "created_at",
                "price_cents",
                "product_id",
                "request_id",
                "user_id"
            ]
        );
        let back: OrderMessage = serde_json::from_value(value).expect("deserialize");
        assert_eq!(back, msg);
    }

    #[test]
    fn a_message_without_a_bucket_still_parses() {
        let older = r#"{"request_id":"00000000-0000-0000-0000-000000000000","user_id":1,
            "product_id":2,"price_cents":300,"created_at":"1970-01-01T00:00:00Z"}"#;
        let msg: OrderMessage = serde_json::from_str(older).expect("deserialize");
        assert_eq!(msg.bucket, None);
    }
}
