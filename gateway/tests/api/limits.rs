//! The bounds on connections and work under way: caps on open connections (overall and per
//! client address), the first-byte timeout, operator endpoints that take no body, the
//! in-flight bound taken only once a body is in, and the per-user cap on purchases.

use std::time::Duration;

use seckill_testkit::eventually;

use crate::helpers::user_token;
use crate::raw::{RawClient, gateway_with};

fn request(method: &str, path: &str, user: i64, rest: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n{rest}\r\n",
        user_token(user)
    )
}

#[tokio::test]
async fn a_connection_past_either_cap_gets_503_and_is_closed() {
    for (max, per_ip, reason) in [
        (100, 2, "max_connections_per_ip"),
        (2, 2, "max_connections"),
    ] {
        let (gateway, replica) = gateway_with(|s| {
            s.max_connections = max;
            s.max_connections_per_ip = per_ip;
        })
        .await;
        let mut open = Vec::new();
        for _ in 0..2 {
            let mut client = RawClient::connect(&gateway).await;
            client
                .send(request("GET", "/api/products/1", 101, ""))
                .await;
            assert_eq!(client.answer().await.status, 200, "{reason}: served");
            open.push(client);
        }
        let mut refused = RawClient::connect(&gateway).await;
        refused
            .send(request("GET", "/api/products/1", 101, ""))
            .await;
        let answer = refused.last_answer().await;
        assert_eq!(answer.status, 503, "{reason}");
        assert_eq!(answer.header("retry-after"), Some("1"));
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        assert_eq!(body["code"], "unavailable");
        assert_eq!(
            replica.seen().len(),
            2,
            "{reason}: the refused request went nowhere"
        );

        // A place is given back when a connection ends.
        drop(open.pop());
        eventually("a place freed", Duration::from_secs(5), || async {
            let response = gateway.get("/healthz").send().await.ok()?;
            response.status().is_success().then_some(())
        })
        .await;
        let refusals = gateway
            .metric("gateway_connections_refused_total", &[("reason", reason)])
            .await;
        assert!(refusals >= 1.0, "{reason}: counted ({refusals})");
    }
}

#[tokio::test]
async fn a_trusted_proxy_is_held_to_the_global_cap_only() {
    let (gateway, _replica) = gateway_with(|s| {
        s.max_connections_per_ip = 1;
        s.trusted_proxies = "127.0.0.1".into();
    })
    .await;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut client = RawClient::connect(&gateway).await;
        client
            .send(request("GET", "/api/products/1", 102, ""))
            .await;
        assert_eq!(client.answer().await.status, 200);
        open.push(client);
    }
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_first_byte_timeout() {
    let (gateway, replica) = gateway_with(|s| {
        s.client_first_byte_timeout = Duration::from_millis(300);
    })
    .await;
    let before = gateway
        .metric(
            "gateway_connections_closed_total",
            &[("reason", "first_byte_timeout")],
        )
        .await;
    let mut silent = RawClient::connect(&gateway).await;
    let waited = silent.closed().await;
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(4),
        "closed after {waited:?}"
    );
    let after = gateway
        .metric(
            "gateway_connections_closed_total",
            &[("reason", "first_byte_timeout")],
        )
        .await;
    assert!(after > before, "counted: {before} -> {after}");

    // A kept-alive connection waits the idle timeout between requests, not this one.
    let mut kept = RawClient::connect(&gateway).await;
    kept.send(request("GET", "/api/products/1", 103, "")).await;
    assert_eq!(kept.answer().await.status, 200);
    // Not a wait for anything: a gap longer than the first-byte timeout.
    tokio::time::sleep(Duration::from_millis(600)).await;
    kept.send(request("GET", "/api/products/2", 103, "")).await;
    assert_eq!(kept.answer().await.status, 200);
    assert_eq!(replica.seen().len(), 2);
}

#[tokio::test]
async fn operator_endpoints_refuse_a_body_at_once_and_close() {
    let (gateway, _replica) = gateway_with(|_| {}).await;
    for framing in ["content-length: 10\r\n", "transfer-encoding: chunked\r\n"] {
        // The body never comes: before, the connection was held for it forever.
        let mut client = RawClient::connect(&gateway).await;
        client
            .send(format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{framing}\r\n"))
            .await;
        let answer = client.last_answer().await;
        assert_eq!(answer.status, 413, "{framing:?}");
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        assert_eq!(body["code"], "payload_too_large");
    }
    // Even a body already there is not skipped: the connection ends.
    let mut whole = RawClient::connect(&gateway).await;
    whole
        .send("GET /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        .await;
    assert_eq!(whole.last_answer().await.status, 413);
    let mut plain = RawClient::connect(&gateway).await;
    plain
        .send("GET /healthz HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        .await;
    let answer = plain.answer().await;
    assert_eq!(answer.status, 200);
    assert!(!answer.closes());
}

#[tokio::test]
async fn slow_bodies_hold_no_in_flight_slot_and_do_not_shed_fast_requests() {
    let (gateway, replica) = gateway_with(|s| s.max_in_flight = 1).await;
    let mut trickling = Vec::new();
    for user in [104, 105] {
        let mut slow = RawClient::connect(&gateway).await;
        slow.send(request(
            "POST",
            "/api/seckill/1",
            user,
            "expect: 100-continue\r\ncontent-length: 10\r\n",
        ))
        .await;
        // Sent once the gateway wants the body: it is reading it now.
        assert_eq!(slow.answer().await.status, 100);
        slow.send("{\"a\"").await;
        trickling.push(slow);
    }
    let mut fast = RawClient::connect(&gateway).await;
    fast.send(request(
        "POST",
        "/api/seckill/2",
        106,
        "content-length: 2\r\n",
    ))
    .await;
    fast.send("{}").await;
    let answer = fast.answer().await;
    assert_eq!(answer.status, 200, "not shed: {answer:?}");
    for mut slow in trickling {
        slow.send(":1}   ").await;
        assert_eq!(slow.answer().await.status, 200);
    }
    assert_eq!(replica.seen().len(), 3);
}

#[tokio::test]
async fn a_user_with_max_purchases_under_way_gets_429_for_the_next() {
    let (gateway, replica) = gateway_with(|s| s.max_purchases_per_user = 1).await;
    let mut first = RawClient::connect(&gateway).await;
    // The replica answers a path ending in /slow after a second.
    first
        .send(request(
            "POST",
            "/api/seckill/slow",
            107,
            "content-length: 2\r\n",
        ))
        .await;
    first.send("{}").await;
    eventually(
        "the purchase at the replica",
        Duration::from_secs(5),
        || async { (replica.arrived() == 1).then_some(()) },
    )
    .await;
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(request(
            "POST",
            "/api/seckill/1",
            107,
            "content-length: 2\r\n",
        ))
        .await;
    client.send("{}").await;
    let refused = client.answer().await;
    assert_eq!(refused.status, 429);
    let body: serde_json::Value = serde_json::from_slice(&refused.body).expect("json");
    assert_eq!(body["code"], "too_many_purchases");
    // Another user, and the same user's other requests, are not held back.
    client
        .send(request(
            "POST",
            "/api/seckill/1",
            108,
            "content-length: 2\r\n",
        ))
        .await;
    client.send("{}").await;
    assert_eq!(client.answer().await.status, 200);
    client
        .send(request("GET", "/api/products/1", 107, ""))
        .await;
    assert_eq!(client.answer().await.status, 200);
    assert_eq!(first.answer().await.status, 200);
    // Its place back, the user buys again.
    client
        .send(request(
            "POST",
            "/api/seckill/1",
            107,
            "content-length: 2\r\n",
        ))
        .await;
    client.send("{}").await;
    assert_eq!(client.answer().await.status, 200);
}
