//! Product administration and reads.

use chrono::{Duration as ChronoDuration, Utc};
use serde_json::{Value, json};

use seckill_testkit::SendAs;

use crate::helpers::{assert_error, spawn_app};

#[tokio::test]
async fn creating_a_product_needs_the_admin_role() {
    let app = spawn_app().await;
    let now = Utc::now();
    let body = json!({
        "name": "phone", "price_cents": 100, "stock": 3,
        "start_at": now, "end_at": now + ChronoDuration::hours(1),
    });
    let url = format!("{}/admin/products", app.address);

    let as_user = app
        .client
        .post(&url)
        .json(&body)
        .send_as("seckill-api", 5, &[])
        .await
        .expect("request");
    assert_error(as_user, 403, "forbidden").await;
    let anonymous = app
        .client
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_error(anonymous, 401, "unauthorized").await;
    app.shutdown().await;
}

#[tokio::test]
async fn creating_a_product_rejects_bad_input_with_400() {
    let app = spawn_app().await;
    let now = Utc::now();
    let url = format!("{}/admin/products", app.address);
    let cases = [
        json!({"name": "x", "price_cents": 1, "stock": 1, "start_at": now, "end_at": now}),
        json!({"name": "", "price_cents": 1, "stock": 1, "start_at": now,
               "end_at": now + ChronoDuration::hours(1)}),
        json!({"name": "x", "price_cents": -1, "stock": 1, "start_at": now,
               "end_at": now + ChronoDuration::hours(1)}),
        json!({"name": "x", "price_cents": 1, "stock": -5, "start_at": now,
               "end_at": now + ChronoDuration::hours(1)}),
        json!({"name": "x", "price_cents": 1, "stock": 1, "start_at": "yesterday",
               "end_at": now}),
        json!({"price_cents": 1}),
    ];
    for case in cases {
        let response = app
            .client
            .post(&url)
            .json(&case)
            .send_as("seckill-api", 1, &["admin"])
            .await
            .expect("request");
        assert_error(response, 400, "invalid_request").await;
    }
    let not_json = app
        .client
        .post(&url)
        .header("content-type", "application/json")
        .body("{not json")
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("request");
    assert_error(not_json, 400, "invalid_request").await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_created_product_is_readable_with_its_remaining_stock() {
    let app = spawn_app().await;
    let product = app.create_product(8).await;
    assert_eq!(app.purchase(product, 3).await.status(), 202);

    let response = app
        .client
        .get(format!("{}/api/products/{product}", app.address))
        .send_as("seckill-api", 3, &[])
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["id"], product);
    assert_eq!(body["stock_total"], 8);
    assert_eq!(body["remaining_approx"], 7);
    assert_eq!(body["active"], true);

    let missing = app
        .client
        .get(format!("{}/api/products/424242", app.address))
        .send_as("seckill-api", 3, &[])
        .await
        .expect("request");
    assert_error(missing, 404, "product_not_found").await;
    app.shutdown().await;
}

#[tokio::test]
async fn ops_endpoints_answer() {
    let app = spawn_app().await;
    for path in ["/healthz", "/metrics"] {
        let response = app
            .client
            .get(format!("{}{path}", app.address))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "{path}");
    }
    // Ready once the relay holds a confirmed channel.
    seckill_testkit::eventually("ready", std::time::Duration::from_secs(10), || async {
        let response = app
            .client
            .get(format!("{}/readyz", app.address))
            .send()
            .await
            .ok()?;
        if response.status() != 200 {
            return None;
        }
        let report: serde_json::Value = response.json().await.ok()?;
        // The report says whose it is: a prober can tell this service from another.
        assert_eq!(report["service"], "seckill-api", "{report}");
        assert_eq!(report["ready"], true, "{report}");
        Some(())
    })
    .await;
    app.shutdown().await;
}

#[tokio::test]
async fn the_stock_report_accounts_for_every_unit() {
    let app = spawn_app().await;
    let product = app.create_product(6).await;
    let report = |app: &crate::helpers::TestApp| {
        let request = app
            .client
            .get(format!("{}/admin/products/{product}/stock", app.address));
        async move {
            let response = request
                .send_as("seckill-api", 1, &["admin"])
                .await
                .expect("request");
            assert_eq!(response.status(), 200);
            response.json::<Value>().await.expect("json")
        }
    };
    let before = report(&app).await;
    assert_eq!(before["loaded"], false);
    assert_eq!(before["redis_remaining"], 6);
    assert_eq!(before["drift"], 0);

    for user in [1, 2] {
        assert_eq!(app.purchase(product, user).await.status(), 202);
    }
    // No order-service runs here: both purchases stay in flight.
    let after = report(&app).await;
    assert_eq!(after["loaded"], true);
    assert_eq!(after["redis_remaining"], 4);
    assert_eq!(after["in_flight"], 2);
    assert_eq!(after["orders"], 0);
    assert_eq!(after["drift"], 0);

    let as_user = app
        .client
        .get(format!("{}/admin/products/{product}/stock", app.address))
        .send_as("seckill-api", 5, &[])
        .await
        .expect("request");
    assert_error(as_user, 403, "forbidden").await;
    app.shutdown().await;
}
