//! Strict framing on both legs: a bare LF never ends a line of a request head or a chunked
//! body's trailers, and an upstream connection is never reused once its bytes could be out
//! of step with its requests (a 204 announcing a body, bytes after an answer, bytes
//! arriving while it is idle). The upstream here is a raw socket that says exactly what
//! each test needs, this being a test of the protocol.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use seckill_testkit::eventually;

use crate::echo::{Gateway, settings, spawn_gateway};
use crate::helpers::user_token;
use crate::raw::{RawClient, gateway_with};

fn get(method: &str, path: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n",
        user_token(111)
    )
}

/// A request smuggled behind an ambiguous one.
const SMUGGLED: &str = "GET /admin/products HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test]
async fn a_bare_lf_in_a_request_head_is_refused_with_400_and_the_connection_closed() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = format!("authorization: Bearer {}", user_token(112));
    for head in [
        format!("GET /api/products/1 HTTP/1.1\nhost: x\r\n{auth}\r\n\r\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: x\n{auth}\r\n\r\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: x\r\n{auth}\n\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: x\r\n{auth}\r\n\n{SMUGGLED}"),
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client.send(&head).await;
        assert_eq!(client.last_answer().await.status, 400, "{head:?}");
    }
    assert!(replica.seen().is_empty(), "{:?}", replica.seen());
}

#[tokio::test]
async fn trailers_must_be_header_lines_ended_by_crlf() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = format!("authorization: Bearer {}\r\n", user_token(113));
    for trailers in [
        "x-t: 1\n\r\n",
        "x-t: 1\r\n\n",
        "\n",
        "bad trailer: 1\r\n\r\n",
        "no-colon\r\n\r\n",
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client
            .send(format!(
                "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}transfer-encoding: chunked\r\n\r\n\
                 2\r\n{{}}\r\n0\r\n{trailers}{SMUGGLED}"
            ))
            .await;
        assert_eq!(client.last_answer().await.status, 400, "{trailers:?}");
    }
    assert!(replica.seen().is_empty(), "{:?}", replica.seen());
    let mut fine = RawClient::connect(&gateway).await;
    fine.send(format!(
        "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}transfer-encoding: chunked\r\n\r\n\
         2\r\n{{}}\r\n0\r\nx-t: 1\r\nx-u: 2\r\n\r\n"
    ))
    .await;
    let answer = fine.answer().await;
    assert_eq!(answer.status, 200);
    assert!(!answer.closes());
    let seen = replica.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].header("x-t"), None, "trailers are dropped");
}

/// What the raw upstream says to its n-th request (counted over all its connections).
#[derive(Clone, Copy)]
enum Say {
    /// These bytes.
    Answer(&'static str),
    /// These bytes, then, once the test says so, the second ones unasked.
    ThenStray(&'static str, &'static str),
}

const FRESH: &str = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfresh";
const SMUGGLED_ANSWER: &str = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nsmuggled";

struct RawUpstream {
    connections: Arc<AtomicUsize>,
    stray: Arc<Notify>,
    strayed: Arc<AtomicUsize>,
}

/// A gateway on one worker thread (one upstream pool) in front of a raw upstream.
async fn behind_raw_upstream(script: fn(usize) -> Say) -> (Gateway, RawUpstream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let upstream = RawUpstream {
        connections: Arc::new(AtomicUsize::new(0)),
        stray: Arc::new(Notify::new()),
        strayed: Arc::new(AtomicUsize::new(0)),
    };
    let (connections, stray, strayed) = (
        upstream.connections.clone(),
        upstream.stray.clone(),
        upstream.strayed.clone(),
    );
    let requests = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            connections.fetch_add(1, Ordering::SeqCst);
            let (stray, strayed, requests) = (stray.clone(), strayed.clone(), requests.clone());
            tokio::spawn(async move {
                let mut read = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    // Bodiless requests only: a head is all there is.
                    while !read.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => read.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let end = read.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                    read.drain(..end);
                    match script(requests.fetch_add(1, Ordering::SeqCst)) {
                        Say::Answer(bytes) => {
                            if stream.write_all(bytes.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        Say::ThenStray(bytes, later) => {
                            if stream.write_all(bytes.as_bytes()).await.is_err() {
                                return;
                            }
                            stray.notified().await;
                            let _ = stream.write_all(later.as_bytes()).await;
                            strayed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
    });
    let gateway = spawn_gateway(gateway::Settings {
        workers: 1,
        ..settings(&url)
    })
    .await;
    (gateway, upstream)
}

#[tokio::test]
async fn an_upstream_204_announcing_a_body_is_sent_on_bodiless_and_its_connection_dropped() {
    let (gateway, upstream) = behind_raw_upstream(|n| match n {
        0 => Say::Answer(
            "HTTP/1.1 204 No Content\r\ncontent-length: 46\r\n\r\n\
             HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nsmuggled",
        ),
        _ => Say::Answer(FRESH),
    })
    .await;
    let mut client = RawClient::connect(&gateway).await;
    client.send(get("GET", "/api/products/1")).await;
    let empty = client.answer().await;
    assert_eq!((empty.status, empty.header("content-length")), (204, None));
    client.send(get("GET", "/api/products/2")).await;
    assert_eq!(client.answer().await.body, b"fresh");
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn head_and_304_answers_with_a_length_keep_their_connection_in_step() {
    let (gateway, upstream) = behind_raw_upstream(|n| match n {
        0 => Say::Answer("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
        1 => Say::Answer("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"),
        _ => Say::Answer(FRESH),
    })
    .await;
    let mut client = RawClient::connect(&gateway).await;
    client.send(get("HEAD", "/api/products/1")).await;
    let head = client.answer_to(true).await;
    assert_eq!(
        (head.status, head.header("content-length")),
        (200, Some("5"))
    );
    client.send(get("GET", "/api/products/1")).await;
    // A 304 has no body, whatever length it states.
    assert_eq!(client.answer_to(true).await.status, 304);
    client.send(get("GET", "/api/products/2")).await;
    assert_eq!(client.answer().await.body, b"fresh");
    assert_eq!(
        upstream.connections.load(Ordering::SeqCst),
        1,
        "no body was read where there was none: the connection stayed usable"
    );
}

#[tokio::test]
async fn bytes_after_an_upstream_answer_never_answer_the_next_request() {
    let (gateway, upstream) = behind_raw_upstream(|n| match n {
        0 => Say::Answer(
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst\
             HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nsmuggled",
        ),
        _ => Say::Answer(FRESH),
    })
    .await;
    let mut client = RawClient::connect(&gateway).await;
    client.send(get("GET", "/api/products/1")).await;
    assert_eq!(client.answer().await.body, b"first");
    client.send(get("GET", "/api/products/2")).await;
    assert_eq!(client.answer().await.body, b"fresh");
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn bytes_an_upstream_sends_while_idle_close_the_connection_instead_of_answering() {
    // A safe request and a purchase: the pool checks them in different ways.
    for (method, path) in [("GET", "/api/products/2"), ("POST", "/api/seckill/2")] {
        let (gateway, upstream) = behind_raw_upstream(|n| match n {
            0 => Say::ThenStray(
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst",
                SMUGGLED_ANSWER,
            ),
            _ => Say::Answer(FRESH),
        })
        .await;
        let mut client = RawClient::connect(&gateway).await;
        client.send(get("GET", "/api/products/1")).await;
        assert_eq!(client.answer().await.body, b"first");
        upstream.stray.notify_one();
        eventually("the stray bytes sent", Duration::from_secs(5), || async {
            (upstream.strayed.load(Ordering::SeqCst) == 1).then_some(())
        })
        .await;
        client.send(get(method, path)).await;
        assert_eq!(client.answer().await.body, b"fresh", "{method}");
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2, "{method}");
    }
}
