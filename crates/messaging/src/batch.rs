//! Group commit on the message path: several purchases in one AMQP message.
//!
//! A quorum queue pays for each message it takes (its log entry, its fsync share, its
//! confirm, its delivery and its ack), and so does every client that publishes, consumes and
//! acks it. Sending the purchases a publisher gathered at once as *one* message pays that
//! once for all of them; RabbitMQ's own throughput figures rest on the same effect.
//!
//! Format (DESIGN.md §5): content type [`CONTENT_TYPE`], body
//!
//! ```text
//! {"orders":[{"signature":"v1:…","http_request_id":"…","traceparent":"…","tracestate":"…",
//!             "order":{…the purchase's own message body, byte for byte…}}, …]}
//! ```
//!
//! Each part is a whole single-order message in all but its envelope: the exact body it
//! would have had, that body's own signature, and the headers that name it. The batch as
//! such is not signed — nothing trusts it. A consumer [`unpack`]s a batch into the
//! single-order messages it stands for and treats each as if it had come alone: its
//! signature checked against its own bytes, its order written, retried or dead-lettered by
//! itself, as its own message (a forged part fails alone, never its neighbours). A part
//! passed on to a retry tier or the dead-letter exchange is exactly the message a
//! publisher that did not batch would have sent, so everything downstream of the first
//! delivery (retry tiers, the parking lot, redrives) sees single-order messages only.
//!
//! A batch of one is sent as a plain single-order message, and single-order messages remain
//! valid: a consumer reads both (a rolling upgrade deploys the consumer first).

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::{
    HEADER_ATTEMPT, HEADER_REQUEST_ID, HEADER_SIGNATURE, HEADER_TRACEPARENT, HEADER_TRACESTATE,
    OrderSigner, TraceHeaders,
};

/// The content type of a batch message.
pub const CONTENT_TYPE: &str = "application/vnd.seckill.orders+json";
/// The content type of a single-order message.
pub const CONTENT_TYPE_ORDER: &str = "application/json";
/// Header of a batch message: how many purchases it carries (for operators reading the
/// management UI; the body is what counts).
pub const HEADER_ORDERS: &str = "x-orders";

/// Most purchases one message may carry: a consumer refuses a bigger batch as malformed
/// (one message is one transaction in order-service).
pub const MAX_ORDERS: usize = 256;
/// Largest batch body a consumer reads; a bigger one is refused as malformed before it is
/// parsed, so a crafted body cannot make it allocate without bound.
pub const MAX_BODY: usize = MAX_ORDERS * 8 * 1024;
/// Longest string header of a batch that is copied onto each of its parts; a longer one
/// (only a crafted batch has one) is left off, so parts cannot multiply it.
const MAX_COPIED_HEADER: usize = 1024;

/// One purchase to publish: its order message body, the ids that name it and its trace.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// The purchase's request id: the `message_id` when it is sent alone (a part's comes
    /// from its body when it is unpacked).
    pub request_id: &'a str,
    /// The HTTP request that made it.
    pub http_request_id: &'a str,
    /// The order message body (JSON), signed as it is.
    pub payload: &'a [u8],
    /// Its W3C trace context.
    pub trace: TraceHeaders<'a>,
}

/// One purchase to publish, owned: what a publishing worker or the relay holds until the
/// purchase's confirm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Purchase {
    /// See [`Outgoing::request_id`].
    pub request_id: String,
    /// See [`Outgoing::http_request_id`].
    pub http_request_id: String,
    /// See [`Outgoing::payload`].
    pub payload: Vec<u8>,
    /// The `traceparent` of its trace, or empty.
    pub traceparent: String,
    /// The `tracestate` that goes with it, or empty.
    pub tracestate: String,
}

impl Purchase {
    /// It as a message part.
    pub fn outgoing(&self) -> Outgoing<'_> {
        Outgoing {
            request_id: &self.request_id,
            http_request_id: &self.http_request_id,
            payload: &self.payload,
            trace: TraceHeaders {
                traceparent: &self.traceparent,
                tracestate: &self.tracestate,
            },
        }
    }
}

/// Groups purchases into messages, in order: those [`embeddable`] share messages of up to
/// `max` (at least 1), any other goes alone.
pub fn group<T>(items: &[T], max: usize, purchase: impl Fn(&T) -> &Purchase) -> Vec<Vec<&T>> {
    let (grouped, alone): (Vec<&T>, Vec<&T>) = items
        .iter()
        .partition(|item| embeddable(&purchase(item).payload));
    grouped
        .chunks(max.max(1))
        .chain(alone.chunks(1))
        .map(<[&T]>::to_vec)
        .collect()
}

/// Whether `payload` is one JSON value with nothing around it, so that it stands inside a
/// batch's body as it is and comes out of it byte for byte (its signature is of those bytes).
pub fn embeddable(payload: &[u8]) -> bool {
    serde_json::from_slice::<&RawValue>(payload).is_ok_and(|raw| raw.get().as_bytes() == payload)
}

/// The body of a batch of `orders`, each part signed by `signer`. Every payload must be
/// [`embeddable`]; one that is not would make the whole body unreadable, so callers send
/// such a purchase alone.
pub fn encode(signer: &OrderSigner, orders: &[Outgoing<'_>]) -> Vec<u8> {
    let size: usize = orders.iter().map(|o| o.payload.len() + 256).sum();
    let mut body = Vec::with_capacity(size + 16);
    body.extend_from_slice(br#"{"orders":["#);
    for (index, order) in orders.iter().enumerate() {
        if index > 0 {
            body.push(b',');
        }
        body.push(b'{');
        push_field(&mut body, "signature", &signer.sign(order.payload));
        body.push(b',');
        push_field(&mut body, "http_request_id", order.http_request_id);
        for (name, value) in [
            ("traceparent", order.trace.traceparent),
            ("tracestate", order.trace.tracestate),
        ] {
            if !value.is_empty() {
                body.push(b',');
                push_field(&mut body, name, value);
            }
        }
        body.extend_from_slice(br#","order":"#);
        body.extend_from_slice(order.payload);
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    body
}

/// The properties of a batch message of `count` purchases.
pub fn properties(count: usize) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongInt(0));
    headers.insert(
        HEADER_ORDERS.into(),
        AMQPValue::LongInt(i32::try_from(count).unwrap_or(i32::MAX)),
    );
    BasicProperties::default()
        .with_message_id(uuid::Uuid::now_v7().to_string().into())
        .with_content_type(CONTENT_TYPE.into())
        .with_delivery_mode(2)
        .with_headers(headers)
}

fn push_field(body: &mut Vec<u8>, name: &str, value: &str) {
    body.push(b'"');
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(b"\":");
    // A string always serializes.
    body.extend_from_slice(&serde_json::to_vec(value).unwrap_or_else(|_| b"\"\"".to_vec()));
}

/// Whether a message is a batch: its content type says so.
pub fn is_batch(properties: &BasicProperties) -> bool {
    properties
        .content_type()
        .as_ref()
        .is_some_and(|t| t.as_str() == CONTENT_TYPE)
}

/// One purchase of a batch, as the single-order message it stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The purchase's order message body, byte for byte as it was signed.
    pub data: Vec<u8>,
    /// The batch's properties, made the purchase's own: its `message_id` (its request id,
    /// when the body names one), the single-order content type, and the batch's headers
    /// with the part's signature, HTTP request id and trace context in place of any the
    /// batch carried.
    pub properties: BasicProperties,
}

/// Why a batch could not be read: nothing in it can be trusted to name a purchase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed order batch: {0}")]
pub struct Malformed(pub String);

/// The single-order messages a batch message stands for, in order. Signatures are not
/// checked here: each part is checked as the message it stands for would be.
pub fn unpack(data: &[u8], properties: &BasicProperties) -> Result<Vec<Part>, Malformed> {
    #[derive(Deserialize)]
    struct Batch<'a> {
        #[serde(borrow)]
        orders: Vec<Entry<'a>>,
    }
    #[derive(Deserialize)]
    struct Entry<'a> {
        #[serde(default)]
        signature: Option<String>,
        #[serde(default)]
        http_request_id: Option<String>,
        #[serde(default)]
        traceparent: Option<String>,
        #[serde(default)]
        tracestate: Option<String>,
        #[serde(borrow)]
        order: &'a RawValue,
    }
    #[derive(Deserialize)]
    struct Named {
        request_id: String,
    }
    if data.len() > MAX_BODY {
        return Err(Malformed(format!(
            "a body of {} bytes, over the limit of {MAX_BODY}",
            data.len()
        )));
    }
    let batch: Batch<'_> = serde_json::from_slice(data).map_err(|e| Malformed(e.to_string()))?;
    if batch.orders.is_empty() {
        return Err(Malformed("no orders".into()));
    }
    if batch.orders.len() > MAX_ORDERS {
        return Err(Malformed(format!(
            "{} orders, over the limit of {MAX_ORDERS}",
            batch.orders.len()
        )));
    }
    let base: Vec<(ShortString, AMQPValue)> = properties
        .headers()
        .iter()
        .flat_map(|h| h.inner())
        .filter(|(name, value)| {
            ![
                HEADER_ORDERS,
                HEADER_SIGNATURE,
                HEADER_REQUEST_ID,
                HEADER_TRACEPARENT,
                HEADER_TRACESTATE,
            ]
            .contains(&name.as_str())
                && !matches!(value, AMQPValue::LongString(s) if s.as_bytes().len() > MAX_COPIED_HEADER)
        })
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    let parts = batch
        .orders
        .into_iter()
        .map(|entry| {
            let data = entry.order.get().as_bytes().to_vec();
            let mut headers: FieldTable = base
                .iter()
                .cloned()
                .collect::<std::collections::BTreeMap<_, _>>()
                .into();
            for (name, value) in [
                (HEADER_SIGNATURE, entry.signature),
                (HEADER_REQUEST_ID, entry.http_request_id),
                (HEADER_TRACEPARENT, entry.traceparent),
                (HEADER_TRACESTATE, entry.tracestate),
            ] {
                if let Some(value) = value {
                    headers.insert(name.into(), AMQPValue::LongString(value.into()));
                }
            }
            let mut part = properties
                .clone()
                .with_content_type(CONTENT_TYPE_ORDER.into())
                .with_headers(headers);
            // The body is not trusted yet: only a well-formed id names the message (an AMQP
            // short string holds 255 bytes at most).
            let id = serde_json::from_slice::<Named>(&data)
                .ok()
                .and_then(|named| uuid::Uuid::parse_str(&named.request_id).ok())
                .map_or_else(String::new, |id| id.to_string());
            part = part.with_message_id(ShortString::from(id));
            Part {
                data,
                properties: part,
            }
        })
        .collect();
    Ok(parts)
}

/// The single-order messages a message stands for: a batch's parts, or the message itself
/// as one part.
pub fn messages(data: &[u8], properties: &BasicProperties) -> Result<Vec<Part>, Malformed> {
    if is_batch(properties) {
        unpack(data, properties)
    } else {
        Ok(vec![Part {
            data: data.to_vec(),
            properties: properties.clone(),
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(properties: &BasicProperties, name: &str) -> Option<String> {
        properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(name))
            .and_then(|v| match v {
                AMQPValue::LongString(s) => Some(s.to_string()),
                AMQPValue::LongInt(n) => Some(n.to_string()),
                _ => None,
            })
    }

    #[test]
    fn each_part_is_the_single_message_it_stands_for() {
        let signer = OrderSigner::new("key");
        // Spacing a serializer would not write: the part must keep the bytes signed.
        let (r1, r2) = (
            uuid::Uuid::now_v7().to_string(),
            uuid::Uuid::now_v7().to_string(),
        );
        let first = format!(r#"{{"request_id":"{r1}", "user_id":1,"product_id":7}}"#);
        let second = format!(r#"{{"request_id":"{r2}","user_id":2,"product_id":8,"note":"a\"b"}}"#);
        let (first, second) = (first.as_bytes(), second.as_bytes());
        let orders = [
            Outgoing {
                request_id: &r1,
                http_request_id: "h1",
                payload: first,
                trace: TraceHeaders {
                    traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                    tracestate: "a=1",
                },
            },
            Outgoing {
                request_id: &r2,
                http_request_id: "h\"2",
                payload: second,
                trace: TraceHeaders::default(),
            },
        ];
        let body = encode(&signer, &orders);
        let props = properties(orders.len());
        assert!(is_batch(&props));
        assert_eq!(header(&props, HEADER_ORDERS).as_deref(), Some("2"));
        let parts = unpack(&body, &props).expect("unpack");
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].data, first);
        assert_eq!(parts[1].data, second);
        for (part, id, http) in [
            (&parts[0], r1.as_str(), "h1"),
            (&parts[1], r2.as_str(), "h\"2"),
        ] {
            assert!(!is_batch(&part.properties));
            assert_eq!(
                part.properties.message_id().as_ref().map(|m| m.as_str()),
                Some(id)
            );
            assert_eq!(
                header(&part.properties, HEADER_REQUEST_ID).as_deref(),
                Some(http)
            );
            assert_eq!(
                header(&part.properties, HEADER_ATTEMPT).as_deref(),
                Some("0")
            );
            assert_eq!(header(&part.properties, HEADER_ORDERS), None);
            let signature = header(&part.properties, HEADER_SIGNATURE);
            assert!(signer.verify(&part.data, signature.as_deref()).is_ok());
        }
        assert_eq!(
            header(&parts[0].properties, HEADER_TRACESTATE).as_deref(),
            Some("a=1")
        );
        assert_eq!(header(&parts[1].properties, HEADER_TRACEPARENT), None);
    }

    #[test]
    fn a_part_signed_with_another_key_fails_alone() {
        let genuine = OrderSigner::new("key");
        let forger = OrderSigner::new("other");
        let payload = br#"{"request_id":"r"}"#;
        let one = |signer: &OrderSigner| {
            encode(
                signer,
                &[Outgoing {
                    request_id: "r",
                    http_request_id: "",
                    payload,
                    trace: TraceHeaders::default(),
                }],
            )
        };
        // Splice a forged part beside a genuine one.
        let good = String::from_utf8(one(&genuine)).expect("utf8");
        let bad = String::from_utf8(one(&forger)).expect("utf8");
        let inner = |s: &str| s["{\"orders\":[".len()..s.len() - 2].to_string();
        let spliced = format!("{{\"orders\":[{},{}]}}", inner(&good), inner(&bad));
        let parts = unpack(spliced.as_bytes(), &properties(2)).expect("unpack");
        let verdicts: Vec<bool> = parts
            .iter()
            .map(|p| {
                genuine
                    .verify(&p.data, header(&p.properties, HEADER_SIGNATURE).as_deref())
                    .is_ok()
            })
            .collect();
        assert_eq!(verdicts, [true, false]);
    }

    #[test]
    fn the_batch_headers_a_queue_adds_carry_over_to_each_part() {
        let signer = OrderSigner::new("key");
        let body = encode(
            &signer,
            &[Outgoing {
                request_id: "r",
                http_request_id: "h",
                payload: br#"{"request_id":"r"}"#,
                trace: TraceHeaders::default(),
            }],
        );
        let mut headers = properties(1).headers().clone().expect("headers");
        headers.insert("x-delivery-count".into(), AMQPValue::LongInt(3));
        headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongInt(2));
        let props = properties(1).with_headers(headers);
        let parts = unpack(&body, &props).expect("unpack");
        assert_eq!(
            header(&parts[0].properties, "x-delivery-count").as_deref(),
            Some("3")
        );
        assert_eq!(
            header(&parts[0].properties, HEADER_ATTEMPT).as_deref(),
            Some("2")
        );
    }

    #[test]
    fn what_is_not_a_batch_is_malformed_whole() {
        let props = properties(1);
        for body in [
            &b"not json"[..],
            br#"{"orders":[]}"#,
            br#"{"orders":[{"signature":"v1:00"}]}"#,
            br#"{"request_id":"r"}"#,
        ] {
            assert!(
                unpack(body, &props).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let many = format!(
            "{{\"orders\":[{}]}}",
            vec![r#"{"order":{}}"#; MAX_ORDERS + 1].join(",")
        );
        assert!(unpack(many.as_bytes(), &props).is_err());
    }

    #[test]
    fn only_one_json_value_alone_is_embeddable() {
        assert!(embeddable(br#"{"request_id":"r"}"#));
        assert!(!embeddable(br#"{"request_id":"r""#));
        assert!(!embeddable(br#"{"a":1} {"b":2}"#));
        assert!(!embeddable(b""));
        // Whitespace around the value would not come out of the batch: its signature would
        // then fail.
        assert!(!embeddable(b" {\"a\":1}\n"));
    }

    #[test]
    fn a_crafted_part_cannot_name_its_message_with_anything_but_a_uuid() {
        let long = "x".repeat(300);
        let id = uuid::Uuid::now_v7().to_string();
        let body = format!(
            r#"{{"orders":[{{"order":{{"request_id":"{long}"}}}},{{"order":{{"request_id":"{id}"}}}}]}}"#
        );
        let parts = unpack(body.as_bytes(), &properties(2)).expect("unpack");
        let ids: Vec<String> = parts
            .iter()
            .map(|p| {
                p.properties
                    .message_id()
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(ids, [String::new(), id]);
    }

    #[test]
    fn long_batch_headers_are_not_copied_onto_every_part() {
        let mut headers = properties(1).headers().clone().expect("headers");
        headers.insert(
            "x-error-message".into(),
            AMQPValue::LongString("e".repeat(5000).into()),
        );
        headers.insert(
            "x-error-code".into(),
            AMQPValue::LongString("rejected".into()),
        );
        let body = br#"{"orders":[{"order":{"request_id":"r"}}]}"#;
        let parts = unpack(body, &properties(1).with_headers(headers)).expect("unpack");
        assert_eq!(header(&parts[0].properties, "x-error-message"), None);
        assert_eq!(
            header(&parts[0].properties, "x-error-code").as_deref(),
            Some("rejected")
        );
    }

    #[test]
    fn an_oversized_body_is_refused_before_it_is_read() {
        let body = vec![b' '; MAX_BODY + 1];
        assert!(unpack(&body, &properties(1)).is_err());
    }
}
