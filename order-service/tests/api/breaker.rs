//! The circuit breaker: an operator's forced mode pauses every replica's consumer, and
//! messages wait in the queue, neither acked nor dead-lettered.

use std::time::Duration;

use serde_json::{Value, json};

use seckill_testkit::{SendAs, TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};

fn quick_mode_poll(settings: &mut order_service::Settings) {
    settings.breaker_mode_poll = Duration::from_millis(100);
}

async fn breaker(app: &TestApp) -> Value {
    reqwest::Client::new()
        .get(format!("{}/admin/orders/breaker", app.address))
        .send_as("order-service", 1, &["admin"])
        .await
        .expect("get breaker")
        .json()
        .await
        .expect("json")
}

#[tokio::test]
async fn forced_open_from_the_cli_pauses_the_consumer_and_auto_resumes_it() {
    let mut app = spawn_app_with(TestNamespace::new(), quick_mode_poll).await;
    let product = app.product(100).await;

    // The CLI writes the mode to Redis; the running replica follows it.
    let ns = &app.ns;
    let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"))
        .args(["breaker", "open"])
        .env("SECKILL_REDIS_URL", &ns.redis_url)
        .env("SECKILL_REDIS_CLUSTER", ns.redis_cluster.to_string())
        .env("SECKILL_NAMESPACE", &ns.namespace)
        .output()
        .await
        .expect("run the CLI");
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    eventually("replica forced open", Duration::from_secs(5), || async {
        (breaker(&app).await["state"] == "forced_open").then_some(())
    })
    .await;

    let msgs: Vec<_> = (1..=40).map(|user| app.message(product, user)).collect();
    app.publish_many(&msgs).await;
    // Paused: for a while, every message waits in the queue (none acked, none dead).
    let queue = app.ns.topology().queue;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(app.ns.queue_depth(&app.channel, &queue).await, 40);
        assert_eq!(app.order_count(product).await, 0);
    }
    assert_eq!(app.dead_letters().await, 0);

    // Back to automatic through the admin API: the consumer resumes and drains.
    let set = reqwest::Client::new()
        .put(format!("{}/admin/orders/breaker", app.address))
        .json(&json!({"mode": "auto"}))
        .send_as("order-service", 1, &["admin"])
        .await
        .expect("put breaker");
    assert_eq!(set.status(), 200);
    let body: Value = set.json().await.expect("json");
    assert_eq!(body["state"], "closed");
    eventually("orders written", Duration::from_secs(10), || async {
        (app.order_count(product).await == 40).then_some(())
    })
    .await;
    app.stop_when_drained().await;
    app.shutdown().await;
}

#[tokio::test]
async fn the_breaker_admin_api_needs_an_admin_and_a_valid_mode() {
    let app = spawn_app_with(TestNamespace::new(), quick_mode_poll).await;
    let client = reqwest::Client::new();
    let url = format!("{}/admin/orders/breaker", app.address);
    let as_user = client
        .put(&url)
        .json(&json!({"mode": "open"}))
        .send_as("order-service", 5, &[])
        .await
        .expect("put");
    assert_eq!(as_user.status(), 403);
    for bad in [
        json!({"mode": "sideways"}),
        json!({}),
        json!({"mode": "open", "x": 1}),
    ] {
        let response = client
            .put(&url)
            .json(&bad)
            .send_as("order-service", 1, &["admin"])
            .await
            .expect("put");
        assert_eq!(response.status(), 400, "{bad}");
    }
    assert_eq!(
        breaker(&app).await,
        json!({"state": "closed", "mode": "auto"})
    );
    app.shutdown().await;
}
