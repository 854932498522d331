//! Connections to one replica: checked out for an exchange, checked back in after it,
//! closed when idle too long or found closed by the replica. The exchange itself is the
//! HTTP/1.1 client's ([`seckill_http1::client`]); the pool is where it takes its
//! connections from.
//!
//! Idle connections are kept per thread (no lock; on a current-thread runtime a socket stays
//! with the reactor it is registered with), newest used first, oldest closed once idle too
//! long. Before reuse a connection is checked without blocking (how, the client decides:
//! [`Probe`]): one the replica closed while it was idle is dropped, not used.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::http::uri::Authority;
use thread_local::ThreadLocal;
use tokio::net::TcpStream;

use seckill_http1::client::{self, ConnectionPool, ExchangeError, Outgoing};
use seckill_http1::{Connection, Probe, Response};

/// How connections to a replica are made and kept.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Deadline for the TCP connect.
    pub connect_timeout: Duration,
    /// An idle connection older than this is closed instead of reused.
    pub idle_timeout: Duration,
    /// Idle connections kept per thread; more are closed when they come back.
    pub max_idle_per_thread: usize,
    /// Largest response body read from a replica (the response is read whole, then sent on).
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

struct Idle {
    connection: Connection,
    since: Instant,
}

/// The connections to one replica.
pub struct Pool {
    /// `host:port` to connect to.
    address: String,
    /// The `Host` header sent: the replica's authority.
    host: String,
    settings: PoolSettings,
    idle: ThreadLocal<RefCell<VecDeque<Idle>>>,
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
            host: authority.as_str().to_owned(),
            settings,
            idle: ThreadLocal::new(),
        }
    }

    /// Connections to `address` (an `ip:port` the replica's name resolved to), whose
    /// requests carry `host` (the replica's authority as configured).
    pub fn at(address: std::net::SocketAddr, host: &Authority, settings: PoolSettings) -> Self {
        Self {
            address: address.to_string(),
            host: host.as_str().to_owned(),
            settings,
            idle: ThreadLocal::new(),
        }
    }

    /// The `host:port` connected to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The `Host` header its requests carry.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Sends `request` on one of the pool's connections and reads the whole response.
    pub async fn exchange(&self, request: Outgoing<'_>) -> Result<Response, ExchangeError> {
        client::exchange(self, request, self.settings.max_response_bytes).await
    }

    /// Closes the idle connections past `idle_timeout`: the oldest, at the front.
    fn forget_expired(&self, idle: &mut VecDeque<Idle>) {
        while idle
            .front()
            .is_some_and(|oldest| oldest.since.elapsed() > self.settings.idle_timeout)
        {
            idle.pop_front();
        }
    }

    /// Idle connections on the calling thread (tests).
    pub fn idle_here(&self) -> usize {
        self.idle.get().map_or(0, |idle| idle.borrow().len())
    }
}

impl ConnectionPool for Pool {
    /// The newest idle connection of this thread that is still open, as `probe` tells.
    fn checkout(&self, probe: Probe) -> Option<Connection> {
        let mut idle = self.idle.get_or_default().borrow_mut();
        self.forget_expired(&mut idle);
        while let Some(Idle { connection, .. }) = idle.pop_back() {
            if connection.still_open(probe) {
                return Some(connection);
            }
        }
        None
    }

    /// A new connection; the error says why there is none.
    async fn connect(&self) -> Result<Connection, String> {
        let connect = TcpStream::connect(self.address.as_str());
        let stream = match tokio::time::timeout(self.settings.connect_timeout, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("connect timed out".into()),
        };
        let _ = stream.set_nodelay(true);
        Ok(Connection::new(stream))
    }

    fn checkin(&self, mut connection: Connection) {
        if self.settings.idle_timeout.is_zero() {
            return;
        }
        connection.shrink();
        // Expired ones were closed at the checkout just before.
        let mut idle = self.idle.get_or_default().borrow_mut();
        if idle.len() < self.settings.max_idle_per_thread {
            idle.push_back(Idle {
                connection,
                since: Instant::now(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::http::StatusCode;
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
        /// Answer in pieces, each written on its own a little after the one before, then
        /// keep the connection open.
        Pieces(&'static [&'static str]),
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
    async fn scripted(script: impl Fn(usize) -> Reply + Copy + Send + 'static) -> Replica {
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
                            Reply::Pieces(pieces) => {
                                for piece in pieces {
                                    stream.write_all(piece.as_bytes()).await.expect("write");
                                    // Not a wait for anything: a gap, so that the pieces
                                    // arrive in separate reads.
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                            }
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

    /// A replica that answers its first request and hangs up on every later one unanswered.
    async fn answers_once() -> Replica {
        scripted(|n| {
            if n == 0 {
                Reply::Answer(OK)
            } else {
                Reply::Hangup
            }
        })
        .await
    }

    /// A request's bytes, as the proxy would write them.
    fn wire(method: &str, path: &str, body: &str) -> Vec<u8> {
        let length = if body.is_empty() {
            String::new()
        } else {
            format!("content-length: {}\r\n", body.len())
        };
        format!("{method} {path} HTTP/1.1\r\nhost: replica\r\n{length}\r\n{body}").into_bytes()
    }

    fn get(path: &str) -> Vec<u8> {
        wire("GET", path, "")
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
            let response = pool
                .exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
            assert_eq!(response.status, 200);
            assert_eq!(response.body.as_ref(), b"ok");
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
            pool.exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
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
    async fn a_purchase_is_not_written_on_an_idle_connection_the_replica_closed() {
        // The replica is a plain thread, and the test blocks its runtime while the replica
        // hangs up: the reactor cannot have seen the close when the purchase is checked
        // out, so only asking the socket (the peek) finds it.
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        let (hang_up, hung_up) = (std::sync::mpsc::channel(), std::sync::mpsc::channel());
        let replica = std::thread::spawn(move || {
            let mut requests = 0;
            for round in 0..2 {
                let (mut stream, _) = listener.accept().expect("accept");
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                requests += 1;
                stream.write_all(OK.as_bytes()).expect("write");
                if round == 0 {
                    hang_up.1.recv().expect("told to hang up");
                    drop(stream);
                    hung_up.0.send(()).expect("report");
                }
            }
            requests
        });
        let pool = pool_with(&address, PoolSettings::default());
        pool.exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        hang_up.0.send(()).expect("hang up");
        hung_up.1.recv().expect("hung up");
        let purchase = wire("POST", "/api/seckill/1", "{}");
        let answer = pool
            .exchange(Outgoing::new(&purchase))
            .await
            .expect("on a new connection");
        assert_eq!(answer.body.as_ref(), b"ok");
        let requests = tokio::task::spawn_blocking(move || replica.join().expect("replica"))
            .await
            .expect("join");
        assert_eq!(
            requests, 2,
            "the purchase reached the replica once, on the new connection"
        );
    }

    #[tokio::test]
    async fn a_connection_close_answer_is_delivered_and_the_connection_not_kept() {
        let replica = scripted(|_| {
            Reply::Answer("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 3\r\n\r\nbye")
        })
        .await;
        let pool = pool(&replica);
        let response = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(response.body.as_ref(), b"bye");
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
        let response = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(response.body.as_ref(), b"abcdefg");
        // Still usable afterwards.
        let again = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(again.body.as_ref(), b"abcdefg");
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_that_reached_the_replica_is_never_sent_again() {
        // The first request is answered (the connection is then reused); the second is
        // received and the connection dropped without an answer.
        let replica = answers_once().await;
        let pool = pool(&replica);
        pool.exchange(Outgoing::new(&get("/")))
            .await
            .expect("first exchange");
        let purchase = wire("POST", "/api/seckill/1/purchase", "{}");
        let failed = pool.exchange(Outgoing::new(&purchase)).await;
        assert!(
            matches!(failed, Err(ExchangeError::Failed(_))),
            "{failed:?}"
        );
        assert_eq!(replica.requests.load(Ordering::SeqCst), 2);
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_safe_request_a_reused_connection_drops_unanswered_goes_again_on_a_new_one() {
        // As when the replica closes an idle connection just as the request is written:
        // the second request is received and the connection dropped without an answer.
        let replica = scripted(|n| {
            if n == 1 {
                Reply::Hangup
            } else {
                Reply::Answer(OK)
            }
        })
        .await;
        let pool = pool(&replica);
        pool.exchange(Outgoing::new(&get("/")))
            .await
            .expect("first exchange");
        let response = pool
            .exchange(Outgoing::new(&get("/again")))
            .await
            .expect("sent again");
        assert_eq!(response.body.as_ref(), b"ok");
        assert_eq!(replica.requests.load(Ordering::SeqCst), 3);
        assert_eq!(replica.connections.load(Ordering::SeqCst), 2);
        // A new connection that ends unanswered is not tried a third time.
        let replica = answers_once().await;
        let stubborn = self::pool(&replica);
        stubborn
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("first exchange");
        let failed = stubborn.exchange(Outgoing::new(&get("/again"))).await;
        assert!(
            matches!(failed, Err(ExchangeError::Failed(_))),
            "{failed:?}"
        );
        assert_eq!(replica.requests.load(Ordering::SeqCst), 3);
        assert_eq!(replica.connections.load(Ordering::SeqCst), 2);
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
        let refused = pool.exchange(Outgoing::new(&get("/"))).await;
        assert!(
            matches!(refused, Err(ExchangeError::TooLarge(4))),
            "{refused:?}"
        );
    }

    #[tokio::test]
    async fn an_answer_arriving_in_pieces_is_put_together() {
        let replica = scripted(|_| {
            Reply::Pieces(&[
                "HTTP/1.1 200 OK\r\ncontent-le",
                "ngth: 11\r\nx-a: 1\r\n\r\nhello",
                " world",
            ])
        })
        .await;
        let pool = pool(&replica);
        for _ in 0..2 {
            let response = pool
                .exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
            assert_eq!(response.header("x-a"), Some(&b"1"[..]));
            assert_eq!(response.body.as_ref(), b"hello world");
        }
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn interim_and_bodiless_answers_are_framed_right() {
        let replica = scripted(|n| match n {
            0 => Reply::Answer(
                "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok",
            ),
            1 => Reply::Answer("HTTP/1.1 204 No Content\r\n\r\n"),
            // A HEAD answer announces a length but carries no body.
            2 => Reply::Answer("HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"),
            _ => Reply::Answer(OK),
        })
        .await;
        let pool = pool(&replica);
        let created = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(
            (created.status, created.body.as_ref()),
            (StatusCode::CREATED, &b"ok"[..])
        );
        let empty = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(
            (empty.status, empty.body.len()),
            (StatusCode::NO_CONTENT, 0)
        );
        let head = wire("HEAD", "/", "");
        let head = pool.exchange(Outgoing::new(&head)).await.expect("exchange");
        assert_eq!(
            (
                head.header("content-length"),
                head.body.len(),
                head.length_given
            ),
            (Some(&b"99"[..]), 0, true)
        );
        // Every answer was framed exactly: the fourth still finds its connection in step.
        let last = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(last.body.as_ref(), b"ok");
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_204_announcing_a_body_is_not_reused_and_a_304_with_a_length_is() {
        let replica = scripted(|n| match n {
            0 => Reply::Answer("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n"),
            1 => Reply::Answer("HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n"),
            _ => Reply::Answer("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"),
        })
        .await;
        let pool = pool(&replica);
        for round in 1..=2 {
            let empty = pool
                .exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
            assert_eq!(
                (empty.status, empty.body.len()),
                (StatusCode::NO_CONTENT, 0)
            );
            assert_eq!(empty.header("content-length"), None, "a 204 has no length");
            assert_eq!(pool.idle_here(), 0, "round {round}: its body may follow");
        }
        let not_modified = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
        assert_eq!(not_modified.header("content-length"), Some(&b"5"[..]));
        assert_eq!(
            pool.idle_here(),
            1,
            "a 304 may state a length and stay in step"
        );
    }

    #[tokio::test]
    async fn bytes_after_an_answer_end_the_connection() {
        let replica = scripted(|n| {
            if n < 2 {
                Reply::Answer(
                    "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok\
                     HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nsmuggled",
                )
            } else {
                Reply::Answer(OK)
            }
        })
        .await;
        let pool = pool(&replica);
        for _ in 0..3 {
            let answer = pool
                .exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
            assert_eq!(answer.body.as_ref(), b"ok", "never the smuggled answer");
        }
        assert_eq!(replica.connections.load(Ordering::SeqCst), 3);
        assert_eq!(pool.idle_here(), 1, "only the clean one is kept");
    }

    #[tokio::test]
    async fn an_answer_keeps_its_end_to_end_headers_only() {
        let replica = scripted(|_| {
            Reply::Answer(
                "HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nKeep-Alive: timeout=5\r\n\
                 x-hop: 1\r\nProxy-Connection: keep-alive\r\nUpgrade: h2c\r\n\
                 X-End: 2\r\nContent-Length: 2\r\n\r\nok",
            )
        })
        .await;
        let pool = pool(&replica);
        for _ in 0..2 {
            let answer = pool
                .exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
            let names: Vec<&[u8]> = answer.lines().map(|(name, _)| name).collect();
            assert_eq!(
                names,
                [&b"X-End"[..]],
                "the length is the client side's to write"
            );
            assert_eq!(answer.body.as_ref(), b"ok");
        }
        assert_eq!(replica.connections.load(Ordering::SeqCst), 1, "kept alive");
    }

    #[tokio::test]
    async fn an_answer_without_framing_is_read_to_the_close_and_not_kept() {
        let replica =
            scripted(|_| Reply::AnswerThenHangUp("HTTP/1.0 200 OK\r\n\r\nall of it")).await;
        let pool = pool(&replica);
        let request = get("/");
        let exchange = pool.exchange(Outgoing::new(&request));
        let hang_up = async {
            // The answer is only complete once the replica closes.
            while replica.requests.load(Ordering::SeqCst) == 0 {
                tokio::task::yield_now().await;
            }
            replica.hang_up.notify_one();
        };
        let (response, ()) = tokio::join!(exchange, hang_up);
        assert_eq!(response.expect("exchange").body.as_ref(), b"all of it");
        assert_eq!(pool.idle_here(), 0);
    }

    #[tokio::test]
    async fn an_answer_with_both_framings_is_read_chunked_resized_and_not_kept() {
        let replica = scripted(|_| {
            Reply::Answer(
                "HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n\
                 3\r\nabc\r\n0\r\n\r\n",
            )
        })
        .await;
        let pool = pool(&replica);
        let response = pool
            .exchange(Outgoing::new(&get("/")))
            .await
            .expect("exchange");
        assert_eq!(response.body.as_ref(), b"abc");
        assert_eq!(
            response.lines().count(),
            0,
            "neither framing header travels: the length is of what was read"
        );
        assert_eq!(
            pool.idle_here(),
            0,
            "a suspect answer's connection is not reused"
        );
    }

    #[tokio::test]
    async fn conflicting_lengths_or_a_chunk_size_without_digits_fail_the_exchange() {
        for answer in [
            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 10\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n;x\r\nabc\r\n0\r\n\r\n",
        ] {
            let replica = scripted(move |_| Reply::Answer(answer)).await;
            let failed = pool(&replica).exchange(Outgoing::new(&get("/"))).await;
            assert!(
                matches!(failed, Err(ExchangeError::Failed(_))),
                "{answer:?}: {failed:?}"
            );
        }
    }

    #[tokio::test]
    async fn idle_connections_past_their_time_are_closed_not_reused() {
        let replica = scripted(|_| Reply::Answer(OK)).await;
        let pool = pool_with(
            &replica.address,
            PoolSettings {
                idle_timeout: Duration::ZERO,
                ..PoolSettings::default()
            },
        );
        for _ in 0..2 {
            pool.exchange(Outgoing::new(&get("/")))
                .await
                .expect("exchange");
            assert_eq!(pool.idle_here(), 0, "closed at once, not parked");
        }
        assert_eq!(replica.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let pool = pool_with(&address, PoolSettings::default());
        let refused = pool.exchange(Outgoing::new(&get("/purchase"))).await;
        // Nothing was sent: another replica may have it.
        assert!(
            matches!(refused, Err(ExchangeError::Connect(_))),
            "{refused:?}"
        );
    }
}
