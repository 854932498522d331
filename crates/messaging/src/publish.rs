//! Publishing with publisher confirms: the one way every service hands RabbitMQ a message it
//! must not lose.
//!
//! A message counts as published only once the broker confirmed it *and* a queue took it:
//! every publish is persistent and `mandatory`, and each confirm is judged by [`taken`],
//! because lapin resolves a `mandatory` message that no queue took as an ack with the
//! returned message attached. A confirm is awaited for a bounded time; one that does not
//! come closes the channel, since lapin would credit a late confirm (or a return) to
//! whichever message is awaited next on it.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};

use crate::{
    HEADER_ATTEMPT, HEADER_REQUEST_ID, HEADER_SIGNATURE, HEADER_TRACEPARENT, HEADER_TRACESTATE,
    OrderSigner, Topology,
};

/// How long a confirm is awaited unless a publisher is given another bound.
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);

/// The W3C trace context an order message carries in its headers, beside (never inside)
/// what the signature covers: the signature is of the body alone. Empty: no header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceHeaders<'a> {
    /// The `traceparent` header.
    pub traceparent: &'a str,
    /// The `tracestate` header.
    pub tracestate: &'a str,
}

/// Why the broker did not take a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotTaken {
    /// Confirmed, but no queue took it: a `mandatory` message returned as unroutable.
    Returned,
    /// The broker refused it (a nack).
    Nacked,
    /// The channel was not in confirm mode, so nothing says the broker has it.
    NotConfirmed,
}

impl std::fmt::Display for NotTaken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Returned => "returned unroutable: no queue is bound for it",
            Self::Nacked => "nacked by the broker",
            Self::NotConfirmed => "published without a confirm",
        })
    }
}

impl std::error::Error for NotTaken {}

/// Whether a publisher confirm means a queue holds the message. lapin resolves a
/// `mandatory` publish that no queue took as an *ack* with the returned message attached:
/// that is no success, and every publisher must check for it, which this does.
pub fn taken(confirmation: &lapin::Confirmation) -> Result<(), NotTaken> {
    match confirmation {
        lapin::Confirmation::Ack(None) => Ok(()),
        lapin::Confirmation::Ack(Some(_returned)) => Err(NotTaken::Returned),
        lapin::Confirmation::Nack(_) => Err(NotTaken::Nacked),
        lapin::Confirmation::NotRequested => Err(NotTaken::NotConfirmed),
    }
}

/// Why a confirmed publish did not succeed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// The channel failed the publish or its confirm.
    #[error("channel: {0}")]
    Channel(#[from] lapin::Error),
    /// No confirm within the publisher's bound (its channel is closed since).
    #[error("no confirm within {0:?}")]
    TimedOut(Duration),
    /// The broker answered, but no queue holds the message.
    #[error("the broker did not take the message: {0}")]
    NotTaken(#[from] NotTaken),
}

/// A published message's confirm, still to be awaited.
#[derive(Debug)]
#[must_use = "a message is published only once its confirm says so"]
pub struct Confirm(lapin::PublisherConfirm);

impl Confirm {
    /// Waits for the broker's answer, however long it takes, and judges it with [`taken`].
    /// For a caller bounding a whole batch itself; others use
    /// [`ConfirmedPublisher::confirmed`].
    pub async fn outcome(self) -> Result<(), PublishError> {
        Ok(taken(&self.0.await?)?)
    }
}

/// A channel in confirm mode that publishes persistent, `mandatory` messages and judges
/// their confirms. Cheap to clone (clones share the channel).
#[derive(Debug, Clone)]
pub struct ConfirmedPublisher {
    channel: Channel,
    timeout: Duration,
}

impl ConfirmedPublisher {
    /// Opens a channel on `connection` in confirm mode; confirms are awaited up to `timeout`.
    pub async fn open(connection: &Connection, timeout: Duration) -> lapin::Result<Self> {
        Self::new(connection.create_channel().await?, timeout).await
    }

    /// Puts `channel` in confirm mode and publishes on it; confirms are awaited up to
    /// `timeout`. The channel should carry no other publishes: their confirms would mix.
    pub async fn new(channel: Channel, timeout: Duration) -> lapin::Result<Self> {
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Self { channel, timeout })
    }

    /// Whether its channel is still open (a channel error closes it on its own).
    pub fn is_open(&self) -> bool {
        self.channel.status().connected()
    }

    /// Closes its channel; an error only means it was closed already.
    pub async fn close(&self, reason: &str) {
        let _ = self.channel.close(200, reason.into()).await;
    }

    /// Publishes one message, persistent and `mandatory` whatever `properties` say, and
    /// returns its confirm without waiting for it (several can be in flight at once).
    pub async fn send(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<Confirm, PublishError> {
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                payload,
                properties.with_delivery_mode(2),
            )
            .await?;
        Ok(Confirm(confirm))
    }

    /// Publishes one order message to the topology's exchange, signed by `signer`, with the
    /// purchase's request id as `message_id`, the HTTP request id and the trace context in
    /// headers and attempt 0; see [`Self::send`].
    pub async fn send_order(
        &self,
        signer: &OrderSigner,
        topology: &Topology,
        request_id: &str,
        http_request_id: &str,
        payload: &[u8],
        trace: TraceHeaders<'_>,
    ) -> Result<Confirm, PublishError> {
        let properties = order_properties(signer, request_id, http_request_id, payload, trace);
        self.send(
            &topology.exchange,
            &topology.routing_key,
            payload,
            properties,
        )
        .await
    }

    /// Publishes `orders` as one batch message ([`crate::batch`]): each part signed by
    /// `signer`; one order alone goes as a plain single-order message
    /// ([`Self::send_order`]). Every payload must be [`crate::batch::embeddable`] (callers
    /// send any other alone). One confirm answers for all of them.
    pub async fn send_orders(
        &self,
        signer: &OrderSigner,
        topology: &Topology,
        orders: &[crate::batch::Outgoing<'_>],
    ) -> Result<Confirm, PublishError> {
        if let [order] = orders {
            return self
                .send_order(
                    signer,
                    topology,
                    order.request_id,
                    order.http_request_id,
                    order.payload,
                    order.trace,
                )
                .await;
        }
        let body = crate::batch::encode(signer, orders);
        self.send(
            &topology.exchange,
            &topology.routing_key,
            &body,
            crate::batch::properties(orders.len()),
        )
        .await
    }

    /// Waits for `confirm` up to the publisher's bound and judges it. On a timeout the
    /// channel is closed: a late confirm would be credited to a later message.
    pub async fn confirmed(&self, confirm: Confirm) -> Result<(), PublishError> {
        match tokio::time::timeout(self.timeout, confirm.outcome()).await {
            Ok(outcome) => outcome,
            Err(_) => {
                self.close("no confirm in time").await;
                Err(PublishError::TimedOut(self.timeout))
            }
        }
    }

    /// Publishes one message and waits for its confirm ([`Self::send`], then
    /// [`Self::confirmed`]).
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let confirm = self
            .send(exchange, routing_key, payload, properties)
            .await?;
        self.confirmed(confirm).await
    }
}

/// The properties of an order message as seckill-api first publishes it, its signature of
/// `payload` among them: every first publish of an order message comes through here.
fn order_properties(
    signer: &OrderSigner,
    request_id: &str,
    http_request_id: &str,
    payload: &[u8],
    trace: TraceHeaders<'_>,
) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in [
        (HEADER_TRACEPARENT, trace.traceparent),
        (HEADER_TRACESTATE, trace.tracestate),
    ] {
        if !value.is_empty() {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
    }
    headers.insert(
        HEADER_SIGNATURE.into(),
        AMQPValue::LongString(signer.sign(payload).into()),
    );
    headers.insert(
        HEADER_REQUEST_ID.into(),
        AMQPValue::LongString(http_request_id.into()),
    );
    headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongInt(0));
    BasicProperties::default()
        .with_message_id(request_id.into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// Publishes one order message to the topology's exchange: signed by `signer`, persistent,
/// `mandatory` (an unroutable message comes back attached to its confirm), with the
/// purchase's request id as `message_id` and the HTTP request id in a header. The returned confirm resolves once
/// the broker has answered for it (the channel must be in confirm mode); it is a success
/// only if [`taken`] says so — an unroutable message confirms as an ack too. Prefer
/// [`ConfirmedPublisher::send_order`], which judges the confirm for you.
pub async fn publish_order(
    channel: &Channel,
    signer: &OrderSigner,
    topology: &Topology,
    request_id: &str,
    http_request_id: &str,
    payload: &[u8],
) -> lapin::Result<lapin::PublisherConfirm> {
    channel
        .basic_publish(
            topology.exchange.as_str().into(),
            topology.routing_key.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            payload,
            order_properties(
                signer,
                request_id,
                http_request_id,
                payload,
                TraceHeaders::default(),
            ),
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(properties: &BasicProperties, name: &str) -> Option<String> {
        properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name))
            .and_then(|v| v.as_long_string())
            .map(|s| s.to_string())
    }

    #[test]
    fn trace_headers_ride_beside_the_signature_of_the_body() {
        let signer = OrderSigner::new("key");
        let body = br#"{"request_id":"r"}"#;
        let traced = order_properties(
            &signer,
            "r",
            "h",
            body,
            TraceHeaders {
                traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                tracestate: "a=1",
            },
        );
        let plain = order_properties(&signer, "r", "h", body, TraceHeaders::default());
        assert_eq!(
            header(&traced, HEADER_TRACEPARENT).as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert_eq!(header(&traced, HEADER_TRACESTATE).as_deref(), Some("a=1"));
        assert_eq!(header(&plain, HEADER_TRACEPARENT), None);
        assert_eq!(header(&plain, HEADER_TRACESTATE), None);
        // The same signature either way: it covers the body only.
        assert_eq!(
            header(&traced, HEADER_SIGNATURE),
            header(&plain, HEADER_SIGNATURE)
        );
        assert!(
            signer
                .verify(body, header(&traced, HEADER_SIGNATURE).as_deref())
                .is_ok()
        );
    }
}
