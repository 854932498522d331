//! What a message's headers say: its attempt, how often the queue returned it, and the
//! ids that follow a purchase through the logs. A part of a batch carries the batch's
//! headers with its own signature, request id and trace (`seckill_messaging::batch`).

use lapin::BasicProperties;
use lapin::types::AMQPValue;

use seckill_messaging::{
    HEADER_ATTEMPT, HEADER_DELIVERY_COUNT, HEADER_REQUEST_ID, HEADER_SIGNATURE, HEADER_TRACEPARENT,
    HEADER_TRACESTATE,
};
use seckill_telemetry::TraceParent;

/// The consume span of a delivery: it names the message id and the purchase's HTTP request
/// id, so one id follows a purchase from the gateway to its order in the logs, and it
/// continues the trace of the message's `traceparent` header (the publishing span of
/// seckill-api; kept on retry and dead-letter copies and on redrives), or begins one.
pub(super) fn delivery_span(properties: &BasicProperties) -> tracing::Span {
    let message_id = properties
        .message_id()
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    let request_id = text_header(properties, HEADER_REQUEST_ID).unwrap_or_default();
    let span = tracing::info_span!(
        "order.consume",
        service = "order-service",
        message_id,
        request_id,
        trace_id = tracing::field::Empty,
    );
    let parent = trace_of(properties);
    seckill_telemetry::continue_trace(
        &span,
        parent.as_ref(),
        text_header(properties, HEADER_TRACESTATE),
    );
    span
}

/// The trace context a delivery's `traceparent` header names, if well formed.
pub(super) fn trace_of(properties: &BasicProperties) -> Option<TraceParent> {
    text_header(properties, HEADER_TRACEPARENT).and_then(TraceParent::parse_str)
}

/// A text header of a message.
fn text_header<'a>(properties: &'a BasicProperties, name: &str) -> Option<&'a str> {
    properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name))
        .and_then(|v| match v {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        })
}

/// The order signature a message carries, if any (a string header).
pub(super) fn signature_of(properties: &BasicProperties) -> Option<&str> {
    text_header(properties, HEADER_SIGNATURE)
}

/// Header of a retry: when it was published to its tier (unix ms).
pub(super) const HEADER_RETRIED_AT: &str = "x-retried-at";
/// Header of a retry: its tier's delay (ms), the `tier` of `orders_retry_latency_seconds`.
pub(super) const HEADER_RETRY_TIER: &str = "x-retry-tier";

/// When a retried delivery was published to its tier (unix ms) and that tier's delay;
/// `None` for a first delivery (or a retry from a version that did not say).
pub(super) fn retried_at(properties: &BasicProperties) -> Option<(i64, u64)> {
    let headers = properties.headers().as_ref()?.inner();
    let number = |name: &str| match headers.get(name)? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    };
    let at = number(HEADER_RETRIED_AT)?;
    let tier = u64::try_from(number(HEADER_RETRY_TIER)?).ok()?;
    Some((at, tier))
}

/// The attempt a message carries (0 for a first delivery).
pub(super) fn attempt_of(properties: &BasicProperties) -> u32 {
    count_header(properties, HEADER_ATTEMPT)
}

/// How often the queue has returned this delivery before (a quorum queue's count; 0 on a
/// classic queue, which keeps none).
pub(super) fn delivery_count(properties: &BasicProperties) -> u32 {
    count_header(properties, HEADER_DELIVERY_COUNT)
}

/// A numeric header of a message, 0 when absent or not a count.
fn count_header(properties: &BasicProperties, name: &str) -> u32 {
    properties
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
