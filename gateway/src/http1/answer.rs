//! An answer on its way to the client, and its encoding on the wire.
//!
//! A replica's answer arrives here as its end-to-end header lines, copied as they came, and
//! its body read whole ([`crate::proxy::pool`]); the gateway's own answers (errors, the
//! operator endpoints) are axum responses turned into the same form. Either way the
//! connection writes one status line, the lines, its own framing and the body, in one write
//! when the body is small.

use std::cell::RefCell;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;

/// Largest body written in the same buffer as the head; a larger one is written after it.
const INLINE_BODY: usize = 16 * 1024;
/// Largest body of the gateway's own answers (errors, metrics).
const MAX_LOCAL_BODY: usize = 16 * 1024 * 1024;

/// An answer for the client.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// End-to-end header lines, each `name: value\r\n`: never `Content-Length`,
    /// `Transfer-Encoding` or `Connection`, which are the connection's to write — except a
    /// replica's `Content-Length` on an answer to `HEAD` (see `length_given`).
    pub headers: Vec<u8>,
    /// The body, read whole.
    pub body: Bytes,
    /// The headers already say what length a `GET` would get (a replica's answer to
    /// `HEAD`): none is added, and no body follows.
    pub length_given: bool,
}

impl Answer {
    /// An answer with `status` and no headers or body yet.
    pub fn new(status: StatusCode) -> Self {
        Self {
            status,
            headers: Vec::with_capacity(256),
            body: Bytes::new(),
            length_given: false,
        }
    }

    /// Adds the header line `name: value` ([`header_line`]).
    pub fn push_header(&mut self, name: &[u8], value: &[u8]) {
        header_line(&mut self.headers, name, value);
    }

    /// The value of the first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.lines()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// Every header line as `(name, value)`.
    pub fn lines(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers
            .split(|&b| b == b'\n')
            .filter_map(|line| line.strip_suffix(b"\r"))
            .filter_map(|line| {
                let colon = line.iter().position(|&b| b == b':')?;
                Some((&line[..colon], line[colon + 1..].trim_ascii()))
            })
    }

    /// The gateway's own answer from an axum response (errors, operator endpoints), with a
    /// `Date`.
    pub async fn from_response(response: Response) -> Self {
        let (parts, body) = response.into_parts();
        let mut answer = Self::new(parts.status);
        for (name, value) in &parts.headers {
            let framing = name == axum::http::header::CONTENT_LENGTH
                || name == axum::http::header::TRANSFER_ENCODING
                || name == axum::http::header::CONNECTION;
            if !framing {
                answer.push_header(name.as_str().as_bytes(), value.as_bytes());
            }
        }
        if !parts.headers.contains_key(axum::http::header::DATE) {
            with_date(|date| answer.push_header(b"date", date));
        }
        answer.body = match axum::body::to_bytes(body, MAX_LOCAL_BODY).await {
            Ok(body) => body,
            Err(e) => {
                tracing::error!(error = %e, "could not read the gateway's own answer");
                answer.status = StatusCode::INTERNAL_SERVER_ERROR;
                Bytes::new()
            }
        };
        answer
    }

    /// The gateway's own JSON error answer (the contract's `{"code","message"}`).
    pub async fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self::from_response(seckill_http::error_response(status, code, message)).await
    }

    /// Writes the head into `out` (cleared first) and, when small, the body too; returns
    /// the body still to be written after `out` (empty when none).
    /// `head_request`: the request was `HEAD` (no body goes out); `close`: the connection
    /// ends after this answer; `http11`: the client speaks HTTP/1.1 (an HTTP/1.0 client
    /// that asked to keep the connection is told it is kept).
    pub fn encode(
        &self,
        out: &mut Vec<u8>,
        head_request: bool,
        close: bool,
        http11: bool,
    ) -> Bytes {
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(
            self.status
                .canonical_reason()
                .unwrap_or_default()
                .as_bytes(),
        );
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(&self.headers);
        // RFC 9110 §8.6: no length on 1xx and 204; on 304 it would describe another answer.
        let code = self.status.as_u16();
        let no_content = code < 200 || code == 204 || code == 304;
        if !no_content && !self.length_given {
            header_line(
                out,
                b"content-length",
                itoa::Buffer::new().format(self.body.len()).as_bytes(),
            );
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        } else if !http11 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
        out.extend_from_slice(b"\r\n");
        if no_content || head_request || self.length_given {
            return Bytes::new();
        }
        if self.body.len() <= INLINE_BODY {
            out.extend_from_slice(&self.body);
            return Bytes::new();
        }
        self.body.clone()
    }
}

/// Appends the header line `name: value\r\n` to `out`. The caller vouches that the name is
/// a token and the value holds no CR or LF.
pub fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

thread_local! {
    /// The `Date` value of the current second, formatted once per second per thread.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
}

/// Calls `f` with the current time as an HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn with_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs();
    DATE.with_borrow_mut(|(second, text)| {
        if *second != secs {
            let formatted = httpdate::fmt_http_date(now);
            if let Ok(fixed) = <[u8; 29]>::try_from(formatted.as_bytes()) {
                *text = fixed;
                *second = secs;
            }
        }
        f(&text[..])
    })
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn encoded(answer: &Answer, head_request: bool, close: bool, http11: bool) -> String {
        let mut out = Vec::new();
        let rest = answer.encode(&mut out, head_request, close, http11);
        out.extend_from_slice(&rest);
        String::from_utf8(out).expect("text")
    }

    #[test]
    fn an_answer_is_framed_by_its_status_and_the_request() {
        let mut answer = Answer::new(StatusCode::OK);
        answer.push_header(b"x-a", b"1");
        answer.body = Bytes::from_static(b"hello");
        assert_eq!(
            encoded(&answer, false, false, true),
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\n\r\nhello"
        );
        assert_eq!(
            encoded(&answer, true, true, true),
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\nconnection: close\r\n\r\n",
            "HEAD: the length a GET would get, no body"
        );
        assert_eq!(
            encoded(&answer, false, false, false),
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ncontent-length: 5\r\nconnection: keep-alive\r\n\r\nhello"
        );
        let mut replica_head = Answer::new(StatusCode::OK);
        replica_head.push_header(b"content-length", b"99");
        replica_head.length_given = true;
        assert_eq!(
            encoded(&replica_head, true, false, true),
            "HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"
        );
        let mut empty = Answer::new(StatusCode::NO_CONTENT);
        empty.body = Bytes::from_static(b"ignored");
        assert_eq!(
            encoded(&empty, false, false, true),
            "HTTP/1.1 204 No Content\r\n\r\n"
        );
        let odd = Answer::new(StatusCode::from_u16(599).expect("status"));
        assert!(encoded(&odd, false, false, true).starts_with("HTTP/1.1 599 \r\n"));
    }

    #[test]
    fn a_large_body_is_left_to_be_written_after_the_head() {
        let mut answer = Answer::new(StatusCode::OK);
        answer.body = Bytes::from(vec![b'x'; INLINE_BODY + 1]);
        let mut out = Vec::new();
        let rest = answer.encode(&mut out, false, false, true);
        assert!(out.ends_with(b"\r\n\r\n"));
        assert_eq!(rest.len(), INLINE_BODY + 1);
    }

    #[tokio::test]
    async fn the_gateways_own_answers_keep_their_headers_and_get_a_date() {
        let mut response = seckill_http::error_response(StatusCode::NOT_FOUND, "not_found", "no");
        response
            .headers_mut()
            .insert("x-b", HeaderValue::from_static("2"));
        let error = Answer::error(StatusCode::NOT_FOUND, "not_found", "no").await;
        let answer = Answer::from_response(response).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert_eq!(answer.header("X-B"), Some(&b"2"[..]));
        assert_eq!(
            answer.header("content-type"),
            Some(&b"application/json"[..])
        );
        let date = answer.header("date").expect("a date");
        assert!(httpdate::parse_http_date(std::str::from_utf8(date).expect("text")).is_ok());
        assert!(
            answer.header("content-length").is_none(),
            "framing is the connection's"
        );
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        assert_eq!(body["code"], "not_found");
        assert_eq!((error.status, &error.body), (answer.status, &answer.body));
    }
}
