//! The gateway's own error responses (its refusals, and its answers for an upstream that
//! failed or is gone), in the contract's JSON shape (`{"code","message"}`,
//! see `seckill_http::ErrorBody`), built straight into a [`seckill_http1::Response`]: the
//! same bytes axum's `Json` would give, without a trip through its body types.

use axum::http::StatusCode;
use bytes::Bytes;
use serde::Serialize;

use seckill_http1::{Response, with_date};

/// `seckill_http::ErrorBody`, borrowed: serialised without copying its strings.
#[derive(Serialize)]
struct ErrorBody<'a> {
    code: &'a str,
    message: &'a str,
}

/// The JSON error response `{"code","message"}` with `status`, a content type and a `Date`.
pub fn response(status: StatusCode, code: &str, message: &str) -> Response {
    let mut response = Response::new(status);
    response.push_header(b"content-type", b"application/json");
    with_date(|date| response.push_header(b"date", date));
    match serde_json::to_vec(&ErrorBody { code, message }) {
        Ok(body) => response.body = Bytes::from(body),
        Err(e) => {
            // Two strings always serialise; kept as the axum path had it, should one not.
            tracing::error!(error = %e, "could not encode the gateway's own response");
            response = Response::new(StatusCode::INTERNAL_SERVER_ERROR);
        }
    }
    response
}

/// A 503 with `Retry-After: 1`.
pub fn unavailable(message: &str) -> Response {
    let mut response = response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
    response.push_header(b"retry-after", b"1");
    response
}
