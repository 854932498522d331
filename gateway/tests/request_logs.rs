//! The gateway's log lines about a request carry the request's fields — its id, method,
//! path, caller and trace — as inside the request's span, whether the request is traced by
//! a span (exported) or, as here with no exporter, by a request scope. Its own test binary:
//! it installs the global subscriber, with the JSON lines the services write.

/// The log writer the telemetry crate's own tests read back.
#[path = "../../crates/telemetry/tests/common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "api/echo.rs"]
mod echo;

use std::time::Duration;

use seckill_auth::mint_token;
use seckill_testkit::{JWT_SECRET, eventually};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use common::Captured;
use echo::{closed_port_url, settings, spawn_gateway};

/// The line whose message is `message`, once `captured` holds it, parsed.
async fn logged(captured: &Captured, message: &str) -> serde_json::Value {
    eventually(message, Duration::from_secs(10), || async {
        captured
            .text()
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).expect("JSON"))
            .find(|line| line["message"] == message)
    })
    .await
}

#[tokio::test]
async fn a_line_about_a_request_carries_its_id_caller_and_trace() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::registry()
        .with(tracing_subscriber::EnvFilter::new("info"))
        .with(seckill_telemetry::TraceIdLayer)
        .with(seckill_telemetry::json_layer(move || writer.clone()))
        .init();
    assert!(
        !seckill_telemetry::exporting(),
        "no exporter: no request spans"
    );
    // Both services behind a closed port: a forwarded request is refused upstream.
    let gateway = spawn_gateway(settings(&closed_port_url().await)).await;

    // Refused before the caller is known: the request's own fields and a new trace.
    let status = gateway
        .get("/api/products")
        .header("x-request-id", "req-anonymous")
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status, 401);
    let line = logged(&captured, "request refused: no valid bearer token").await;
    let trace_id = line["trace_id"].as_str().expect("a trace id");
    assert_eq!(trace_id.len(), 32, "{line}");
    let span = &line["span"];
    assert_eq!(span["request_id"], "req-anonymous", "{line}");
    assert_eq!(span["method"], "GET");
    assert_eq!(span["path"], "/api/products");
    assert_eq!(span["service"], "gateway");
    assert_eq!(span["trace_id"], trace_id);
    assert_eq!(span["name"], "http");
    assert_eq!(line["spans"][0], *span);
    assert!(span.get("user_id").is_none(), "{line}");

    // Refused upstream after the caller was verified: the caller recorded, the client's
    // trace continued.
    let token = mint_token(JWT_SECRET, 77, &[], 600);
    let status = gateway
        .get("/api/products/5")
        .bearer_auth(token)
        .header("x-request-id", "req-upstream")
        .header(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .send()
        .await
        .expect("request")
        .status();
    assert_eq!(status, 503, "no replica took it");
    let line = logged(&captured, "upstream refused connection").await;
    assert_eq!(
        line["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{line}"
    );
    assert_eq!(line["level"], "WARN");
    let span = &line["span"];
    assert_eq!(span["request_id"], "req-upstream", "{line}");
    assert_eq!(span["user_id"], 77, "{line}");
    assert_eq!(span["path"], "/api/products/5");
}
