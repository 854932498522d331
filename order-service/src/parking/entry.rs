//! What the parking lot holds: entries, their status, a dead letter as it arrives, and
//! the audit trail.

use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use lapin::types::AMQPValue;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use seckill_messaging::{HEADER_ATTEMPT, OrderMessage, OrderSigner};

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = DeadLetterStatus)]
pub enum Status {
    /// Waiting for an operator.
    Pending,
    /// Sent back to the orders queue.
    Redriven,
    /// Given up for good; its unit went back on sale (a forgery had none).
    Ignored,
    /// Failed again after too many redrives: no redrive until an operator clears it.
    Quarantined,
}

impl Status {
    /// Its name in the `dead_letters.status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Redriven => "redriven",
            Self::Ignored => "ignored",
            Self::Quarantined => "quarantined",
        }
    }
}

/// A dead letter as the operator sees it.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
#[schema(as = DeadLetter)]
pub struct Entry {
    /// The purchase's request id (or `sha256:<hex>` of a body that did not parse).
    pub event_id: String,
    /// The buyer, when the body parsed.
    pub user_id: Option<i64>,
    /// The product, when the body parsed.
    pub product_id: Option<i64>,
    /// Why it was given up (`unsigned`, `bad_signature`, `unparseable`, `unknown_product`,
    /// `out_of_stock`, `retries_exhausted`, `rejected`, …).
    pub error_code: String,
    /// The last error, for a human.
    pub last_error: String,
    /// Deliveries it had when given up.
    pub attempts: i32,
    /// Redrives so far.
    pub redrives: i32,
    /// pending, redriven, ignored or quarantined.
    #[schema(
        pattern = "^(pending|redriven|ignored|quarantined)$",
        example = "pending"
    )]
    pub status: String,
    /// When it was first dead-lettered.
    pub first_seen: DateTime<Utc>,
    /// When it was last dead-lettered.
    pub last_attempt: DateTime<Utc>,
    /// Who last acted on it.
    pub operator: Option<String>,
    /// The message body (non-UTF-8 bytes escaped).
    pub body: String,
}

/// A dead letter as it leaves the dead-letter queue, ready to be recorded.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// See [`Entry::event_id`].
    pub event_id: String,
    /// The buyer, if the body parsed.
    pub user_id: Option<i64>,
    /// The product, if the body parsed.
    pub product_id: Option<i64>,
    /// The body as published.
    pub body: Vec<u8>,
    /// Its order signature as published (kept for a redrive, which order-service cannot
    /// sign: a redriven message is accepted only if seckill-api signed it).
    pub signature: Option<String>,
    /// Why it was given up: the reason its headers give, or a refusal for its signature
    /// (`unsigned`, `bad_signature`) when that does not verify, whatever they say.
    pub error_code: String,
    /// The last error.
    pub last_error: String,
    /// Deliveries it had.
    pub attempts: i32,
    /// The W3C trace context it carried, published again by a redrive.
    pub traceparent: Option<String>,
}

impl Arrival {
    /// Reads what the dead-letter path attached: the event id from the body (or the AMQP
    /// message id, or a digest of the body), the reason from our headers, or from the
    /// broker's `x-death` when the message was rejected without them.
    ///
    /// The reason is taken at its word only from a message whose signature `signer` (the
    /// consumer's, with its previous key and its `accept_unsigned`) accepts: anyone who can
    /// publish to the dead-letter exchange can write any headers, and a forgery parked
    /// under a reason such as `rejected` would pass for a purchase holding a unit. Any other
    /// message is parked as refused for its signature, as the consumer would have refused
    /// it; the reason it claimed is kept in its last error.
    pub fn from_message(body: &[u8], properties: &BasicProperties, signer: &OrderSigner) -> Self {
        let headers = properties.headers().clone().unwrap_or_default();
        let text = |name: &str| -> Option<String> {
            headers.inner().get(name).and_then(|v| match v {
                AMQPValue::LongString(s) => Some(s.to_string()),
                AMQPValue::ShortString(s) => Some(s.to_string()),
                _ => None,
            })
        };
        let attempts = headers
            .inner()
            .get(HEADER_ATTEMPT)
            .and_then(|v| match v {
                AMQPValue::LongInt(n) => Some(*n),
                AMQPValue::LongLongInt(n) => i32::try_from(*n).ok(),
                AMQPValue::ShortInt(n) => Some(i32::from(*n)),
                AMQPValue::LongUInt(n) => i32::try_from(*n).ok(),
                _ => None,
            })
            .unwrap_or(0)
            // The attempt header counts retries; the deliveries are one more.
            .saturating_add(1);
        let parsed = serde_json::from_slice::<OrderMessage>(body).ok();
        let event_id = match (&parsed, properties.message_id()) {
            (Some(msg), _) => msg.request_id.to_string(),
            (None, Some(id)) if !id.as_str().is_empty() => id.to_string(),
            (None, _) => format!("sha256:{:x}", sha2::Sha256::digest(body)),
        };
        let signature = text(seckill_messaging::HEADER_SIGNATURE);
        let claimed_code =
            text(seckill_messaging::HEADER_ERROR_CODE).unwrap_or_else(|| "rejected".to_string());
        let claimed_error = text(seckill_messaging::HEADER_ERROR_MESSAGE)
            .unwrap_or_else(|| "rejected without a reason (see x-death)".to_string());
        let (error_code, last_error) = match signer.verify(body, signature.as_deref()) {
            Ok(()) => (claimed_code, claimed_error),
            Err(refused) if refused.code() == claimed_code => (claimed_code, claimed_error),
            Err(refused) => (
                refused.code().to_string(),
                format!("{refused} (it claimed {claimed_code}: {claimed_error})"),
            ),
        };
        Self {
            event_id,
            user_id: parsed.as_ref().map(|m| m.user_id),
            product_id: parsed.as_ref().map(|m| m.product_id),
            body: body.to_vec(),
            signature,
            error_code,
            last_error,
            attempts,
            traceparent: text(seckill_messaging::HEADER_TRACEPARENT)
                .filter(|t| seckill_telemetry::TraceParent::parse_str(t).is_some()),
        }
    }
}

/// An audit row.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Its id.
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub operator: String,
    /// redrive, ignore or clear.
    #[schema(pattern = "^(redrive|ignore|clear)$", example = "redrive")]
    pub action: String,
    /// Whether it only reported.
    pub dry_run: bool,
    /// The selection as given.
    #[schema(value_type = Object)]
    pub selection: serde_json::Value,
    /// The entries it applied to.
    pub event_ids: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The service's signer in these tests.
    fn signer() -> OrderSigner {
        OrderSigner::new("the-key")
    }

    /// Properties of a dead letter with `error_code` and `signature` (if any) as headers.
    fn dead_letter(error_code: &str, signature: Option<String>) -> BasicProperties {
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            seckill_messaging::HEADER_ERROR_CODE.into(),
            AMQPValue::LongString(error_code.into()),
        );
        headers.insert(
            seckill_messaging::HEADER_ERROR_MESSAGE.into(),
            AMQPValue::LongString("no stock left".into()),
        );
        if let Some(signature) = signature {
            headers.insert(
                seckill_messaging::HEADER_SIGNATURE.into(),
                AMQPValue::LongString(signature.into()),
            );
        }
        BasicProperties::default().with_headers(headers)
    }

    fn purchase() -> OrderMessage {
        OrderMessage {
            request_id: uuid::Uuid::now_v7(),
            user_id: 7,
            product_id: 9,
            price_cents: 100,
            created_at: Utc::now(),
            bucket: None,
        }
    }

    #[test]
    fn an_arrival_takes_its_id_from_the_body_or_a_digest() {
        let msg = purchase();
        let body = serde_json::to_vec(&msg).unwrap();
        let mut headers = lapin::types::FieldTable::default();
        headers.insert(
            seckill_messaging::HEADER_SIGNATURE.into(),
            AMQPValue::LongString(signer().sign(&body).into()),
        );
        let signed = BasicProperties::default().with_headers(headers);
        let arrival = Arrival::from_message(&body, &signed, &signer());
        assert_eq!(arrival.event_id, msg.request_id.to_string());
        assert_eq!((arrival.user_id, arrival.product_id), (Some(7), Some(9)));
        assert_eq!(arrival.error_code, "rejected");
        assert_eq!(arrival.attempts, 1);

        let unsigned = BasicProperties::default();
        let garbage = Arrival::from_message(b"not json", &unsigned, &signer());
        let again = Arrival::from_message(b"not json", &unsigned, &signer());
        assert!(garbage.event_id.starts_with("sha256:"));
        assert_eq!(
            garbage.event_id, again.event_id,
            "the same body, the same entry"
        );
        assert_eq!(garbage.user_id, None);
    }

    #[test]
    fn a_dead_letter_is_taken_at_its_word_only_when_its_signature_verifies() {
        let msg = purchase();
        let body = serde_json::to_vec(&msg).unwrap();
        let genuine = Arrival::from_message(
            &body,
            &dead_letter("out_of_stock", Some(signer().sign(&body))),
            &signer(),
        );
        assert_eq!(genuine.error_code, "out_of_stock");
        assert_eq!(genuine.last_error, "no stock left");

        let forged = OrderSigner::new("another-key").sign(&body);
        let badly_signed =
            Arrival::from_message(&body, &dead_letter("out_of_stock", Some(forged)), &signer());
        assert_eq!(badly_signed.error_code, "bad_signature");
        assert!(
            badly_signed
                .last_error
                .contains("claimed out_of_stock: no stock left"),
            "{}",
            badly_signed.last_error
        );
        let unsigned = Arrival::from_message(&body, &dead_letter("rejected", None), &signer());
        assert_eq!(unsigned.error_code, "unsigned");
        assert_eq!(unsigned.event_id, msg.request_id.to_string());
    }

    #[test]
    fn an_unsigned_dead_letter_is_genuine_while_unsigned_ones_are_accepted() {
        let body = serde_json::to_vec(&purchase()).unwrap();
        let upgrading = signer().accepting_unsigned(true);
        let unsigned = Arrival::from_message(&body, &dead_letter("rejected", None), &upgrading);
        assert_eq!(unsigned.error_code, "rejected");
        let forged = OrderSigner::new("another-key").sign(&body);
        let badly_signed =
            Arrival::from_message(&body, &dead_letter("rejected", Some(forged)), &upgrading);
        assert_eq!(
            badly_signed.error_code, "bad_signature",
            "a wrong one never is"
        );
    }
}
