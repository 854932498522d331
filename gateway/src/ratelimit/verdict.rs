//! What a quota says about one request, and the headers that tell the client.

use axum::http::StatusCode;

use seckill_http1::Response;

use crate::error;

const X_RATELIMIT_LIMIT: &[u8] = b"x-ratelimit-limit";
const X_RATELIMIT_REMAINING: &[u8] = b"x-ratelimit-remaining";
const X_RATELIMIT_RESET: &[u8] = b"x-ratelimit-reset";
const RETRY_AFTER: &[u8] = b"retry-after";

/// What a quota says about one request.
#[derive(Debug)]
pub enum Verdict {
    /// Let through; the response carries the quota's headers.
    Allowed {
        /// The burst, for `x-ratelimit-limit`.
        limit: u32,
        /// Requests left right now, for `x-ratelimit-remaining`.
        remaining: u64,
    },
    /// Refused: a 429.
    Limited {
        /// The burst, for `x-ratelimit-limit`.
        limit: u32,
        /// Whole seconds until the next request would pass (already rounded up, at least 1),
        /// for `Retry-After` and `x-ratelimit-reset`.
        wait_secs: u64,
    },
    /// No quota applies (switched off), or its Redis did not answer (fail open).
    Unmetered,
    /// Its Redis did not answer and the limits fail closed: a 503.
    Unavailable,
}

impl Verdict {
    /// Puts the quota's headers on a response: `x-ratelimit-limit` and `-remaining`, and on a
    /// refusal `Retry-After` and `x-ratelimit-reset` too.
    pub fn annotate(&self, response: &mut Response) {
        let mut number = itoa::Buffer::new();
        let (limit, remaining, wait_secs) = match *self {
            Self::Allowed { limit, remaining } => (limit, remaining, None),
            Self::Limited { limit, wait_secs } => (limit, 0, Some(wait_secs)),
            Self::Unmetered | Self::Unavailable => return,
        };
        response.push_header(X_RATELIMIT_LIMIT, number.format(limit).as_bytes());
        response.push_header(X_RATELIMIT_REMAINING, number.format(remaining).as_bytes());
        if let Some(wait) = wait_secs {
            response.push_header(RETRY_AFTER, number.format(wait).as_bytes());
            response.push_header(X_RATELIMIT_RESET, number.format(wait).as_bytes());
        }
    }

    /// The JSON 429 when the request was refused, with the quota's headers; the 503 when
    /// the quota could not be asked and the limits fail closed.
    pub fn refusal(&self) -> Option<Response> {
        match self {
            Self::Limited { .. } => {}
            // 503, not 429: the client did nothing wrong and is not over its quota; the
            // gateway cannot meter it right now, and `Retry-After: 1` says to come back.
            Self::Unavailable => {
                return Some(error::unavailable(
                    "rate limiting is unavailable, retry shortly",
                ));
            }
            _ => return None,
        }
        let mut response = error::response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests, retry later",
        );
        self.annotate(&mut response);
        Some(response)
    }
}
