//! The order message's signature: who may create an order.
//!
//! Anyone who can publish to the order queue could otherwise order anything for anyone, so
//! seckill-api signs each order message's body and order-service checks it before it does
//! anything with the message. Format (DESIGN.md §5), in the AMQP header
//! [`HEADER_SIGNATURE`]:
//!
//! ```text
//! x-order-signature: v1:<hex(HMAC-SHA256(key, "seckill-order-v1\n" ‖ body))>
//! ```
//!
//! The body is what is signed because it is all order-service trusts: the request id in it
//! is the order's idempotency key, and the AMQP `message_id` and other headers only name the
//! message in logs (an order-service copy rewrites its attempt header; the signature stays
//! valid). The `v1:` prefix names the format so another can be added beside it; the label
//! inside the MAC keeps a key shared by mistake with another use from signing orders.
//! A previous key can be accepted too, so a key is rotated without dropping messages in
//! flight: verify with both, sign with the new one, then retire the old.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// AMQP header carrying an order message's signature.
pub const HEADER_SIGNATURE: &str = "x-order-signature";

/// The format version written before the MAC.
const VERSION: &str = "v1:";
/// Domain label hashed before the body.
const LABEL: &[u8] = b"seckill-order-v1\n";

/// Why a message's signature was not accepted; [`Self::code`] is its dead-letter reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No signature header, or not a string.
    #[error("the message carries no {HEADER_SIGNATURE} header")]
    Unsigned,
    /// A signature in an unknown format, or one no accepted key made.
    #[error("the message's signature does not match its body")]
    Forged,
}

impl SignatureError {
    /// The dead-letter reason of every refusal. A message refused for its signature was
    /// never trusted for anything: parked under one of these, it holds no unit and names no
    /// buyer.
    pub const CODES: [&'static str; 2] = [Self::Unsigned.code(), Self::Forged.code()];

    /// The snake_case code a dead letter is given for it.
    pub const fn code(self) -> &'static str {
        match self {
            Self::Unsigned => "unsigned",
            Self::Forged => "bad_signature",
        }
    }
}

/// Signs order messages with the current key and verifies them against it (and a previous
/// key, during a rotation). Cheap to clone.
#[derive(Clone)]
pub struct OrderSigner {
    /// HMAC state with the key absorbed, cloned per message.
    current: Hmac<Sha256>,
    /// The key being retired, accepted but never used to sign.
    previous: Option<Hmac<Sha256>>,
    /// During the first roll-out of signing only: a message with no signature at all (from a
    /// seckill-api of before, or parked before) passes; a wrong one never does.
    accept_unsigned: bool,
}

impl std::fmt::Debug for OrderSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderSigner")
            .field("accepts_previous", &self.previous.is_some())
            .field("accept_unsigned", &self.accept_unsigned)
            .finish_non_exhaustive()
    }
}

impl OrderSigner {
    /// Signs and verifies with `key`.
    pub fn new(key: &str) -> Self {
        Self {
            current: keyed(key),
            previous: None,
            accept_unsigned: false,
        }
    }

    /// Also accepts messages signed with `previous` (ignored when empty).
    pub fn accepting_previous(mut self, previous: &str) -> Self {
        self.previous = (!previous.is_empty()).then(|| keyed(previous));
        self
    }

    /// Also accepts messages carrying no signature when `accept` (the upgrade to signed
    /// messages: purchases accepted before it are in the queues and the parking lot unsigned).
    pub fn accepting_unsigned(mut self, accept: bool) -> Self {
        self.accept_unsigned = accept;
        self
    }

    /// The value of [`HEADER_SIGNATURE`] for `body`.
    pub fn sign(&self, body: &[u8]) -> String {
        let tag = mac(&self.current, body).finalize().into_bytes();
        let mut out = String::with_capacity(VERSION.len() + tag.len() * 2);
        out.push_str(VERSION);
        for byte in tag {
            out.push(char::from(HEX[usize::from(byte >> 4)]));
            out.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        out
    }

    /// Whether `signature` (the header's value, if any) was made for `body` by an accepted
    /// key. The comparison takes the same time wherever the tags differ.
    pub fn verify(&self, body: &[u8], signature: Option<&str>) -> Result<(), SignatureError> {
        let Some(signature) = signature else {
            return if self.accept_unsigned {
                Ok(())
            } else {
                Err(SignatureError::Unsigned)
            };
        };
        let tag = signature
            .strip_prefix(VERSION)
            .and_then(unhex)
            .ok_or(SignatureError::Forged)?;
        let accepted = std::iter::once(&self.current)
            .chain(&self.previous)
            .any(|key| mac(key, body).verify_slice(&tag).is_ok());
        if accepted {
            Ok(())
        } else {
            Err(SignatureError::Forged)
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn keyed(key: &str) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("HMAC accepts keys of any length")
}

fn mac(keyed: &Hmac<Sha256>, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = keyed.clone();
    mac.update(LABEL);
    mac.update(body);
    mac
}

/// The bytes of a lowercase or uppercase hex string of 32 bytes; `None` otherwise.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 64 {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16).map(|d| d as u8);
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_v1_and_the_hex_hmac_sha256_of_the_label_and_body() {
        // Computed independently, with Python:
        // hmac.new(b"k", b"seckill-order-v1\n" + b'{"user_id":1}', hashlib.sha256).hexdigest()
        let signer = OrderSigner::new("k");
        assert_eq!(
            signer.sign(br#"{"user_id":1}"#),
            "v1:acae3ad8defc3a07ca83164172c7f34157f44d35f856cf7b4dff7e21c5e58cef"
        );
    }

    #[test]
    fn a_signed_body_verifies_and_any_change_does_not() {
        let signer = OrderSigner::new("key");
        let body = br#"{"user_id":1,"price_cents":500}"#;
        let signature = signer.sign(body);
        assert_eq!(signer.verify(body, Some(&signature)), Ok(()));
        assert_eq!(
            signer.verify(br#"{"user_id":2,"price_cents":500}"#, Some(&signature)),
            Err(SignatureError::Forged)
        );
        assert_eq!(signer.verify(body, None), Err(SignatureError::Unsigned));
        let other_key = OrderSigner::new("other").sign(body);
        assert_eq!(
            signer.verify(body, Some(&other_key)),
            Err(SignatureError::Forged)
        );
        for malformed in ["", "v1:", "v2:00", &signature[3..], &signature[..40]] {
            assert_eq!(
                signer.verify(body, Some(malformed)),
                Err(SignatureError::Forged),
                "{malformed:?}"
            );
        }
        let upper = format!("v1:{}", signature[3..].to_uppercase());
        assert_eq!(signer.verify(body, Some(&upper)), Ok(()));
    }

    #[test]
    fn accepting_unsigned_lets_a_missing_signature_through_but_never_a_wrong_one() {
        let body = br#"{"request_id":"a"}"#;
        let upgrading = OrderSigner::new("key").accepting_unsigned(true);
        assert_eq!(upgrading.verify(body, None), Ok(()));
        let wrong = OrderSigner::new("other").sign(body);
        assert_eq!(
            upgrading.verify(body, Some(&wrong)),
            Err(SignatureError::Forged)
        );
        let strict = OrderSigner::new("key").accepting_unsigned(false);
        assert_eq!(strict.verify(body, None), Err(SignatureError::Unsigned));
    }

    #[test]
    fn a_previous_key_is_accepted_but_never_signs() {
        let body = b"{}";
        let old = OrderSigner::new("old").sign(body);
        let rotating = OrderSigner::new("new").accepting_previous("old");
        assert_eq!(rotating.verify(body, Some(&old)), Ok(()));
        assert_eq!(rotating.sign(body), OrderSigner::new("new").sign(body));
        let not_rotating = OrderSigner::new("new").accepting_previous("");
        assert_eq!(
            not_rotating.verify(body, Some(&old)),
            Err(SignatureError::Forged)
        );
    }
}
