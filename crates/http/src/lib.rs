//! HTTP plumbing every service shares, so the three speak one contract.
//!
//! Layout:
//! - [`error`] — the JSON error body `{"code","message"}` and typed path parameters whose
//!   rejection is a 400 in that shape, never axum's plain-text one.
//! - [`ops`] — `/healthz`, `/readyz`, `/metrics`.
//! - [`layers`] — request ids, access log spans and per-route request metrics.
//! - [`shutdown`] — SIGINT/SIGTERM folded into one cancellation token.
//! - [`failpoint`] — the [`failpoint!`] macro: step boundaries where tests inject failures.

pub mod error;
pub mod failpoint;
pub mod layers;
pub mod ops;
pub mod request_metrics;
pub mod shutdown;

pub use error::{ErrorBody, JsonBody, PathId, QueryParams, SOLD_OUT_HEADER, error_response};

/// Whether `text` is a non-empty run of ASCII letters, digits and `-_.:` — safe to carry in
/// a header, a log field, a comma-separated list or an AMQP header without escaping.
pub fn is_plain_token(text: &[u8]) -> bool {
    !text.is_empty()
        && text
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Writes `bytes` as lower-case hex into `out`, which must be twice as long.
pub fn write_hex(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    assert_eq!(out.len(), bytes.len() * 2, "two hex digits per byte");
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_two_lower_case_digits_per_byte() {
        let mut out = [0u8; 6];
        super::write_hex(&[0x00, 0xab, 0x7f], &mut out);
        assert_eq!(&out, b"00ab7f");
    }
}
