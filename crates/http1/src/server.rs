//! The server side: one client connection — heads read and checked, each request handed to
//! the application's [`Handler`] with its body on demand, responses written, the connection
//! kept or closed.
//!
//! Requests on a connection are answered one after another, in order; pipelined requests
//! wait in the read buffer until the one before them is answered. After a response the
//! connection lives on only when the client allows it (HTTP/1.1 without `Connection: close`,
//! HTTP/1.0 with `keep-alive`), the gateway is not shutting down, and the request's body was
//! read to its end — or is already in the buffer and is skipped. A body left on the wire
//! (the request was refused before it was needed), a body cut short or malformed, a
//! deadline passed, a panic: the response says `connection: close` and the connection ends,
//! so no byte of one request is ever read as the start of another.
//!
//! A connection the gateway ends while the client may still be sending is shut down on the
//! gateway's side first and drained for a moment, so the last response is not lost to a
//! reset.
//!
//! Time limits, each on a timer of the connection's own that is pushed forward rather than
//! made anew for every request, so that at every moment exactly one runs:
//! `first_byte_timeout` from the accept to the first byte of the first head (a connection
//! opened and left silent is let go soon), `idle_timeout` between requests,
//! `header_timeout` from the first byte of a head to its end (a client trickling its
//! headers is cut off), and the handler's request timeout for everything after the head,
//! body included (the timer is handed to it). A response the client does not read within
//! `idle_timeout` ends the connection. Each one that ends a connection is reported to the
//! handler ([`Handler::timed_out`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::body::Connection;
use super::incoming::{BodyState, Incoming};
use super::request::{Framing, HeadError, HeadLimits, RequestHead, Version};
use super::response::{EncodeOptions, Persistence, Response};

/// The application behind the protocol: what each request gets for a response. Called
/// with static dispatch ([`serve_connection`] is generic over it): no box per request.
pub trait Handler {
    /// The response to one request; `deadline` is the connection's timer for the whole
    /// request, for the handler to set (pushed forward, not made anew, per request).
    fn respond(
        &self,
        request: &mut Incoming<'_>,
        deadline: Pin<&mut Sleep>,
    ) -> impl Future<Output = Response> + Send;

    /// The response to a head refused before a request could be made of it; the connection
    /// closes after it.
    fn refuse_head(&self, refused: HeadError, peer: SocketAddr) -> Response;

    /// A connection was closed because the client kept it waiting (to count it).
    fn timed_out(&self, _wait: Wait) {}
}

/// What a client kept the gateway waiting for when a time limit ended its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The first byte on a new connection (`first_byte_timeout`).
    FirstByte,
    /// The next request on a kept-alive connection (`idle_timeout`).
    Idle,
    /// The rest of a head begun (`header_timeout`).
    Header,
}

impl Wait {
    /// A metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::FirstByte => "first_byte_timeout",
            Self::Idle => "idle_timeout",
            Self::Header => "header_timeout",
        }
    }
}

/// The limits a connection is served under.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Request head size and header count.
    pub head: HeadLimits,
    /// From the accept to the first byte of the first head (at most `idle_timeout`).
    pub first_byte_timeout: Duration,
    /// From the first byte of a head to its end.
    pub header_timeout: Duration,
    /// Between two requests, and for the client to take a response.
    pub idle_timeout: Duration,
    /// Largest request body, bytes (413 beyond).
    pub max_body_bytes: usize,
    /// Connections open at once, all clients together (the accept loop's, see
    /// [`super::caps`]).
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_connections_per_ip: usize,
}

/// Serves `stream` from `peer` with `handler` until the client closes, a limit ends it, or
/// `closing` is cancelled (then at the next request boundary: an idle connection closes at
/// once, a request under way is answered with `connection: close`).
pub async fn serve_connection<H: Handler>(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    handler: &H,
    limits: ConnectionLimits,
    closing: &CancellationToken,
) {
    let mut connection = Connection::new(stream);
    let mut out = Vec::with_capacity(4096);
    let far = Instant::now() + Duration::from_secs(86_400 * 365);
    let mut idle = std::pin::pin!(tokio::time::sleep_until(far));
    let mut deadline = std::pin::pin!(tokio::time::sleep_until(far));
    let mut upstream = std::pin::pin!(tokio::time::sleep_until(far));
    let mut shutdown = std::pin::pin!(closing.cancelled());
    let mut first = true;
    loop {
        let waiting = Waiting {
            timer: idle.as_mut(),
            closing: shutdown.as_mut(),
            first,
        };
        first = false;
        let (response, options) = match read_head(&mut connection, limits, waiting, handler).await {
            Ok(Some(head)) => {
                let mut request = Incoming::new(
                    &head,
                    peer,
                    upstream.as_mut(),
                    &mut connection,
                    limits.max_body_bytes,
                );
                let response = handler.respond(&mut request, deadline.as_mut()).await;
                let state = request.body_state();
                let keep = head.keep_alive()
                    && !closing.is_cancelled()
                    && in_step(&mut connection, &head, state);
                let options = EncodeOptions {
                    version: head.version(),
                    persistence: if keep {
                        Persistence::KeepAlive
                    } else {
                        Persistence::Close
                    },
                    head_request: head.method() == Method::HEAD,
                };
                (response, options)
            }
            Ok(None) => return,
            Err(refused) => {
                let options = EncodeOptions {
                    version: Version::Http11,
                    persistence: Persistence::Close,
                    head_request: false,
                };
                (handler.refuse_head(refused, peer), options)
            }
        };
        let rest = response.encode(&mut out, options);
        if !write_within(&mut connection, &out, rest, idle.as_mut(), limits).await {
            return;
        }
        if options.persistence == Persistence::Close {
            connection.linger().await;
            return;
        }
        connection.shrink();
    }
}

/// Answers a connection that will not be served with `response` and closes it, reading
/// nothing the client sent: it is drained a moment after the answer (see
/// [`Connection::linger`]), so the answer is not lost to a reset.
pub async fn refuse_connection(
    stream: tokio::net::TcpStream,
    response: Response,
    limits: ConnectionLimits,
) {
    let mut connection = Connection::new(stream);
    let mut out = Vec::with_capacity(512);
    let options = EncodeOptions {
        version: Version::Http11,
        persistence: Persistence::Close,
        head_request: false,
    };
    let rest = response.encode(&mut out, options);
    let mut timer = std::pin::pin!(tokio::time::sleep(limits.idle_timeout));
    if write_within(&mut connection, &out, rest, timer.as_mut(), limits).await {
        connection.linger().await;
    }
}

/// What a connection waits on between requests.
struct Waiting<'a, 'b> {
    /// The connection's timer for the client's next byte.
    timer: Pin<&'a mut Sleep>,
    /// The gateway's shutdown.
    closing: Pin<&'a mut WaitForCancellationFuture<'b>>,
    /// No request was read on the connection yet.
    first: bool,
}

/// The next request head; `None` when the client closed, kept the gateway waiting past a
/// limit (told to `handler`), or the gateway is closing while no request is under way.
async fn read_head<H: Handler>(
    connection: &mut Connection,
    limits: ConnectionLimits,
    waiting: Waiting<'_, '_>,
    handler: &H,
) -> Result<Option<RequestHead>, HeadError> {
    let Waiting {
        mut timer,
        mut closing,
        first,
    } = waiting;
    let mut started = false;
    let mut awaited = if first { Wait::FirstByte } else { Wait::Idle };
    if first {
        // A new connection has shown less good faith than a kept-alive one: never longer.
        let wait = limits.first_byte_timeout.min(limits.idle_timeout);
        timer.as_mut().reset(Instant::now() + wait);
    }
    loop {
        if !connection.buffered().is_empty() {
            // Empty lines between requests are allowed (RFC 9112 §2.2); httparse skips them.
            if let Some(head) = connection.request_head(limits.head)? {
                return Ok(Some(head));
            }
        }
        let idle = connection.buffered().is_empty();
        if idle && awaited == Wait::Idle {
            timer.as_mut().reset(Instant::now() + limits.idle_timeout);
        } else if !idle && !started {
            started = true;
            awaited = Wait::Header;
            timer.as_mut().reset(Instant::now() + limits.header_timeout);
        }
        tokio::select! {
            biased;
            read = connection.fill() => if read.is_err() {
                return Ok(None);
            },
            () = timer.as_mut() => {
                handler.timed_out(awaited);
                return Ok(None);
            }
            () = closing.as_mut(), if idle => return Ok(None),
        }
    }
}

/// Whether the connection is in step for another request: the body was read, or there was
/// none, or all of it is already buffered (then skipped).
fn in_step(connection: &mut Connection, head: &RequestHead, state: BodyState) -> bool {
    match (state, head.framing()) {
        (BodyState::Read, _) | (BodyState::Unread, Framing::None) => true,
        (BodyState::Unread, Framing::Length(length))
            if connection.buffered().len() as u64 >= length =>
        {
            connection.consume(length as usize);
            true
        }
        _ => false,
    }
}

/// Writes `head` then `rest`, giving up when the client takes neither within the idle
/// timeout; whether all was written.
async fn write_within(
    connection: &mut Connection,
    head: &[u8],
    rest: Bytes,
    mut timer: Pin<&mut Sleep>,
    limits: ConnectionLimits,
) -> bool {
    let write = async {
        connection.write_all(head).await?;
        if !rest.is_empty() {
            connection.write_all(&rest).await?;
        }
        Ok::<(), std::io::Error>(())
    };
    let mut write = std::pin::pin!(write);
    // Most responses fit the socket buffer: written at once, no timer touched. Polled once
    // (what `futures::poll!` does), with std's `poll_fn` rather than a dependency.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(write.as_mut().poll(cx)));
    if let std::task::Poll::Ready(result) = first.await {
        return result.is_ok();
    }
    timer.as_mut().reset(Instant::now() + limits.idle_timeout);
    tokio::select! {
        biased;
        result = write => result.is_ok(),
        () = timer => false,
    }
}
