//! A response on its way to the client, and its encoding on the wire.
//!
//! A replica's response arrives here as its end-to-end header lines, copied as they came,
//! and its body read whole ([`super::client`]); the gateway's own responses (refusals, the
//! operator endpoints) are built by the application in the same form. Either way the
//! connection writes one status line, the lines, its own framing and the body, in one write
//! when the body is small.

use std::cell::RefCell;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::StatusCode;

use super::headers::header_line;
use super::request::Version;

/// Largest body written in the same buffer as the head; a larger one is written after it.
const INLINE_BODY: usize = 16 * 1024;

/// A response for the client.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// End-to-end header lines, each `name: value\r\n`: never `Content-Length`,
    /// `Transfer-Encoding` or `Connection`, which are the connection's to write — except a
    /// replica's `Content-Length` on a response to `HEAD` (see `length_given`).
    pub headers: Vec<u8>,
    /// The body, read whole.
    pub body: Bytes,
    /// The headers already say what length a `GET` would get (a replica's response to
    /// `HEAD`): none is added, and no body follows.
    pub length_given: bool,
}

/// Whether the connection lives on after a response (RFC 9112 §9.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Kept for the next request.
    KeepAlive,
    /// Closed after this response: it says `connection: close`.
    Close,
}

/// What the request being answered, and the connection, ask of a response's encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// The client's version: an HTTP/1.0 client that asked to keep the connection is told
    /// it is kept.
    pub version: Version,
    /// Whether the connection ends after this response.
    pub persistence: Persistence,
    /// The request was `HEAD`: the head says what a `GET` would get, no body goes out.
    pub head_request: bool,
}

impl Response {
    /// A response with `status` and no headers or body yet.
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

    /// Writes the head into `out` (cleared first) and, when small, the body too; returns
    /// the body still to be written after `out` (empty when none).
    pub fn encode(&self, out: &mut Vec<u8>, options: EncodeOptions) -> Bytes {
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
        // RFC 9110 §8.6: no length on 1xx and 204; on 304 it would describe another response.
        let code = self.status.as_u16();
        let no_content = code < 200 || code == 204 || code == 304;
        if !no_content && !self.length_given {
            header_line(
                out,
                b"content-length",
                itoa::Buffer::new().format(self.body.len()).as_bytes(),
            );
        }
        match (options.persistence, options.version) {
            (Persistence::Close, _) => out.extend_from_slice(b"connection: close\r\n"),
            (Persistence::KeepAlive, Version::Http10) => {
                out.extend_from_slice(b"connection: keep-alive\r\n");
            }
            (Persistence::KeepAlive, Version::Http11) => {}
        }
        out.extend_from_slice(b"\r\n");
        if no_content || options.head_request || self.length_given {
            return Bytes::new();
        }
        if self.body.len() <= INLINE_BODY {
            out.extend_from_slice(&self.body);
            return Bytes::new();
        }
        self.body.clone()
    }
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
    use super::*;

    fn options(head_request: bool, close: bool, http11: bool) -> EncodeOptions {
        EncodeOptions {
            version: if http11 {
                Version::Http11
            } else {
                Version::Http10
            },
            persistence: if close {
                Persistence::Close
            } else {
                Persistence::KeepAlive
            },
            head_request,
        }
    }

    fn encoded(answer: &Response, head_request: bool, close: bool, http11: bool) -> String {
        let mut out = Vec::new();
        let rest = answer.encode(&mut out, options(head_request, close, http11));
        out.extend_from_slice(&rest);
        String::from_utf8(out).expect("text")
    }

    #[test]
    fn a_response_is_framed_by_its_status_and_the_request() {
        let mut answer = Response::new(StatusCode::OK);
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
        let mut replica_head = Response::new(StatusCode::OK);
        replica_head.push_header(b"content-length", b"99");
        replica_head.length_given = true;
        assert_eq!(
            encoded(&replica_head, true, false, true),
            "HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"
        );
        let mut empty = Response::new(StatusCode::NO_CONTENT);
        empty.body = Bytes::from_static(b"ignored");
        assert_eq!(
            encoded(&empty, false, false, true),
            "HTTP/1.1 204 No Content\r\n\r\n"
        );
        let odd = Response::new(StatusCode::from_u16(599).expect("status"));
        assert!(encoded(&odd, false, false, true).starts_with("HTTP/1.1 599 \r\n"));
    }

    #[test]
    fn a_large_body_is_left_to_be_written_after_the_head() {
        let mut answer = Response::new(StatusCode::OK);
        answer.body = Bytes::from(vec![b'x'; INLINE_BODY + 1]);
        let mut out = Vec::new();
        let rest = answer.encode(&mut out, options(false, false, true));
        assert!(out.ends_with(b"\r\n\r\n"));
        assert_eq!(rest.len(), INLINE_BODY + 1);
    }
}
