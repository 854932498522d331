//! A client's request head: parsed once with `httparse`, checked against the rules that
//! keep the gateway and whatever is in front of it agreeing on where each request ends,
//! and kept as the bytes that arrived with the offsets of each part.
//!
//! Every header is classified once, at parse time, by the role it plays here ([`Kind`]),
//! so the request path asks "the `Authorization` value" or "the headers to forward" without
//! comparing names again, and nothing is copied into a header map.
//!
//! Refused, each answered and the connection closed (RFC 9112 §6.1, §6.3, §3.2): a head
//! `httparse` cannot read (400); a head over the byte or header-count limit (431); both
//! `Transfer-Encoding` and `Content-Length`; `Transfer-Encoding` on HTTP/1.0, or whose last
//! coding is not `chunked` (400), or with any coding besides `chunked` (501); a
//! `Content-Length` that is not digits or whose values disagree (400); an HTTP/1.1 request
//! without exactly one `Host` (400); an `Expect` other than `100-continue` (417); a target
//! that is not a path, an absolute `http(s)` URL or `*`, or that has a fragment (400); a
//! line ended by a bare LF instead of CRLF (400: `httparse` accepts one, a peer in front of
//! the gateway may not see a line end there, RFC 9112 §2.2).

use std::mem::MaybeUninit;

use bytes::{Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{Method, StatusCode};

use super::headers::{HopByHop, Kind, content_length, list_items};

/// Most headers a request may be configured to carry (the parser's slots live on the stack).
pub const MAX_HEADERS_CAP: usize = 256;

/// Limits on a request's head.
#[derive(Debug, Clone, Copy)]
pub struct HeadLimits {
    /// Request line plus headers, bytes.
    pub max_header_bytes: usize,
    /// Number of headers, at most [`MAX_HEADERS_CAP`].
    pub max_headers: usize,
}

/// The protocol version of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// HTTP/1.0: the connection closes after the response unless the client asked
    /// `Connection: keep-alive`.
    Http10,
    /// HTTP/1.1: the connection lives on unless either side says `Connection: close`.
    Http11,
}

/// How the request's body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// `Content-Length` bytes (more than zero).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
}

/// A refused head: the status and message the client gets before the connection closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadError {
    /// 400, 417, 431 or 501.
    pub status: StatusCode,
    /// Said to the client, in the JSON error body.
    pub message: &'static str,
}

impl HeadError {
    fn bad(message: &'static str) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message,
        }
    }

    fn too_large() -> Self {
        Self {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            message: "the request head is too large",
        }
    }
}

type Span = (u32, u32);

#[derive(Debug, Clone, Copy)]
struct Field {
    name: Span,
    value: Span,
    kind: Kind,
}

/// A parsed request head, owning the bytes it was read from.
#[derive(Debug)]
pub struct RequestHead {
    raw: Bytes,
    method: Method,
    /// The path and query to forward (origin form), checked once, sharing `raw`'s bytes.
    target: PathAndQuery,
    http11: bool,
    fields: Vec<Field>,
    framing: Framing,
    keep_alive: bool,
    expect_continue: bool,
}

impl RequestHead {
    /// Parses the head at the start of `buffer` and splits it off; `None` while it is
    /// incomplete and within the limits.
    pub fn parse(buffer: &mut BytesMut, limits: HeadLimits) -> Result<Option<Self>, HeadError> {
        let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS_CAP];
        let slots = &mut slots[..limits.max_headers.min(MAX_HEADERS_CAP)];
        let mut request = httparse::Request::new(&mut []);
        let length = match request.parse_with_uninit_headers(buffer, slots) {
            Ok(httparse::Status::Complete(length)) => length,
            Ok(httparse::Status::Partial) if buffer.len() > limits.max_header_bytes => {
                return Err(HeadError::too_large());
            }
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::too_large()),
            Err(_) => return Err(HeadError::bad("malformed request head")),
        };
        if length > limits.max_header_bytes {
            return Err(HeadError::too_large());
        }
        if has_bare_lf(&buffer[..length]) {
            return Err(HeadError::bad(
                "a line of the request head ends in a bare LF",
            ));
        }
        let base = buffer.as_ptr() as usize;
        let span = |part: &[u8]| {
            let start = part.as_ptr() as usize - base;
            // Heads are bounded by max_header_bytes, far below u32::MAX.
            (start as u32, (start + part.len()) as u32)
        };
        let method = request.method.unwrap_or_default();
        let method = Method::from_bytes(method.as_bytes())
            .map_err(|_| HeadError::bad("malformed method"))?;
        let target = origin_form(request.path.unwrap_or_default())?.map(|t| span(t.as_bytes()));
        let fields: Vec<Field> = request
            .headers
            .iter()
            .map(|h| Field {
                name: span(h.name.as_bytes()),
                value: span(h.value),
                kind: Kind::of(h.name.as_bytes()),
            })
            .collect();
        let http11 = request.version == Some(1);
        let raw = buffer.split_to(length).freeze();
        let target = match target {
            Some((start, end)) => {
                PathAndQuery::from_maybe_shared(raw.slice(start as usize..end as usize))
                    .map_err(|_| HeadError::bad("malformed request target"))?
            }
            None => PathAndQuery::from_static("/"),
        };
        let mut head = Self {
            raw,
            method,
            target,
            http11,
            fields,
            framing: Framing::None,
            keep_alive: false,
            expect_continue: false,
        };
        head.check_fields()?;
        Ok(Some(head))
    }

    /// Framing, `Host`, `Connection` and `Expect`, by the rules in the module's notes.
    fn check_fields(&mut self) -> Result<(), HeadError> {
        let hosts = self.values(Kind::Host).count();
        if self.http11 && hosts != 1 {
            return Err(HeadError::bad("an HTTP/1.1 request needs exactly one Host"));
        }
        let has_te = self.value(Kind::TransferEncoding).is_some();
        let has_cl = self.value(Kind::ContentLength).is_some();
        self.framing = match (has_te, has_cl) {
            (true, true) => {
                return Err(HeadError::bad(
                    "Transfer-Encoding and Content-Length together",
                ));
            }
            (true, false) if !self.http11 => {
                return Err(HeadError::bad("Transfer-Encoding in an HTTP/1.0 request"));
            }
            (true, false) => {
                let codings: Vec<&[u8]> = list_items(self.values(Kind::TransferEncoding))
                    .filter(|c| !c.is_empty())
                    .collect();
                match codings.as_slice() {
                    [only] if only.eq_ignore_ascii_case(b"chunked") => Framing::Chunked,
                    [.., last] if last.eq_ignore_ascii_case(b"chunked") => {
                        return Err(HeadError {
                            status: StatusCode::NOT_IMPLEMENTED,
                            message: "no transfer coding but chunked is supported",
                        });
                    }
                    _ => return Err(HeadError::bad("the last transfer coding must be chunked")),
                }
            }
            (false, true) => match content_length(self.values(Kind::ContentLength)) {
                Some(0) => Framing::None,
                Some(length) => Framing::Length(length),
                None => return Err(HeadError::bad("malformed Content-Length")),
            },
            (false, false) => Framing::None,
        };
        let (mut close, mut keep_alive) = (false, false);
        for token in list_items(self.values(Kind::Connection)) {
            close |= token.eq_ignore_ascii_case(b"close");
            keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
        }
        self.keep_alive = !close && (self.http11 || keep_alive);
        if let Some(expect) = self.value(Kind::Expect) {
            if !expect.trim_ascii().eq_ignore_ascii_case(b"100-continue") {
                return Err(HeadError {
                    status: StatusCode::EXPECTATION_FAILED,
                    message: "only Expect: 100-continue is supported",
                });
            }
            self.expect_continue = self.http11;
        }
        Ok(())
    }

    fn slice(&self, (start, end): Span) -> &[u8] {
        &self.raw[start as usize..end as usize]
    }

    /// The method.
    pub fn method(&self) -> &Method {
        &self.method
    }

    /// Path and query, as forwarded (an absolute-form target reduced to them).
    pub fn target(&self) -> &str {
        self.target.as_str()
    }

    /// The path alone.
    pub fn path(&self) -> &str {
        self.target.path()
    }

    /// HTTP/1.1 or 1.0.
    pub fn version(&self) -> Version {
        if self.http11 {
            Version::Http11
        } else {
            Version::Http10
        }
    }

    /// How the body is delimited.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// Whether the client lets the connection live on after the response.
    pub fn keep_alive(&self) -> bool {
        self.keep_alive
    }

    /// Whether the client waits for `100 Continue` before it sends the body.
    pub fn expect_continue(&self) -> bool {
        self.expect_continue
    }

    /// The values of every header of `kind`, in order.
    pub fn values(&self, kind: Kind) -> impl Iterator<Item = &[u8]> {
        self.fields
            .iter()
            .filter(move |f| f.kind == kind)
            .map(|f| self.slice(f.value))
    }

    /// The first value of a header of `kind`.
    pub fn value(&self, kind: Kind) -> Option<&[u8]> {
        self.values(kind).next()
    }

    /// Every header as `(name, value, kind)`, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8], Kind)> {
        self.fields
            .iter()
            .map(|f| (self.slice(f.name), self.slice(f.value), f.kind))
    }

    /// The [`Kind::Other`] headers that travel on: those `Connection` does not name.
    pub fn end_to_end(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let hop_by_hop = HopByHop::of(self.values(Kind::Connection));
        self.fields().filter_map(move |(name, value, kind)| {
            // Other is off the fixed list by construction: only Connection can make it one hop.
            (kind == Kind::Other && !hop_by_hop.named_by_connection(name)).then_some((name, value))
        })
    }
}

/// Whether `bytes` hold an LF not preceded by a CR (the first byte's predecessor is taken
/// to be no CR: a head starts at a line's start).
pub fn has_bare_lf(bytes: &[u8]) -> bool {
    let mut previous = 0;
    bytes.iter().any(|&byte| {
        let bare = byte == b'\n' && previous != b'\r';
        previous = byte;
        bare
    })
}

/// The path and query of a request target: origin form as it is, an absolute `http(s)`
/// URL reduced to its path (`None` when it has none: `/`), `*` as it is.
fn origin_form(target: &str) -> Result<Option<&str>, HeadError> {
    // No fragment on the wire (RFC 9112 §3.2); `PathAndQuery` would drop it silently, and
    // the gateway would forward another target than a proxy in front of it read.
    if target.contains('#') {
        return Err(HeadError::bad(
            "the request target must not have a fragment",
        ));
    }
    if target.starts_with('/') || target == "*" {
        return Ok(Some(target));
    }
    let lower_scheme = |scheme: &str| {
        target
            .get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    };
    let rest = if lower_scheme("http://") {
        &target[7..]
    } else if lower_scheme("https://") {
        &target[8..]
    } else {
        return Err(HeadError::bad("the request target must be a path"));
    };
    match rest.find(['/', '?']) {
        Some(at) if rest.as_bytes()[at] == b'/' => Ok(Some(&rest[at..])),
        // `http://host?q` has the empty path, `/`; rare enough to refuse than to rebuild.
        Some(_) => Err(HeadError::bad("the request target must have a path")),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: HeadLimits = HeadLimits {
        max_header_bytes: 1024,
        max_headers: 8,
    };

    fn parse(text: &str) -> Result<Option<RequestHead>, HeadError> {
        RequestHead::parse(&mut BytesMut::from(text), LIMITS)
    }

    fn refused(text: &str) -> StatusCode {
        parse(text).expect_err(text).status
    }

    #[test]
    fn a_head_is_split_off_and_its_parts_read_without_copies() {
        let mut buffer = BytesMut::from(
            "POST /api/seckill/7?x=1 HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer t\r\n\
             X-Custom: a\r\nContent-Length: 2\r\n\r\n{}GET",
        );
        let head = RequestHead::parse(&mut buffer, LIMITS)
            .expect("valid")
            .expect("complete");
        assert_eq!(&buffer[..], b"{}GET", "body and the next request stay");
        assert_eq!(head.method(), Method::POST);
        assert_eq!(
            (head.path(), head.target()),
            ("/api/seckill/7", "/api/seckill/7?x=1")
        );
        assert_eq!(head.value(Kind::Authorization), Some(&b"Bearer t"[..]));
        assert_eq!(head.framing(), Framing::Length(2));
        assert!(head.keep_alive() && head.version() == Version::Http11 && !head.expect_continue());
        let forwarded: Vec<_> = head.end_to_end().collect();
        assert_eq!(forwarded, [(&b"X-Custom"[..], &b"a"[..])]);
    }

    #[test]
    fn an_incomplete_head_waits_until_it_passes_the_limit() {
        assert!(matches!(parse("GET / HTTP/1.1\r\nHost: x\r\n"), Ok(None)));
        let long = format!("GET / HTTP/1.1\r\nx-pad: {}", "a".repeat(2000));
        assert_eq!(refused(&long), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let complete_but_long = format!("{long}\r\nHost: x\r\n\r\n");
        assert_eq!(
            refused(&complete_but_long),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
        let many: String = (0..9).map(|i| format!("x-{i}: 1\r\n")).collect();
        assert_eq!(
            refused(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
        );
    }

    #[test]
    fn ambiguous_framing_is_refused() {
        let bad = StatusCode::BAD_REQUEST;
        for (head, status) in [
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1_0\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                StatusCode::NOT_IMPLEMENTED,
            ),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", bad),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding : chunked\r\nHost: x\r\n\r\n",
                bad,
            ),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n",
                bad,
            ),
            ("GET / HTTP/1.1\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", bad),
            ("GET / HTTP/2.0\r\nHost: a\r\n\r\n", bad),
            ("GET example.com HTTP/1.1\r\nHost: a\r\n\r\n", bad),
            ("GET /a#/../admin HTTP/1.1\r\nHost: a\r\n\r\n", bad),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n",
                StatusCode::EXPECTATION_FAILED,
            ),
            ("GET / HTTP/1.1\nHost: a\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: a\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: a\r\n\n", bad),
            ("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", bad),
        ] {
            assert_eq!(refused(head), status, "{head:?}");
        }
    }

    #[test]
    fn well_framed_bodies_and_connection_wishes_are_read() {
        let head = |text: &str| parse(text).expect(text).expect("complete");
        let chunked = head(
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nExpect: 100-Continue\r\n\r\n",
        );
        assert_eq!(chunked.framing(), Framing::Chunked);
        assert!(chunked.expect_continue());
        let empty = head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        assert_eq!(empty.framing(), Framing::None);
        assert!(!head("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").keep_alive());
        assert!(!head("GET / HTTP/1.0\r\n\r\n").keep_alive());
        assert!(head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive());
        let absolute = head("GET http://gw:8080/api/products/1?a=b HTTP/1.1\r\nHost: gw\r\n\r\n");
        assert_eq!(
            (absolute.path(), absolute.target()),
            ("/api/products/1", "/api/products/1?a=b")
        );
        assert_eq!(
            head("GET HTTPS://gw HTTP/1.1\r\nHost: gw\r\n\r\n").target(),
            "/"
        );
    }

    #[test]
    fn headers_a_connection_header_names_do_not_travel() {
        let head = parse(
            "GET / HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Secret\r\nx-secret: 1\r\n\
             Keep-Alive: 5\r\nX-Kept: 2\r\n\r\n",
        )
        .expect("valid")
        .expect("complete");
        let forwarded: Vec<_> = head.end_to_end().map(|(name, _)| name).collect();
        assert_eq!(forwarded, [&b"X-Kept"[..]]);
    }
}
