//! How long the gateway waits for a client, and how it lets go: trickled heads and idle
//! connections are cut off, a late body is a 408, and shutdown answers the requests under
//! way while closing idle connections at once.

use std::time::Duration;

use crate::helpers::user_token;
use crate::raw::{RawClient, gateway_with};

fn get(path: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\r\n",
        user_token(91)
    )
}

#[tokio::test]
async fn a_client_that_trickles_its_head_is_cut_off_after_the_header_timeout() {
    let (gateway, replica) =
        gateway_with(|s| s.client_header_timeout = Duration::from_millis(300)).await;
    let mut client = RawClient::connect(&gateway).await;
    client
        .send("GET /api/products/1 HTTP/1.1\r\nhost: x\r\n")
        .await;
    let waited = client.closed().await;
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}"
    );
    assert!(replica.seen().is_empty());
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_the_idle_timeout_and_not_before_its_answer() {
    let (gateway, replica) =
        gateway_with(|s| s.client_idle_timeout = Duration::from_millis(300)).await;
    let mut client = RawClient::connect(&gateway).await;
    client.send(get("/api/products/1")).await;
    let answer = client.answer().await;
    assert_eq!(answer.status, 200);
    assert!(!answer.closes(), "kept alive");
    let waited = client.closed().await;
    assert!(
        waited >= Duration::from_millis(250),
        "closed after {waited:?}"
    );
    assert_eq!(replica.seen().len(), 1);
}

#[tokio::test]
async fn a_body_that_comes_too_slowly_gets_408_and_the_connection_ends() {
    let (gateway, replica) = gateway_with(|s| s.request_timeout = Duration::from_millis(300)).await;
    let mut client = RawClient::connect(&gateway).await;
    client
        .send(format!(
            "POST /api/seckill/1 HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-length: 10\r\n\r\n{{}}",
            user_token(92)
        ))
        .await;
    let answer = client.last_answer().await;
    assert_eq!(answer.status, 408);
    let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
    assert_eq!(body["code"], "request_timeout");
    assert!(replica.seen().is_empty());
}

#[tokio::test]
async fn shutdown_answers_requests_under_way_and_closes_idle_connections() {
    let (gateway, replica) = gateway_with(|_| {}).await;
    let mut idle = RawClient::connect(&gateway).await;
    idle.send(get("/api/products/1")).await;
    assert_eq!(idle.answer().await.status, 200);
    let mut busy = RawClient::connect(&gateway).await;
    busy.send(get("/api/products/slow")).await;
    seckill_testkit::eventually(
        "the slow request at the replica",
        Duration::from_secs(5),
        || async { (replica.arrived() == 2).then_some(()) },
    )
    .await;
    gateway.shutdown();
    idle.closed().await;
    assert_eq!(
        replica.seen().len(),
        1,
        "the idle connection closed while the slow request was still under way"
    );
    let answer = busy.last_answer().await;
    assert_eq!(
        answer.status, 200,
        "the request under way is answered, then closed"
    );
    assert_eq!(replica.seen().len(), 2);
}
