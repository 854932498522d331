//! The reverse proxy's behaviour towards replicas: failover and ejection, timeouts, the
//! headers a backend receives.

use std::time::Duration;

use serde_json::Value;

use crate::echo::{closed_port_url, seen_headers, settings, spawn_echo, spawn_gateway};
use crate::helpers::{assert_error, user_token};

#[tokio::test]
async fn a_replica_that_refuses_connections_is_ejected_and_every_request_succeeds() {
    let echo = spawn_echo().await;
    let dead = closed_port_url().await;
    let gateway = spawn_gateway(gateway::Settings {
        seckill_api_urls: vec![dead.clone(), echo.url.clone()],
        upstream_eject: Duration::from_secs(60),
        ..settings(&echo.url)
    })
    .await;
    let token = user_token(51);
    for _ in 0..10 {
        let response = gateway
            .get("/api/products")
            .bearer_auth(&token)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
    }
    assert_eq!(echo.hits(), 10);
    // Tried once, ejected once, then skipped for the rest of the minute.
    let ejections = gateway
        .metric(
            "gateway_upstream_ejections_total",
            &[("upstream", "seckill-api"), ("replica", &dead)],
        )
        .await;
    assert_eq!(ejections, 1.0);
}

#[tokio::test]
async fn with_every_replica_down_the_answer_is_a_json_503_with_retry_after() {
    let echo = spawn_echo().await;
    let dead = closed_port_url().await;
    let gateway = spawn_gateway(gateway::Settings {
        order_service_urls: vec![dead],
        ..settings(&echo.url)
    })
    .await;
    let response = gateway
        .get("/api/orders")
        .bearer_auth(user_token(52))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "unavailable");
}

#[tokio::test]
async fn a_replica_slower_than_the_upstream_timeout_gets_a_json_504() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        upstream_request_timeout: Duration::from_millis(200),
        ..settings(&echo.url)
    })
    .await;
    // Twice on one kept-alive connection: the connection's upstream timer fires, and is
    // set again for the next request. (Metrics are the process's: counted from here.)
    let upstream_timeouts =
        || gateway.metric("gateway_upstream_errors_total", &[("kind", "timeout")]);
    let before = upstream_timeouts().await;
    for round in 1..=2 {
        let response = gateway
            .get("/api/products/slow")
            .bearer_auth(user_token(53))
            .send()
            .await
            .expect("request");
        assert_error(response, 504, "gateway_timeout").await;
        assert_eq!(
            upstream_timeouts().await - before,
            f64::from(round),
            "the replica's deadline, not the request's"
        );
    }
    let fast = gateway
        .get("/api/products/1")
        .bearer_auth(user_token(53))
        .send()
        .await
        .expect("request");
    assert_eq!(fast.status(), 200);
}

#[tokio::test]
async fn the_backend_sees_a_trace_context_and_the_forwarding_headers() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;
    let token = user_token(54);

    // None sent: the gateway starts a trace.
    let response = gateway
        .get("/api/orders")
        .bearer_auth(&token)
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .expect("request");
    let seen = seen_headers(response).await;
    let traceparent = &seen["traceparent"];
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    assert!(parts[1].len() == 32 && parts[1].bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(parts[2].len() == 16 && parts[2].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(parts[3], "01");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1");
    // The client is not a trusted proxy: it cannot claim https.
    assert_eq!(seen["x-forwarded-proto"], "http");

    // One sent: the trace continues (same trace id and flags) with the gateway's span as
    // the backend's parent.
    let theirs = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let response = gateway
        .get("/api/orders")
        .bearer_auth(&token)
        .header("traceparent", theirs)
        .send()
        .await
        .expect("request");
    let forwarded = seen_headers(response).await["traceparent"].clone();
    let parts: Vec<&str> = forwarded.split('-').collect();
    assert_eq!(parts.len(), 4, "{forwarded}");
    assert_eq!(parts[1], "4bf92f3577b34da6a3ce929d0e0e4736", "{forwarded}");
    assert_ne!(
        parts[2], "00f067aa0ba902b7",
        "the gateway's own span: {forwarded}"
    );
    assert_eq!(parts[3], "01");
}
