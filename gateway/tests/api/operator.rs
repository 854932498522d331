//! The operator surface is off the public port: `/metrics` and the detailed `/readyz` are
//! served on the operator listener (loopback by default), and the public `/healthz` says
//! only that the process answers.

use serde_json::{Value, json};

use crate::echo::{settings, spawn_echo, spawn_gateway};

#[tokio::test]
async fn the_public_port_answers_metrics_and_readyz_with_a_json_404() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;
    for path in ["/metrics", "/readyz"] {
        let response = gateway.get(path).send().await.expect("request");
        assert_eq!(response.status(), 404, "{path}");
        let body: Value = response.json().await.expect("json error");
        assert_eq!(body["code"], "not_found", "{path}");
    }
    assert_eq!(echo.hits(), 0, "nothing was forwarded");
}

#[tokio::test]
async fn the_public_healthz_says_only_that_the_process_answers() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;
    let response = gateway.get("/healthz").send().await.expect("request");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body, json!({ "status": "ok" }));
}

#[tokio::test]
async fn the_operator_listener_serves_metrics_and_the_detailed_readiness() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;
    let _ = gateway.get("/api/products").send().await.expect("request");
    let metrics = gateway
        .client
        .get(format!("{}/metrics", gateway.admin))
        .send()
        .await
        .expect("metrics");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.expect("text");
    assert!(text.contains("http_requests_total"), "{text}");
    let ready: Value = gateway
        .client
        .get(format!("{}/readyz", gateway.admin))
        .send()
        .await
        .expect("readyz")
        .json()
        .await
        .expect("json");
    assert_eq!(ready["service"], "gateway", "{ready}");
    assert_eq!(ready["ready"], true, "{ready}");
    assert_eq!(ready["checks"]["seckill-api"], "ok", "{ready}");
    assert_eq!(ready["checks"]["order-service"], "ok", "{ready}");
}

#[tokio::test]
async fn why_a_token_failed_is_counted_on_the_operator_listener_only() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;
    let refused = gateway
        .post("/api/seckill/1")
        .bearer_auth("not.a.token")
        .send()
        .await
        .expect("request");
    assert_eq!(refused.status(), 401);
    let public = gateway
        .get("/metrics")
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("text");
    assert!(!public.contains("gateway_auth_failures_total"), "{public}");
    assert!(gateway.metric("gateway_auth_failures_total", &[]).await >= 1.0);
}

#[tokio::test]
async fn the_operator_listener_binds_loopback_by_default() {
    let defaults = gateway::Settings::default();
    assert_eq!(defaults.admin_host, "127.0.0.1");
    assert_ne!(defaults.admin_port, defaults.port);
    let echo = spawn_echo().await;
    // The public port on every interface, the operator one left at its default host.
    let app = gateway::Application::build(gateway::Settings {
        host: "0.0.0.0".into(),
        ..settings(&echo.url)
    })
    .await
    .expect("build gateway");
    assert!(app.admin_addr().ip().is_loopback(), "{}", app.admin_addr());
    // From another address of this host, when it has one, nothing answers on that port.
    if let Some(ip) = outward_ip() {
        let elsewhere = std::net::SocketAddr::new(ip, app.admin_port());
        assert!(
            tokio::net::TcpStream::connect(elsewhere).await.is_err(),
            "the operator port answered on {elsewhere}"
        );
        let public = std::net::SocketAddr::new(ip, app.port());
        assert!(
            tokio::net::TcpStream::connect(public).await.is_ok(),
            "the public port is on every interface"
        );
    }
}

/// A non-loopback address of this host (the one a route to the outside would use), if any;
/// a UDP "connect" sends nothing.
fn outward_ip() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}
