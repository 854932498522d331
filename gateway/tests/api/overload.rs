//! Overload and oversize: shedding, deadlines, and request heads beyond the limits.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use seckill_testkit::eventually;

use crate::echo::{Gateway, settings, spawn_echo, spawn_gateway};
use crate::helpers::{assert_error, user_token};

/// Sends `head` on a raw connection and returns the status line of the answer.
async fn raw_status_line(gateway: &Gateway, head: &str) -> String {
    let address = gateway.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    answer.lines().next().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_request_head_beyond_the_limits_gets_431_and_the_gateway_carries_on() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        max_header_bytes: 16 * 1024,
        max_headers: 32,
        ..settings(&echo.url)
    })
    .await;
    let huge = format!(
        "GET /healthz HTTP/1.1\r\nhost: x\r\nx-padding: {}\r\n\r\n",
        "a".repeat(20 * 1024)
    );
    assert_eq!(
        raw_status_line(&gateway, &huge).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let many: String = (0..40).map(|i| format!("x-h{i}: {i}\r\n")).collect();
    let many = format!("GET /healthz HTTP/1.1\r\nhost: x\r\n{many}\r\n");
    assert_eq!(
        raw_status_line(&gateway, &many).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );

    // Just under the limits is served as usual.
    let fine = gateway
        .get("/api/products")
        .bearer_auth(user_token(61))
        .header("x-padding", "a".repeat(12 * 1024))
        .send()
        .await
        .expect("request");
    assert_eq!(fine.status(), 200);
    assert_eq!(echo.hits(), 1);
}

#[tokio::test]
async fn beyond_max_in_flight_requests_are_shed_at_once_with_503() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        max_in_flight: 1,
        ..settings(&echo.url)
    })
    .await;
    let token = user_token(62);
    let slow = gateway.get("/api/products/slow").bearer_auth(&token).send();
    let slow = tokio::spawn(slow);
    eventually(
        "the slow request at the backend",
        Duration::from_secs(5),
        || async { (echo.hits() == 1).then_some(()) },
    )
    .await;
    let shed = gateway
        .get("/api/products")
        .bearer_auth(&token)
        .send()
        .await
        .expect("request");
    assert_eq!(shed.status(), 503);
    assert_eq!(shed.headers()["retry-after"], "1");
    let body: Value = shed.json().await.expect("json");
    assert_eq!(body["code"], "unavailable");
    assert_eq!(echo.hits(), 1, "a shed request never reaches a backend");
    let slow = slow.await.expect("join").expect("slow request");
    assert_eq!(slow.status(), 200);
}

#[tokio::test]
async fn a_request_past_its_deadline_gets_504() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        request_timeout: Duration::from_millis(200),
        ..settings(&echo.url)
    })
    .await;
    let response = gateway
        .get("/api/products/slow")
        .bearer_auth(user_token(63))
        .send()
        .await
        .expect("request");
    assert_error(response, 504, "gateway_timeout").await;
}
