//! The client side's HTTP/1.1 rules, byte for byte: requests whose end is ambiguous never
//! reach a replica, bodies are re-framed, pipelined requests are answered in order, and a
//! connection is never reused once it could be out of step.

use crate::helpers::user_token;
use crate::raw::{RawClient, gateway_with};

fn bearer() -> String {
    format!("authorization: Bearer {}\r\n", user_token(81))
}

/// A request smuggled behind an ambiguous one: were it read as a request of its own, the
/// replica would record it.
const SMUGGLED: &str = "GET /admin/products HTTP/1.1\r\nhost: x\r\n\r\n";

#[tokio::test]
async fn requests_whose_end_is_ambiguous_are_refused_and_never_reach_a_replica() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = bearer();
    for (framing, status) in [
        ("content-length: 4\r\ntransfer-encoding: chunked\r\n", 400),
        ("transfer-encoding: chunked\r\ncontent-length: 4\r\n", 400),
        ("content-length: 4\r\ncontent-length: 40\r\n", 400),
        ("content-length: 4, 40\r\n", 400),
        ("content-length: +4\r\n", 400),
        ("transfer-encoding: chunked, identity\r\n", 400),
        (
            "transfer-encoding: chunked\r\ntransfer-encoding: x\r\n",
            400,
        ),
        ("transfer-encoding: gzip, chunked\r\n", 501),
        ("transfer-encoding : chunked\r\n", 400),
        ("transfer-encoding: chunked\r\n folded: yes\r\n", 400),
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client
            .send(format!(
                "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}{framing}\r\n0\r\n\r\n{SMUGGLED}"
            ))
            .await;
        assert_eq!(client.last_answer().await.status, status, "{framing:?}");
    }
    let mut old = RawClient::connect(&gateway).await;
    old.send(format!(
        "POST /api/seckill/1 HTTP/1.0\r\n{auth}transfer-encoding: chunked\r\n\r\n0\r\n\r\n{SMUGGLED}"
    ))
    .await;
    assert_eq!(
        old.last_answer().await.status,
        400,
        "chunked is not HTTP/1.0"
    );
    assert!(replica.seen().is_empty(), "{:?}", replica.seen());
}

#[tokio::test]
async fn a_chunked_body_reaches_the_replica_whole_and_framed_by_its_length() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(format!(
            "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{}transfer-encoding: chunked\r\n\r\n\
             4;ext=1\r\n{{\"a\"\r\n3\r\n:1}}\r\n0\r\nx-trailer: dropped\r\n\r\n",
            bearer()
        ))
        .await;
    let answer = client.answer().await;
    assert_eq!((answer.status, answer.body.as_slice()), (200, &b"ok"[..]));
    assert!(!answer.closes(), "the body was read to its end: kept");
    let seen = replica.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, br#"{"a":1}"#);
    assert_eq!(seen[0].header("content-length"), Some("7"));
    assert_eq!(seen[0].header("x-trailer"), None);

    for malformed in [
        "zz\r\nab\r\n0\r\n\r\n",
        "2\r\nabc\r\n0\r\n\r\n",
        "2\nab\r\n0\r\n\r\n",
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client
            .send(format!(
                "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{}transfer-encoding: chunked\r\n\r\n{malformed}{SMUGGLED}",
                bearer()
            ))
            .await;
        assert_eq!(client.last_answer().await.status, 400, "{malformed:?}");
    }
    assert_eq!(replica.seen().len(), 1, "no malformed body was forwarded");
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = bearer();
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(format!(
            "GET /api/products/1 HTTP/1.1\r\nhost: x\r\n{auth}x-request-id: one\r\n\r\n\
             POST /api/seckill/2 HTTP/1.1\r\nhost: x\r\n{auth}x-request-id: two\r\ncontent-length: 2\r\n\r\n{{}}\
             HEAD /api/products/3 HTTP/1.1\r\nhost: x\r\n{auth}x-request-id: three\r\n\r\n\
             GET /api/products/4 HTTP/1.1\r\nhost: x\r\n{auth}x-request-id: four\r\n\r\n"
        ))
        .await;
    for (id, head) in [
        ("one", false),
        ("two", false),
        ("three", true),
        ("four", false),
    ] {
        let answer = client.answer_to(head).await;
        assert_eq!(answer.status, 200, "{id}");
        assert_eq!(answer.header("x-request-id"), Some(id));
        let body: &[u8] = if head { b"" } else { b"ok" };
        assert_eq!(answer.body, body, "{id}");
    }
    let targets: Vec<String> = replica.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(
        targets,
        [
            "/api/products/1",
            "/api/seckill/2",
            "/api/products/3",
            "/api/products/4"
        ]
    );
    assert_eq!(replica.seen()[1].body, b"{}");
}

#[tokio::test]
async fn expect_100_continue_is_answered_only_when_the_body_is_wanted() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(format!(
            "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{}expect: 100-continue\r\ncontent-length: 2\r\n\r\n",
            bearer()
        ))
        .await;
    assert_eq!(client.answer().await.status, 100, "go on");
    client.send("{}").await;
    let answer = client.answer().await;
    assert_eq!(answer.status, 200);
    assert_eq!(replica.seen()[0].body, b"{}");
    assert_eq!(replica.seen()[0].header("expect"), None, "answered here");

    // Refused before the body was needed: no 100, and the connection ends, since the body
    // the client may still send would be read as a request.
    let mut refused = RawClient::connect(&gateway).await;
    refused
        .send("POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n")
        .await;
    assert_eq!(refused.last_answer().await.status, 401);

    let mut odd = RawClient::connect(&gateway).await;
    odd.send("GET /api/products HTTP/1.1\r\nhost: x\r\nexpect: something-else\r\n\r\n")
        .await;
    assert_eq!(odd.answer().await.status, 417);
    assert_eq!(replica.seen().len(), 1);
}

#[tokio::test]
async fn a_refused_request_keeps_the_connection_only_when_its_whole_body_was_buffered() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let mut client = RawClient::connect(&gateway).await;
    // No token: 401. The body arrived with the head, so it is skipped and the connection
    // stays in step for the next request.
    client
        .send(format!(
            "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\ncontent-length: 14\r\n\r\n{SMUGGLED:.14}\
             GET /api/products/1 HTTP/1.1\r\nhost: x\r\n{}\r\n",
            bearer()
        ))
        .await;
    let refused = client.answer().await;
    assert_eq!(refused.status, 401);
    assert!(!refused.closes());
    assert_eq!(client.answer().await.status, 200);
    // A body still on its way: the connection ends after the refusal.
    client
        .send("POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\nshort")
        .await;
    assert_eq!(client.last_answer().await.status, 401);
    let targets: Vec<String> = replica.seen().into_iter().map(|s| s.target).collect();
    assert_eq!(
        targets,
        ["/api/products/1"],
        "the skipped body was never a request"
    );
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_before_it_is_read() {
    let (gateway, replica) = gateway_with(|s| s.max_body_bytes = 16).await;
    let auth = bearer();
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(format!(
            "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}expect: 100-continue\r\ncontent-length: 17\r\n\r\n"
        ))
        .await;
    assert_eq!(
        client.last_answer().await.status,
        413,
        "no 100 Continue for a body that is refused"
    );
    let mut chunked = RawClient::connect(&gateway).await;
    chunked
        .send(format!(
            "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\n{auth}transfer-encoding: chunked\r\n\r\n\
             10\r\n0123456789abcdef\r\n1\r\nx\r\n0\r\n\r\n"
        ))
        .await;
    assert_eq!(chunked.last_answer().await.status, 413);
    assert!(replica.seen().is_empty());
}

#[tokio::test]
async fn heads_that_break_the_request_line_or_host_rules_get_400() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let auth = bearer();
    for bad in [
        format!("GET /api/products/1 HTTP/1.1\r\n{auth}\r\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: a\r\nhost: b\r\n{auth}\r\n"),
        format!("GET api/products/1 HTTP/1.1\r\nhost: a\r\n{auth}\r\n"),
        format!("GET /api/products/1 HTTP/1.2\r\nhost: a\r\n{auth}\r\n"),
        format!("GET /api/products/1 HTTP/1.1\r\nhost: a\r\nbad header: 1\r\n{auth}\r\n"),
        "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(),
    ] {
        let mut client = RawClient::connect(&gateway).await;
        client.send(&bad).await;
        assert_eq!(client.last_answer().await.status, 400, "{bad:?}");
    }
    let mut dotted = RawClient::connect(&gateway).await;
    dotted
        .send(format!(
            "GET /api/products/%2e%2e/%2e%2e/admin/products HTTP/1.1\r\nhost: a\r\n{auth}\r\n"
        ))
        .await;
    assert_eq!(dotted.answer().await.status, 400);
    assert!(replica.seen().is_empty());

    // An absolute-form target is understood, and forwarded as its path.
    dotted
        .send(format!(
            "GET http://gateway.example/api/products/1?x=1 HTTP/1.1\r\nhost: gateway.example\r\n{auth}\r\n"
        ))
        .await;
    assert_eq!(dotted.answer().await.status, 200);
    assert_eq!(replica.seen()[0].target, "/api/products/1?x=1");
}

#[tokio::test]
async fn http_1_0_clients_are_closed_after_each_answer_unless_they_ask_to_keep_alive() {
    let (gateway, _replica) = gateway_with(|_| {}).await;
    let auth = bearer();
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(format!(
            "GET /api/products/1 HTTP/1.0\r\n{auth}connection: keep-alive\r\n\r\n"
        ))
        .await;
    let kept = client.answer().await;
    assert_eq!(kept.status, 200);
    assert_eq!(kept.header("connection"), Some("keep-alive"));
    client
        .send(format!("GET /api/products/1 HTTP/1.0\r\n{auth}\r\n"))
        .await;
    assert_eq!(client.last_answer().await.status, 200);
}
