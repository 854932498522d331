//! One client connection: heads read and checked, each request handed to the door with its
//! body on demand, answers written, the connection kept or closed.
//!
//! Requests on a connection are answered one after another, in order; pipelined requests
//! wait in the read buffer until the one before them is answered. After an answer the
//! connection lives on only when the client allows it (HTTP/1.1 without `Connection: close`,
//! HTTP/1.0 with `keep-alive`), the gateway is not shutting down, and the request's body was
//! read to its end — or is already in the buffer and is skipped. A body left on the wire
//! (the request was refused before it was needed), a body cut short or malformed, a
//! deadline passed, a panic: the answer says `connection: close` and the connection ends,
//! so no byte of one request is ever read as the start of another.
//!
//! A connection the gateway ends while the client may still be sending is shut down on the
//! gateway's side first and drained for a moment, so the last answer is not lost to a
//! reset.
//!
//! Time limits, each on a timer of the connection's own that is pushed forward rather than
//! made anew for every request: `idle_timeout` between requests, `header_timeout` from the
//! first byte of a head to its end (a client trickling its headers is cut off), and the
//! door's `request_timeout` for everything after the head. An answer the client does not
//! read within `idle_timeout` ends the connection.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use axum::http::Method;
use bytes::{Buf, Bytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::head::{Framing, HeadError, HeadLimits, RequestHead};
use crate::door::Door;
use crate::wire::{Wire, WireError};

/// The limits a connection is served under.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Request head size and header count.
    pub head: HeadLimits,
    /// From the first byte of a head to its end.
    pub header_timeout: Duration,
    /// Between two requests, and for the client to take an answer.
    pub idle_timeout: Duration,
    /// Largest request body, bytes (413 beyond).
    pub max_body_bytes: usize,
}

/// How far a request's body has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Not touched.
    Unread,
    /// Being read: a deadline here is the client's slowness, not a replica's.
    Reading,
    /// Read to its end.
    Read,
    /// Cut short, too large or malformed: the connection is out of step and must end.
    Broken,
}

/// Why a request's body could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the limit (413).
    TooLarge(usize),
    /// Not a well-formed body (400).
    Malformed,
    /// The client went away or the socket failed.
    Gone,
}

/// One request as the door sees it: its head, where it came from, and its body on demand.
pub struct Incoming<'a> {
    /// The checked head.
    pub head: &'a RequestHead,
    /// The socket peer.
    pub peer: SocketAddr,
    /// The connection's timer for one exchange with a replica (see
    /// [`Incoming::upstream_timer`]).
    upstream_timer: Pin<&'a mut Sleep>,
    wire: &'a mut Wire,
    state: BodyState,
    max_body_bytes: usize,
}

impl Incoming<'_> {
    /// A timer of the connection's own for a replica's answer, set by the caller: pushing it
    /// forward request after request costs an atomic store, where a new timer per request
    /// is a registration with the runtime's timer wheel and a removal.
    pub fn upstream_timer(&mut self) -> Pin<&mut Sleep> {
        self.upstream_timer.as_mut()
    }

    /// How far the body has been read.
    pub fn body_state(&self) -> BodyState {
        self.state
    }

    /// The whole body (empty when there is none), read once; a client waiting for
    /// `100 Continue` is told to go on first.
    pub async fn body(&mut self) -> Result<Bytes, BodyError> {
        if self.state != BodyState::Unread {
            return Err(BodyError::Gone);
        }
        let framing = self.head.framing();
        if let Framing::Length(length) = framing
            && length > self.max_body_bytes as u64
        {
            // Left unread: the connection closes after the 413.
            return Err(BodyError::TooLarge(self.max_body_bytes));
        }
        if framing == Framing::None {
            self.state = BodyState::Read;
            return Ok(Bytes::new());
        }
        self.state = BodyState::Reading;
        let read = self.read(framing).await;
        self.state = if read.is_ok() {
            BodyState::Read
        } else {
            BodyState::Broken
        };
        read.map_err(|e| match e {
            WireError::TooLarge(limit) => BodyError::TooLarge(limit),
            WireError::Malformed(_) => BodyError::Malformed,
            WireError::Closed | WireError::Io(_) => BodyError::Gone,
        })
    }

    async fn read(&mut self, framing: Framing) -> Result<Bytes, WireError> {
        let buffered = match framing {
            Framing::Length(length) => self.wire.read.len() as u64 >= length,
            _ => false,
        };
        if self.head.expect_continue() && !buffered {
            self.wire
                .stream
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await?;
        }
        match framing {
            Framing::None => Ok(Bytes::new()),
            // At most max_body_bytes: checked above.
            Framing::Length(length) => self.wire.read_exactly(length as usize).await,
            Framing::Chunked => self.wire.read_chunked(self.max_body_bytes).await,
        }
    }
}

/// Serves `stream` from `peer` until the client closes, a limit ends it, or `closing` is
/// cancelled (then at the next request boundary: an idle connection closes at once, a
/// request under way is answered with `connection: close`).
pub async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    door: &Door,
    limits: ConnLimits,
    closing: &CancellationToken,
) {
    let mut wire = Wire::new(stream);
    let mut out = Vec::with_capacity(4096);
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let mut idle = std::pin::pin!(tokio::time::sleep_until(far));
    let mut deadline = std::pin::pin!(tokio::time::sleep_until(far));
    let mut upstream = std::pin::pin!(tokio::time::sleep_until(far));
    let mut shutdown = std::pin::pin!(closing.cancelled());
    loop {
        let (answer, head_request, http11, keep) =
            match read_head(&mut wire, limits, idle.as_mut(), shutdown.as_mut()).await {
                Ok(Some(head)) => {
                    let mut incoming = Incoming {
                        head: &head,
                        peer,
                        upstream_timer: upstream.as_mut(),
                        wire: &mut wire,
                        state: BodyState::Unread,
                        max_body_bytes: limits.max_body_bytes,
                    };
                    let answer = door.answer(&mut incoming, deadline.as_mut()).await;
                    let state = incoming.state;
                    let keep = head.keep_alive()
                        && !closing.is_cancelled()
                        && settle(&mut wire, &head, state);
                    (
                        answer,
                        head.method() == Method::HEAD,
                        head.is_http11(),
                        keep,
                    )
                }
                Ok(None) => return,
                Err(refused) => (door.refuse_head(refused, peer).await, false, true, false),
            };
        let rest = answer.encode(&mut out, head_request, !keep, http11);
        if !write_within(&mut wire.stream, &out, rest, idle.as_mut(), limits).await {
            return;
        }
        if !keep {
            linger(&mut wire.stream).await;
            return;
        }
        wire.shrink();
    }
}

/// The next request head; `None` when the client closed, stayed idle past the limit, or
/// the gateway is closing while no request is under way.
async fn read_head(
    wire: &mut Wire,
    limits: ConnLimits,
    mut timer: Pin<&mut Sleep>,
    mut closing: Pin<&mut WaitForCancellationFuture<'_>>,
) -> Result<Option<RequestHead>, HeadError> {
    let mut started = false;
    loop {
        if !wire.read.is_empty() {
            // Empty lines between requests are allowed (RFC 9112 §2.2); httparse skips them.
            if let Some(head) = RequestHead::parse(&mut wire.read, limits.head)? {
                return Ok(Some(head));
            }
        }
        let idle = wire.read.is_empty();
        if idle {
            timer.as_mut().reset(Instant::now() + limits.idle_timeout);
        } else if !started {
            started = true;
            timer.as_mut().reset(Instant::now() + limits.header_timeout);
        }
        tokio::select! {
            biased;
            read = wire.fill() => if read.is_err() {
                return Ok(None);
            },
            () = timer.as_mut() => return Ok(None),
            () = closing.as_mut(), if idle => return Ok(None),
        }
    }
}

/// Whether the connection is in step for another request: the body was read, or there was
/// none, or all of it is already buffered (then skipped).
fn settle(wire: &mut Wire, head: &RequestHead, state: BodyState) -> bool {
    match (state, head.framing()) {
        (BodyState::Read, _) | (BodyState::Unread, Framing::None) => true,
        (BodyState::Unread, Framing::Length(length)) if wire.read.len() as u64 >= length => {
            wire.read.advance(length as usize);
            true
        }
        _ => false,
    }
}

/// Closes a connection the client may still be writing to: the gateway's side first, then
/// what arrives is read and dropped until the client closes too, for a short while. A
/// socket closed with unread bytes sends a reset, which can destroy the answer before the
/// client has read it (the "lingering close" every HTTP server does).
async fn linger(stream: &mut TcpStream) {
    if stream.shutdown().await.is_err() {
        return;
    }
    let drain = async {
        let mut sink = [0u8; 4096];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => drained += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// How long, and for how many bytes, a closing connection is drained.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

/// Writes `head` then `rest`, giving up when the client takes neither within the idle
/// timeout; whether all was written.
async fn write_within(
    stream: &mut TcpStream,
    head: &[u8],
    rest: Bytes,
    mut timer: Pin<&mut Sleep>,
    limits: ConnLimits,
) -> bool {
    let write = async {
        stream.write_all(head).await?;
        if !rest.is_empty() {
            stream.write_all(&rest).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let mut write = std::pin::pin!(write);
    // Most answers fit the socket buffer: written at once, no timer touched.
    if let std::task::Poll::Ready(result) = futures_util::poll!(write.as_mut()) {
        return result.is_ok();
    }
    timer.as_mut().reset(Instant::now() + limits.idle_timeout);
    tokio::select! {
        biased;
        result = write => result.is_ok(),
        () = timer => false,
    }
}
