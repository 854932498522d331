//! HTTP plumbing every service shares, so the three speak one contract.
//!
//! Layout:
//! - [`error`] — the JSON error body `{"code","message"}` and typed path parameters whose
//!   rejection is a 400 in that shape, never axum's plain-text one.
//! - [`ops`] — `/healthz`, `/readyz`, `/metrics`.
//! - [`layers`] — request ids, access log spans and per-route request metrics.
//! - [`shutdown`] — SIGINT/SIGTERM folded into one cancellation token.

pub mod error;
pub mod layers;
pub mod ops;
pub mod shutdown;

pub use error::{ErrorBody, JsonBody, PathId, QueryParams, error_response};

/// Whether `text` is a non-empty run of ASCII letters, digits and `-_.:` — safe to carry in
/// a header, a log field, a comma-separated list or an AMQP header without escaping.
pub fn is_plain_token(text: &[u8]) -> bool {
    !text.is_empty()
        && text
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}
