//! Paying and cancelling orders, and the payment window that cancels unpaid ones.

use std::time::Duration;

use serde_json::Value;

use seckill_testkit::{SendAs, TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};

async fn post_as(app: &TestApp, user_id: i64, path: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}{path}", app.address))
        .send_as("order-service", user_id, &[])
        .await
        .expect("request")
}

async fn order_of(app: &TestApp, product: i64, user: i64) -> i64 {
    eventually("the order", Duration::from_secs(20), || async {
        sqlx::query_scalar("SELECT id FROM orders WHERE product_id = $1 AND user_id = $2")
            .bind(product)
            .bind(user)
            .fetch_optional(&app.db)
            .await
            .expect("order")
    })
    .await
}

async fn assert_error(response: reqwest::Response, status: u16, code: &str) {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], code, "{body}");
}

#[tokio::test]
async fn a_buyer_pays_or_cancels_only_their_own_unpaid_order() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.compensation_poll = Duration::from_millis(50);
    })
    .await;
    let product = app.product(5).await;
    app.publish(&app.message(product, 1)).await;
    app.publish(&app.message(product, 2)).await;
    let paid = order_of(&app, product, 1).await;
    let cancelled = order_of(&app, product, 2).await;

    // Someone else's order is not found; a malformed id is a 400.
    assert_error(
        post_as(&app, 2, &format!("/api/orders/{paid}/pay")).await,
        404,
        "order_not_found",
    )
    .await;
    assert_error(
        post_as(&app, 1, "/api/orders/abc/pay").await,
        400,
        "invalid_request",
    )
    .await;

    let response = post_as(&app, 1, &format!("/api/orders/{paid}/pay")).await;
    assert_eq!(response.status(), 200);
    let order: Value = response.json().await.expect("json");
    assert_eq!(order["status"], "paid");
    assert!(order["paid_at"].is_string());
    assert!(order["pay_by"].is_string(), "orders get a payment deadline");
    // Paying twice is answered as it is; a paid order cannot be cancelled.
    assert_eq!(
        post_as(&app, 1, &format!("/api/orders/{paid}/pay"))
            .await
            .status(),
        200
    );
    assert_error(
        post_as(&app, 1, &format!("/api/orders/{paid}/cancel")).await,
        409,
        "order_paid",
    )
    .await;

    let response = post_as(&app, 2, &format!("/api/orders/{cancelled}/cancel")).await;
    assert_eq!(response.status(), 200);
    let order: Value = response.json().await.expect("json");
    assert_eq!(order["status"], "cancelled");
    assert_eq!(order["cancel_reason"], "cancelled");
    assert_eq!(
        post_as(&app, 2, &format!("/api/orders/{cancelled}/cancel"))
            .await
            .status(),
        200
    );
    assert_error(
        post_as(&app, 2, &format!("/api/orders/{cancelled}/pay")).await,
        409,
        "order_cancelled",
    )
    .await;

    // The cancelled unit is back in the database's stock, and its buyer's result says so.
    assert_eq!(app.stock_remaining(product).await, 4);
    eventually("the buyer's result", Duration::from_secs(10), || async {
        (app.stored_result(product, 2).await.as_deref() == Some("failed:cancelled")).then_some(())
    })
    .await;
    app.stop_when_drained().await;
    app.shutdown().await;
}

#[tokio::test]
async fn an_unpaid_order_is_cancelled_after_the_payment_window() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.payment_window = Duration::from_secs(1);
        s.compensation_poll = Duration::from_millis(50);
    })
    .await;
    let product = app.product(2).await;
    app.publish(&app.message(product, 1)).await;
    app.publish(&app.message(product, 2)).await;
    let unpaid = order_of(&app, product, 1).await;
    let paid = order_of(&app, product, 2).await;
    assert_eq!(
        post_as(&app, 2, &format!("/api/orders/{paid}/pay"))
            .await
            .status(),
        200
    );
    assert_eq!(app.stock_remaining(product).await, 0);

    let status = |id: i64| {
        let db = app.db.clone();
        async move {
            sqlx::query_as::<_, (String, Option<String>)>(
                "SELECT status, cancel_reason FROM orders WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&db)
            .await
            .expect("status")
        }
    };
    eventually(
        "the unpaid order expires",
        Duration::from_secs(10),
        || async { (status(unpaid).await.0 == "cancelled").then_some(()) },
    )
    .await;
    assert_eq!(status(unpaid).await.1.as_deref(), Some("payment_expired"));
    assert_eq!(status(paid).await.0, "paid", "a paid order never expires");
    assert_eq!(app.stock_remaining(product).await, 1);
    eventually("the buyer's result", Duration::from_secs(10), || async {
        (app.stored_result(product, 1).await.as_deref() == Some("failed:payment_expired"))
            .then_some(())
    })
    .await;
    assert_error(
        post_as(&app, 1, &format!("/api/orders/{unpaid}/pay")).await,
        409,
        "order_cancelled",
    )
    .await;
    // Exactly one compensation, done. The relay writes the buyer's result before it commits
    // `done_at`, so the result showing up does not mean the row is marked yet: poll for it.
    let compensations = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), count(done_at) FROM compensations WHERE product_id = $1",
        )
        .bind(product)
        .fetch_one(&app.db)
        .await
        .expect("compensations")
    };
    eventually(
        "the compensation is marked done",
        Duration::from_secs(10),
        || async { (compensations().await.1 > 0).then_some(()) },
    )
    .await;
    assert_eq!(compensations().await, (1, 1));
    app.stop_when_drained().await;
    app.shutdown().await;
}
