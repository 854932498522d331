//! Connections to one replica, each driven by the request that holds it.
//!
//! hyper-util's pooled client runs every connection as a task of its own: a request goes to
//! that task through a channel, the response head comes back through another and each body
//! frame through a third — several task wake-ups per request, cross-thread ones on a
//! multi-threaded runtime. Here a request leases an idle connection for itself and its own
//! task drives it (hyper's low-level `client::conn::http1`, so parsing is still hyper's)
//! while it waits for the answer: the only wake-ups left are the socket's.
//!
//! Idle connections are kept per thread (no lock; on a current-thread runtime a connection
//! stays with the reactor its socket is registered with), newest on top. Before reuse a
//! connection is polled once: one the replica closed while it was idle is dropped, not used.
//!
//! Never twice: a request moves to another connection only when hyper hands it back unsent
//! (the leased connection turned out closed before a byte was written). Once written, any
//! failure is [`ExchangeError::Failed`] and the caller must not retry it — a purchase may have
//! reached the replica.

use std::cell::RefCell;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::header::HOST;
use axum::http::uri::Authority;
use axum::http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use thread_local::ThreadLocal;
use tokio::net::TcpStream;

type Connection = http1::Connection<TokioIo<TcpStream>, Full<Bytes>>;

/// How connections to a replica are made and kept.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Deadline for the TCP connect.
    pub connect_timeout: Duration,
    /// An idle connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
    /// Idle connections kept per thread; more are closed when they come back.
    pub max_idle_per_thread: usize,
    /// Largest response body read from a replica (the answer is read whole, then sent on).
    pub max_response_bytes: usize,
}

impl Default for PoolSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(60),
            max_idle_per_thread: 512,
            max_response_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Why an exchange with a replica failed.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// No byte of the request left the gateway: here it is back, for another replica.
    #[error("could not connect: {reason}")]
    Connect {
        /// What went wrong.
        reason: String,
        /// The request, unsent.
        request: Box<Request<Full<Bytes>>>,
    },
    /// The request may have reached the replica: it must not be sent again.
    #[error("exchange failed: {0}")]
    Failed(String),
    /// The replica's answer was larger than `max_response_bytes`.
    #[error("response body over {0} bytes")]
    TooLarge(usize),
}

/// A connection leased to one request: the sending half and the connection to drive, which
/// is `None` once it has ended.
struct Lease {
    send: SendRequest<Full<Bytes>>,
    connection: Option<Connection>,
}

struct Idle {
    lease: Lease,
    since: Instant,
}

/// The connections to one replica.
pub struct Pool {
    /// `host:port` to connect to.
    address: String,
    /// The `Host` header sent: the replica's authority.
    host: HeaderValue,
    settings: PoolSettings,
    idle: ThreadLocal<RefCell<Vec<Idle>>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("address", &self.address)
            .field("host", &self.host)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Pool {
    /// Connections to the replica at `authority` (`host[:port]`, port 80 when absent).
    pub fn new(authority: &Authority, settings: PoolSettings) -> Self {
        Self {
            address: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            ),
            host: HeaderValue::from_str(authority.as_str())
                .expect("an authority is a valid header value"),
            settings,
            idle: ThreadLocal::new(),
        }
    }

    /// The `host:port` connected to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The `Host` header its requests carry.
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// Sends `request` (origin-form URI, headers as they should be forwarded, `Host` set
    /// here) and reads the whole answer.
    pub async fn exchange(
        &self,
        mut request: Request<Full<Bytes>>,
    ) -> Result<Response<Bytes>, ExchangeError> {
        request.headers_mut().insert(HOST, self.host.clone());
        let unsent = |reason: String, request| ExchangeError::Connect {
            reason,
            request: Box::new(request),
        };
        loop {
            let (lease, reused) = match self.checkout() {
                Some(lease) => (lease, true),
                None => match self.connect().await {
                    Ok(lease) => (lease, false),
                    Err(reason) => return Err(unsent(reason, request)),
                },
            };
            let Lease {
                mut send,
                mut connection,
            } = lease;
            if let Err(e) = driving(&mut connection, send.ready()).await {
                if reused {
                    continue;
                }
                return Err(unsent(e.to_string(), request));
            }
            let response = match driving(&mut connection, send.try_send_request(request)).await {
                Ok(response) => response,
                Err(mut e) => match e.take_message() {
                    // Handed back unwritten: the connection closed under us.
                    Some(back) if reused => {
                        request = back;
                        continue;
                    }
                    Some(back) => return Err(unsent(e.into_error().to_string(), back)),
                    None => return Err(ExchangeError::Failed(e.into_error().to_string())),
                },
            };
            let (parts, body) = response.into_parts();
            let limit = self.settings.max_response_bytes;
            let body = driving(&mut connection, Limited::new(body, limit).collect())
                .await
                .map_err(|e| {
                    if e.is::<LengthLimitError>() {
                        ExchangeError::TooLarge(limit)
                    } else {
                        ExchangeError::Failed(e.to_string())
                    }
                })?
                .to_bytes();
            if let Some(connection) = connection {
                self.checkin(Lease {
                    send,
                    connection: Some(connection),
                });
            }
            return Ok(Response::from_parts(parts, body));
        }
    }

    /// A new connection; the error says why there is none.
    async fn connect(&self) -> Result<Lease, String> {
        let connect = TcpStream::connect(self.address.as_str());
        let stream = match tokio::time::timeout(self.settings.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("connect timed out".into()),
        };
        let _ = stream.set_nodelay(true);
        let (send, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        Ok(Lease {
            send,
            connection: Some(connection),
        })
    }

    /// The newest idle connection of this thread that is still open.
    fn checkout(&self) -> Option<Lease> {
        let mut idle = self.idle.get_or_default().borrow_mut();
        while let Some(Idle { mut lease, since }) = idle.pop() {
            if since.elapsed() > self.settings.idle_timeout {
                // Newest on top: everything below is older still.
                idle.clear();
                return None;
            }
            if still_open(&mut lease) {
                return Some(lease);
            }
        }
        None
    }

    fn checkin(&self, mut lease: Lease) {
        // A `Connection: close` answer, or a replica that hung up: the connection ends on
        // this poll and is not kept.
        if !still_open(&mut lease) {
            return;
        }
        let mut idle = self.idle.get_or_default().borrow_mut();
        if idle.len() < self.settings.max_idle_per_thread {
            idle.push(Idle {
                lease,
                since: Instant::now(),
            });
        }
    }

    /// Idle connections on the calling thread (tests).
    pub fn idle_here(&self) -> usize {
        self.idle.get().map_or(0, |idle| idle.borrow().len())
    }
}

/// Polls the connection once without a task to wake: pending means it is open and idle.
fn still_open(lease: &mut Lease) -> bool {
    let Some(connection) = lease.connection.as_mut() else {
        return false;
    };
    let mut cx = Context::from_waker(Waker::noop());
    Pin::new(connection).poll(&mut cx).is_pending()
}

/// Awaits `work` while driving `connection` (which writes the request, reads the answer and
/// feeds both to `work`); once the connection has ended, `work` alone, which then learns of
/// the end through hyper's channels.
async fn driving<F: Future>(connection: &mut Option<Connection>, work: F) -> F::Output {
    let mut work = pin!(work);
    poll_fn(|cx| {
        if let Some(open) = connection.as_mut()
            && let Poll::Ready(ended) = Pin::new(open).poll(cx)
        {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "upstream connection ended");
            }
            *connection = None;
        }
        work.as_mut().poll(cx)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    /// What the scripted replica does with its n-th request (counted over all connections).
    enum Reply {
        /// Answer and keep the connection open.
        Answer(&'static str),
        /// Answer, then close the connection when the test says so (`Replica::hang_up`).
        AnswerThenHangUp(&'static str),
        /// Close the connection without answering.
        Hangup,
    }

    struct Replica {
        address: String,
        connections: Arc<AtomicUsize>,
        requests: Arc<AtomicUsize>,
        /// Connections the replica has closed.
        closed: Arc<AtomicUsize>,
        hang_up: Arc<tokio::sync::Notify>,
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// A replica speaking raw HTTP/1.1 from a script, counting connections and requests.
    async fn scripted(script: fn(usize) -> Reply) -> Replica {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let hang_up = Arc::new(tokio::sync::Notify::new());
        let (c, r, x, h) = (
            connections.clone(),
            requests.clone(),
            closed.clone(),
            hang_up.clone(),
        );
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (r, x, h) = (r.clone(), x.clone(), h.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    loop {
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                        head.drain(..end);
                        match script(r.fetch_add(1, Ordering::SeqCst)) {
                            Reply::Answer(bytes) => {
                                stream.write_all(bytes.as_bytes()).await.expect("write");
                            }
                            Reply::AnswerThenHangUp(bytes) => {
                                stream.write_all(bytes.as_bytes()).await.expect("write");
                                h.notified().await;
                                break;
                            }
                            Reply::Hangup => break,
                        }
                    }
                    drop(stream);
                    x.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        Replica {
            address,
            connections,
            requests,
            closed,
            hang_up,
        }
    }

    fn get(path: &str) -> Request<Full<Bytes>> {
        Request::get(path).body(Full::default()).expect("request")
    }

    fn pool_with(address: &str, settings: PoolSettings) -> Pool {
        Pool::new(&address.parse().expect("authority"), settings)
    }

    fn pool(replica: &Replica) -> Pool {
        pool_with(&replica.address, PoolSettings::default())
    }

    #[tokio::test]
    async fn consecutive_requests_share_one_kept_alive_connection() {
        let replica = scripted(|_| Reply::Answer(OK)).await;
        let pool = pool(&replica);
        for _ in 0..5 {
            let response = pool.exchange(get("/")).await.expect("exchange");
            assert_eq!(response.status(), 200);
            assert_eq!(response.body().as_ref(), b"ok");
        }
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
        assert_eq!(replica.requests.load(Ordering::SeqCst), 5);
        assert_eq!(pool.idle_here(), 1);
    }

    #[tokio::test]
    async fn a_connection_the_replica_closed_while_idle_is_replaced_not_used() {
        // The replica hangs up after each answer without saying so (an idle timeout).
        let replica = scripted(|_| Reply::AnswerThenHangUp(OK)).await;
        let pool = pool(&replica);
        for round in 1..=3 {
            pool.exchange(get("/")).await.expect("exchange");
            assert_eq!(pool.idle_here(), 1);
            replica.hang_up.notify_one();
            // Polled until the replica has closed it: the next request finds it closed.
            let deadline = Instant::now() + Duration::from_secs(5);
            while replica.closed.load(Ordering::SeqCst) < round {
                assert!(Instant::now() < deadline, "the replica never hung up");
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(replica.requests.load(Ordering::SeqCst), 3);
        assert_eq!(replica.connections.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_connection_close_answer_is_delivered_and_the_connection_not_kept() {
        let replica = scripted(|_| {
            Reply::Answer("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nbye")
        })
        .await;
        let pool = pool(&replica);
        let response = pool.exchange(get("/")).await.expect("exchange");
        assert_eq!(response.body().as_ref(), b"bye");
        assert_eq!(pool.idle_here(), 0);
    }

    #[tokio::test]
    async fn a_chunked_answer_is_read_whole() {
        let replica = scripted(|_| {
            Reply::Answer(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                 3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n",
            )
        })
        .await;
        let pool = pool(&replica);
        let response = pool.exchange(get("/")).await.expect("exchange");
        assert_eq!(response.body().as_ref(), b"abcdefg");
        // Still usable afterwards.
        let again = pool.exchange(get("/")).await.expect("exchange");
        assert_eq!(again.body().as_ref(), b"abcdefg");
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_that_reached_the_replica_is_never_sent_again() {
        // The first request is answered (the connection is then reused); the second is
        // received and the connection dropped without an answer.
        let replica = scripted(|n| {
            if n == 0 {
                Reply::Answer(OK)
            } else {
                Reply::Hangup
            }
        })
        .await;
        let pool = pool(&replica);
        pool.exchange(get("/")).await.expect("first exchange");
        let failed = pool.exchange(get("/purchase")).await;
        assert!(
            matches!(failed, Err(ExchangeError::Failed(_))),
            "{failed:?}"
        );
        assert_eq!(replica.requests.load(Ordering::SeqCst), 2);
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_refused() {
        let replica =
            scripted(|_| Reply::Answer("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789"))
                .await;
        let pool = pool_with(
            &replica.address,
            PoolSettings {
                max_response_bytes: 4,
                ..PoolSettings::default()
            },
        );
        let refused = pool.exchange(get("/")).await;
        assert!(
            matches!(refused, Err(ExchangeError::TooLarge(4))),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let pool = pool_with(&address, PoolSettings::default());
        let refused = pool.exchange(get("/purchase")).await;
        // Handed back whole, for another replica.
        let Err(ExchangeError::Connect { request, .. }) = refused else {
            panic!("{refused:?}");
        };
        assert_eq!(request.uri(), "/purchase");
    }
}
