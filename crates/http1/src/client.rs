//! The client side: one HTTP/1.1 exchange with an upstream server over a connection from a
//! pool, the response read whole.
//!
//! The gateway speaks to its replicas in the narrowest HTTP/1.1 there is: one request at a
//! time per connection, the request written in one buffer (head and body: the body was read
//! whole from the client), the response parsed with `httparse` and read whole
//! (`Content-Length`, chunked, or until the replica closes), its end-to-end header lines
//! copied as they came into the [`Response`] the client's connection writes. No channels and
//! no task of its own: the request's task writes and reads the socket itself. A general
//! client (hyper's, used before) pays per request for a dispatch channel, a response
//! channel, a body channel and re-encoding a header map; here that was about a quarter of
//! the gateway's user-space CPU. Responses leave with a `Content-Length` of what was read,
//! never the framing the replica used.
//!
//! Where connections come from and go back to is the application's ([`ConnectionPool`]).
//!
//! Never twice: a request that is not *safe* (RFC 9110 §9.2.1: GET, HEAD, OPTIONS) moves to
//! another connection only when not one byte of it was accepted (a connect failure, or the
//! first write on a reused connection refused because the replica had closed it). Once a
//! byte is out, any failure is [`ExchangeError::Failed`] and the caller must not retry it —
//! a purchase may have reached the replica. So before such a request is written on a reused
//! connection, the socket itself is asked whether the replica closed it ([`Probe::Socket`]).
//! A safe request skips that system call when the reactor has seen nothing arrive on the
//! idle connection ([`Probe::Reactor`]); if the replica closed it in the meantime, the
//! connection ends before a byte of the response and the request is sent once more on a new
//! connection — the keep-alive race every HTTP client handles this way for safe methods
//! (RFC 9112 §9.3.1).
//!
//! Never out of step: a connection goes back to the pool only when its response was framed
//! exactly and nothing followed it in the buffer; one on which bytes arrived while it was
//! idle is closed at checkout, not used: the probe finds them. With [`Probe::Reactor`]
//! (safe requests only) it finds them once the thread's reactor has seen them arrive;
//! bytes that land in the instant between its last turn and the checkout are the one case
//! left, the price of skipping a system call per request, and only a replica that answers
//! what it was not asked can cause it.

use std::future::Future;

use bytes::Bytes;
use http::{Method, StatusCode};

use super::body::{Connection, Probe, ReadError};
use super::headers::{HopByHop, content_length, header_line, last_coding_is_chunked, list_items};
use super::response::Response;

/// Headers a parsed response may have at most.
const MAX_RESPONSE_HEADERS: usize = 100;
/// Largest response head (status line and headers).
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Where an exchange takes its connections from and gives them back to.
pub trait ConnectionPool {
    /// An idle connection still open, as `probe` tells; `None` when there is none.
    fn checkout(&self, probe: Probe) -> Option<Connection>;
    /// A new connection; the error says why there is none.
    fn connect(&self) -> impl Future<Output = Result<Connection, String>> + Send;
    /// A connection in step for another request, back to wait for it.
    fn checkin(&self, connection: Connection);
}

/// Why an exchange with a replica failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// No byte of the request left the gateway (or, for a safe request, none was answered
    /// and no new connection could be made): it may go to another replica.
    #[error("could not connect: {0}")]
    Connect(String),
    /// The request may have reached the replica: it must not be sent again.
    #[error("exchange failed: {0}")]
    Failed(String),
    /// The replica's response was larger than the limit.
    #[error("response body over {0} bytes")]
    TooLarge(usize),
}

impl From<ReadError> for ExchangeError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::TooLarge(limit) => Self::TooLarge(limit),
            other => Self::Failed(other.to_string()),
        }
    }
}

/// A request ready for the wire: its bytes (head with `Host`, body framed by its length)
/// and what its method means for the exchange.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    bytes: &'a [u8],
    /// GET, HEAD or OPTIONS (RFC 9110 §9.2.1): may be sent again after a keep-alive race.
    safe: bool,
    /// HEAD: the response has no body, whatever its head says.
    head_only: bool,
}

impl<'a> Outgoing<'a> {
    /// The request whose bytes are `bytes`; its method is read from them.
    pub fn new(bytes: &'a [u8]) -> Self {
        let method = bytes.split(|&b| b == b' ').next().unwrap_or_default();
        let is = |m: &Method| method == m.as_str().as_bytes();
        Self {
            bytes,
            safe: is(&Method::GET) || is(&Method::HEAD) || is(&Method::OPTIONS),
            head_only: is(&Method::HEAD),
        }
    }
}

/// Sends `request` over a connection of `pool` and reads the whole response, at most
/// `max_body` bytes of body; the connection goes back to `pool` when it is in step.
pub async fn exchange<P: ConnectionPool>(
    pool: &P,
    request: Outgoing<'_>,
    max_body: usize,
) -> Result<Response, ExchangeError> {
    // After a reused connection ended before answering a safe request: a new one only.
    let mut fresh_only = false;
    let probe = if request.safe {
        Probe::Reactor
    } else {
        Probe::Socket
    };
    let mut connection = loop {
        let idle = if fresh_only {
            None
        } else {
            pool.checkout(probe)
        };
        let (mut connection, reused) = match idle {
            Some(connection) => (connection, true),
            None => (pool.connect().await.map_err(ExchangeError::Connect)?, false),
        };
        // The first write decides: refused whole, nothing of the request left.
        match connection.write(request.bytes).await {
            Ok(0) | Err(_) if reused => continue,
            Ok(0) => return Err(ExchangeError::Connect("connection closed".into())),
            Err(e) => return Err(ExchangeError::Connect(e.to_string())),
            Ok(written) => {
                if written < request.bytes.len() {
                    connection
                        .write_all(&request.bytes[written..])
                        .await
                        .map_err(|e| ExchangeError::Failed(e.to_string()))?;
                }
            }
        }
        // The first bytes of the response. A reused connection that ends here was closed
        // by the replica while idle (or it dropped the request unanswered): a safe
        // request goes again, on a new connection.
        match connection.fill().await {
            Err(_) if reused && request.safe => fresh_only = true,
            Err(e) => return Err(e.into()),
            Ok(()) => break connection,
        }
    };
    let (response, keep) = read_response(&mut connection, request.head_only, max_body).await?;
    // Bytes after the response are no answer to anything: whatever they are, the next
    // request must not read them as its own, so the connection ends.
    if keep && connection.buffered().is_empty() {
        pool.checkin(connection);
    }
    Ok(response)
}

/// What a response's head says about its body and its connection.
pub(crate) struct ResponseFraming {
    /// A `Transfer-Encoding` was sent; whether its last coding is `chunked`.
    pub(crate) transfer_encoding: Option<bool>,
    /// A `Content-Length` was sent: its value, or `None` when malformed or conflicting.
    pub(crate) content_length: Option<Option<u64>>,
    /// HTTP/1.1 without `Connection: close`.
    pub(crate) keep_alive: bool,
}

/// The parts of a response's head the gateway keeps.
pub(crate) struct ResponseHead {
    pub(crate) status: u16,
    /// Its end-to-end header lines.
    pub(crate) lines: Vec<u8>,
    pub(crate) framing: ResponseFraming,
    pub(crate) bodiless: bool,
}

/// Reads one whole response from `connection`; whether the connection may be used again.
/// The response's headers are its end-to-end ones, copied as they came: hop-by-hop headers
/// (and those `Connection` names) are left out, and so is the replica's framing — the
/// client's connection writes the length of what was read.
async fn read_response(
    connection: &mut Connection,
    head_only: bool,
    max_body: usize,
) -> Result<(Response, bool), ExchangeError> {
    let failed = |what: &str| ExchangeError::Failed(what.to_string());
    let head = loop {
        match parse_response_head(connection.buffered(), head_only)? {
            Some((length, head)) => {
                connection.consume(length);
                // An interim response (100 Continue and the like): the real one follows.
                if (100..200).contains(&head.status) && head.status != 101 {
                    continue;
                }
                break head;
            }
            None if connection.buffered().len() > MAX_RESPONSE_HEAD => {
                return Err(failed("response head too large"));
            }
            None => connection.fill().await?,
        }
    };
    let status = StatusCode::from_u16(head.status).map_err(|_| failed("bad status"))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(failed("the replica switched protocols"));
    }
    let framing = head.framing;
    let mut keep = framing.keep_alive;
    let body = if head.bodiless {
        // A 204 may not announce a body at all (RFC 9110 §8.6, RFC 9112 §6.1): one that
        // does may be followed by it, so its connection is not trusted again. A 304 or an
        // answer to HEAD announces the length a GET would get, as it may: no body is read,
        // and bytes found after the head still end the connection (see `exchange`).
        let announced = framing.transfer_encoding.is_some()
            || !matches!(framing.content_length, None | Some(Some(0)));
        if head.status == 204 && announced {
            keep = false;
        }
        Bytes::new()
    } else if let Some(chunked) = framing.transfer_encoding {
        // Transfer-Encoding wins over any Content-Length, which goes (RFC 9112 §6.3); a
        // response with both is suspect, so its connection is not used again.
        if framing.content_length.is_some() {
            keep = false;
        }
        if chunked {
            connection.read_chunked(max_body).await?
        } else {
            keep = false;
            connection.read_to_end(max_body).await?
        }
    } else if let Some(length) = framing.content_length {
        let length =
            length.ok_or_else(|| failed("bad or conflicting content-length in the response"))?;
        if length > max_body as u64 {
            return Err(ExchangeError::TooLarge(max_body));
        }
        connection.read_exactly(length as usize).await?
    } else {
        keep = false;
        connection.read_to_end(max_body).await?
    };
    let response = Response {
        status,
        headers: head.lines,
        body,
        length_given: head.bodiless,
    };
    Ok((response, keep))
}

/// The head at the start of `buffer`, with its length; `None` while incomplete.
pub(crate) fn parse_response_head(
    buffer: &[u8],
    head_only: bool,
) -> Result<Option<(usize, ResponseHead)>, ExchangeError> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut parsed = httparse::Response::new(&mut slots);
    let length = match parsed.parse(buffer) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ExchangeError::Failed(format!("bad response head: {e}"))),
    };
    let status = parsed
        .code
        .ok_or_else(|| ExchangeError::Failed("no status".into()))?;
    // No body, whatever the head announces (RFC 9112 §6.3).
    let bodiless = head_only || status == 204 || status == 304;
    let framing = framing(parsed.headers, parsed.version == Some(1));
    let connection = parsed
        .headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case("connection"));
    let hop_by_hop = HopByHop::of(connection.map(|h| h.value));
    let mut lines = Vec::with_capacity(buffer.len().min(length));
    for header in parsed.headers.iter() {
        // A length on a 204 describes nothing (and must not be there): dropped with it.
        let framed_here =
            (!bodiless || status == 204) && header.name.eq_ignore_ascii_case("content-length");
        if framed_here || hop_by_hop.contains(header.name.as_bytes()) {
            continue;
        }
        // httparse checked the name is a token and the value holds no CR or LF.
        header_line(&mut lines, header.name.as_bytes(), header.value);
    }
    let head = ResponseHead {
        status,
        lines,
        framing,
        bodiless,
    };
    Ok(Some((length, head)))
}

/// The framing of a response with `headers`; `http11`: its version is HTTP/1.1.
fn framing(headers: &[httparse::Header<'_>], http11: bool) -> ResponseFraming {
    let values = |name: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    };
    let has_te = values("transfer-encoding").next().is_some();
    let has_cl = values("content-length").next().is_some();
    ResponseFraming {
        transfer_encoding: has_te.then(|| last_coding_is_chunked(values("transfer-encoding"))),
        content_length: has_cl.then(|| content_length(values("content-length"))),
        keep_alive: http11
            && !list_items(values("connection")).any(|t| t.eq_ignore_ascii_case(b"close")),
    }
}
