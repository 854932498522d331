//! HTTP/1.1 by hand, for the tests of the gateway's client side: a client that writes exact
//! bytes and reads answers one by one, and a replica that records every request it was sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::echo::{Gateway, settings, spawn_gateway};

/// One answer as it came off the wire.
#[derive(Debug)]
pub struct RawAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawAnswer {
    /// The first value of `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        first_value(&self.headers, name)
    }

    /// Whether the gateway said it closes the connection after this answer.
    pub fn closes(&self) -> bool {
        self.header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
    }
}

/// A client connection that sends exactly what it is given.
pub struct RawClient {
    stream: TcpStream,
    read: Vec<u8>,
}

/// How long a test waits for any one thing before it fails.
const PATIENCE: Duration = Duration::from_secs(5);

impl RawClient {
    pub async fn connect(gateway: &Gateway) -> Self {
        let address = gateway.url.trim_start_matches("http://");
        let stream = TcpStream::connect(address).await.expect("connect");
        Self {
            stream,
            read: Vec::new(),
        }
    }

    pub async fn send(&mut self, bytes: impl AsRef<[u8]>) {
        self.stream
            .write_all(bytes.as_ref())
            .await
            .expect("write to the gateway");
    }

    /// Reads more; false at the end of the stream.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        let read = tokio::time::timeout(PATIENCE, self.stream.read(&mut chunk))
            .await
            .expect("the gateway answers in time");
        match read {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.read.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// The next answer; `head_request`: it answers a HEAD (no body follows).
    pub async fn answer_to(&mut self, head_request: bool) -> RawAnswer {
        loop {
            let mut slots = [httparse::EMPTY_HEADER; 64];
            let mut parsed = httparse::Response::new(&mut slots);
            if let httparse::Status::Complete(length) =
                parsed.parse(&self.read).expect("a well-formed answer")
            {
                let status = parsed.code.expect("status");
                let headers: Vec<(String, String)> = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        let value = String::from_utf8_lossy(h.value).into_owned();
                        (h.name.to_ascii_lowercase(), value)
                    })
                    .collect();
                let body_length = if head_request || status == 204 || status < 200 {
                    0
                } else {
                    let length = headers
                        .iter()
                        .find(|(n, _)| n == "content-length")
                        .expect("every answer of the gateway states its length");
                    length.1.parse::<usize>().expect("digits")
                };
                while self.read.len() < length + body_length {
                    assert!(self.fill().await, "the connection ended mid-answer");
                }
                let body = self.read[length..length + body_length].to_vec();
                self.read.drain(..length + body_length);
                return RawAnswer {
                    status,
                    headers,
                    body,
                };
            }
            assert!(self.fill().await, "the connection ended before an answer");
        }
    }

    pub async fn answer(&mut self) -> RawAnswer {
        self.answer_to(false).await
    }

    /// The next answer, which must say `connection: close` and be followed by the close.
    pub async fn last_answer(&mut self) -> RawAnswer {
        let answer = self.answer().await;
        assert!(answer.closes(), "{answer:?} should end the connection");
        self.closed().await;
        answer
    }

    /// Waits until the gateway closes the connection, with nothing more said; how long
    /// that took.
    pub async fn closed(&mut self) -> Duration {
        let started = Instant::now();
        while self.fill().await {}
        assert!(
            self.read.is_empty(),
            "unexpected bytes: {:?}",
            String::from_utf8_lossy(&self.read)
        );
        started.elapsed()
    }
}

/// A request as a replica received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        first_value(&self.headers, name)
    }
}

/// The first value of the header `name` (any case) among `headers`.
fn first_value<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A replica that answers `200 ok` to everything (after a second on a path ending in
/// `/slow`) and records each request, its body read by its `Content-Length`.
pub struct Recorder {
    pub url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    arrived: Arc<AtomicUsize>,
}

impl Recorder {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(AtomicUsize::new(0));
        let (log, count) = (seen.clone(), arrived.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(record(stream, log.clone(), count.clone()));
            }
        });
        Self { url, seen, arrived }
    }

    /// The requests answered so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    /// The requests received so far, answered or not yet.
    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }
}

async fn record(mut stream: TcpStream, log: Arc<Mutex<Vec<Seen>>>, arrived: Arc<AtomicUsize>) {
    let mut read = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let parsed = {
            let mut slots = [httparse::EMPTY_HEADER; 64];
            let mut request = httparse::Request::new(&mut slots);
            match request.parse(&read) {
                Ok(httparse::Status::Complete(length)) => Some((
                    length,
                    Seen {
                        method: request.method.unwrap_or_default().to_string(),
                        target: request.path.unwrap_or_default().to_string(),
                        headers: request
                            .headers
                            .iter()
                            .map(|h| {
                                let value = String::from_utf8_lossy(h.value).into_owned();
                                (h.name.to_ascii_lowercase(), value)
                            })
                            .collect(),
                        body: Vec::new(),
                    },
                )),
                Ok(httparse::Status::Partial) => None,
                Err(_) => return,
            }
        };
        let Some((length, mut seen)) = parsed else {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        assert!(
            seen.header("transfer-encoding").is_none(),
            "the gateway frames bodies by length"
        );
        let body_length: usize = seen
            .header("content-length")
            .map_or(0, |v| v.parse().expect("a length the gateway wrote"));
        while read.len() < length + body_length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&chunk[..n]),
            }
        }
        seen.body = read[length..length + body_length].to_vec();
        read.drain(..length + body_length);
        let head = seen.method == "HEAD";
        arrived.fetch_add(1, Ordering::SeqCst);
        if seen.target.ends_with("/slow") {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        log.lock().expect("lock").push(seen);
        let answer: &[u8] = if head {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
        } else {
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        };
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

/// A gateway in front of a new recorder, with `configure` applied to its settings.
pub async fn gateway_with(configure: impl FnOnce(&mut gateway::Settings)) -> (Gateway, Recorder) {
    let recorder = Recorder::start().await;
    let mut settings = settings(&recorder.url);
    configure(&mut settings);
    (spawn_gateway(settings).await, recorder)
}
