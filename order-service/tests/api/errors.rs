//! How a failed query is answered: a database that cannot be reached is `503 unavailable`
//! with `Retry-After` (a retry may succeed); a query Postgres rejects is `500 internal`
//! without it (a retry would meet the same bug). Neither shows its cause.

use std::time::Duration;

use reqwest::header::RETRY_AFTER;
use serde_json::Value;

use seckill_testkit::{OwnPostgres, SendAs, TestNamespace};

use crate::helpers::{TestApp, spawn_app, spawn_app_with};

/// The caller's order list: status, `Retry-After` and body.
async fn list_orders(app: &TestApp, user_id: i64) -> (u16, Option<String>, Value) {
    let response = reqwest::Client::new()
        .get(format!("{}/api/orders", app.address))
        .timeout(Duration::from_secs(30))
        .send_as("order-service", user_id, &[])
        .await
        .expect("list orders");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .map(|v| v.to_str().expect("ascii").to_string());
    let body = response.json().await.expect("json");
    (status, retry_after, body)
}

#[tokio::test]
async fn a_query_postgres_rejects_answers_500_internal_without_retry_after() {
    let app = spawn_app().await;
    assert_eq!(list_orders(&app, 1).await.0, 200);

    // The schema no longer matches the service's queries: a bug, not an outage.
    sqlx::query("ALTER TABLE orders RENAME COLUMN cancel_reason TO cancel_reason_renamed")
        .execute(&app.db)
        .await
        .expect("rename a column");
    let (status, retry_after, body) = list_orders(&app, 1).await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["code"], "internal", "{body}");
    assert_eq!(retry_after, None);
    let text = body.to_string();
    assert!(!text.contains("cancel_reason"), "the cause leaked: {text}");
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_database_answers_503_unavailable_with_retry_after() {
    let postgres = OwnPostgres::start().await;
    let mut ns = TestNamespace::new();
    ns.database_url = postgres.url(&format!("seckill_{}", ns.namespace));
    let app = spawn_app_with(ns, |_| {}).await;
    assert_eq!(list_orders(&app, 1).await.0, 200);

    postgres.stop().await;
    let (status, retry_after, body) = list_orders(&app, 1).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["code"], "unavailable", "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));

    postgres.restart().await;
    seckill_testkit::eventually("answers again", Duration::from_secs(30), || async {
        (list_orders(&app, 1).await.0 == 200).then_some(())
    })
    .await;
    app.shutdown().await;
}
