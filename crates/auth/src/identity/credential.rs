//! The credential's wire format (version 2) and the gateway's side of it: signing.
//!
//! The MAC is the hex HMAC-SHA256, under the key of the target service, of nine fields each
//! followed by `\n`:
//!
//! ```text
//! v2\n{service}\n{method}\n{target}\n{request_id}\n{user_id}\n{roles}\n{ts}\n{body_sha256}\n
//! ```
//!
//! `service` is the name of the backend the request is sent to (`seckill-api`,
//! `order-service`); `method` and `target` (path and query) are the request line as
//! forwarded; `request_id` is the forwarded `x-request-id`; `user_id`, `roles` and `ts` are
//! the values of `x-user-id`, `x-user-roles` and `x-identity-ts` as they travel; and
//! `body_sha256` is the lower-case hex SHA-256 of the body bytes, or the empty string when the
//! body is empty (no body and a zero-length body are the same request to a backend). No field
//! can hold a `\n`: the request line and header values are parsed HTTP, roles are plain
//! tokens. The header carries the version: `x-identity-sig: v2=<64 hex digits>`.

use axum::http::{HeaderMap, HeaderValue};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::IDENTITY_HEADERS;

/// The format version, first field of the signed text and prefix of the signature header.
pub const VERSION: &str = "v2";

/// What a credential is bound to besides the caller: the request as the backend receives it.
#[derive(Debug, Clone, Copy)]
pub struct RequestFacts<'a> {
    /// The method, e.g. `POST`.
    pub method: &'a str,
    /// Path and query exactly as in the forwarded request line.
    pub target: &'a str,
    /// The forwarded `x-request-id`.
    pub request_id: &'a str,
    /// The body bytes.
    pub body: &'a [u8],
}

/// The hex SHA-256 of `body`, or nothing for an empty body; written into `out`, the length
/// used returned.
pub fn body_digest(body: &[u8], out: &mut [u8; 64]) -> usize {
    if body.is_empty() {
        return 0;
    }
    seckill_http::write_hex(&Sha256::digest(body), out);
    64
}

/// The MAC over the version-2 fields; `keyed` holds the service's key already.
pub(super) fn mac(
    keyed: &Hmac<Sha256>,
    service: &str,
    facts: &RequestFacts<'_>,
    caller: [&str; 3],
) -> Hmac<Sha256> {
    let mut digest = [0u8; 64];
    let digest_len = body_digest(facts.body, &mut digest);
    let mut mac = keyed.clone();
    let [user_id, roles, ts] = caller;
    let fields: [&[u8]; 9] = [
        VERSION.as_bytes(),
        service.as_bytes(),
        facts.method.as_bytes(),
        facts.target.as_bytes(),
        facts.request_id.as_bytes(),
        user_id.as_bytes(),
        roles.as_bytes(),
        ts.as_bytes(),
        &digest[..digest_len],
    ];
    for field in fields {
        mac.update(field);
        mac.update(b"\n");
    }
    mac
}

/// HMAC state with `key` absorbed: cloned per signature instead of hashing the key each time.
pub(super) fn keyed(key: &str) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("HMAC accepts keys of any length")
}

/// Signs identity for one backend service with that service's key (the gateway holds one
/// signer per upstream service).
#[derive(Clone)]
pub struct IdentitySigner {
    keyed: Hmac<Sha256>,
    /// The service the credentials are for: part of what is signed.
    service: String,
}

impl std::fmt::Debug for IdentitySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentitySigner")
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl IdentitySigner {
    /// A signer of credentials for `service`, under `key`.
    pub fn new(key: &str, service: &str) -> Self {
        Self {
            keyed: keyed(key),
            service: service.to_string(),
        }
    }

    /// Replaces any identity headers in `headers` with ones signed now for `facts`.
    pub fn sign_into(
        &self,
        headers: &mut HeaderMap,
        user_id: i64,
        roles: &[String],
        facts: &RequestFacts<'_>,
    ) {
        let ts = chrono::Utc::now().timestamp_millis();
        self.sign_at(user_id, &super::join_roles(roles), ts, facts, |values| {
            // `insert` replaces every value a client sent under the name; each of the four
            // is set, so none of the client's survives.
            for (name, value) in IDENTITY_HEADERS.into_iter().zip(values) {
                match HeaderValue::from_bytes(value) {
                    Ok(value) => {
                        headers.insert(name, value);
                    }
                    // Digits, hex and plain role names are always valid; were one not, the
                    // client's must still go.
                    Err(_) => {
                        headers.remove(name);
                    }
                }
            }
        });
    }

    /// Appends the four identity header lines (`name: value\r\n`) signed now for `facts` to
    /// `out`; `roles` joined by [`super::join_roles`]. The caller must not forward any
    /// client-sent identity header.
    pub fn write_lines(
        &self,
        out: &mut Vec<u8>,
        user_id: i64,
        roles: &str,
        facts: &RequestFacts<'_>,
    ) {
        let ts = chrono::Utc::now().timestamp_millis();
        self.sign_at(user_id, roles, ts, facts, |values| {
            for (name, value) in IDENTITY_HEADERS.iter().zip(values) {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        });
    }

    /// Calls `with` with the four header values for `user_id` and `roles` (already joined)
    /// signed at `ts` (unix ms), in the order of [`IDENTITY_HEADERS`]; they live on the
    /// stack, nothing is allocated per signature.
    pub fn sign_at(
        &self,
        user_id: i64,
        roles: &str,
        ts: i64,
        facts: &RequestFacts<'_>,
        with: impl FnOnce([&[u8]; 4]),
    ) {
        let mut user = itoa::Buffer::new();
        let user = user.format(user_id);
        let mut ts_text = itoa::Buffer::new();
        let ts = ts_text.format(ts);
        let mac = mac(&self.keyed, &self.service, facts, [user, roles, ts]);
        let mut sig = *b"v2=0000000000000000000000000000000000000000000000000000000000000000";
        seckill_http::write_hex(&mac.finalize().into_bytes(), &mut sig[3..]);
        with([user.as_bytes(), roles.as_bytes(), ts.as_bytes(), &sig]);
    }
}
