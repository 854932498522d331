//! A second purchase by a buyer whose marker Redis lost (a failover to a replica that
//! lagged, a wipe of the markers): Redis accepts it under a new request id, and order-service
//! must end it as an explicit failure with its unit back, the buyer's first order standing.

use std::time::Duration;

use serde_json::Value;

use seckill_testkit::{SendAs, eventually};

use crate::helpers::{TestApp, assert_error, spawn_app};

/// order-service in the app's namespace; cancel the token to stop it.
async fn spawn_orders(
    app: &TestApp,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
) {
    let orders = order_service::Application::build(order_service::Settings {
        backend: app.ns.backend_settings(),
        port: 0,
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    let stop = orders.shutdown_token();
    (stop, tokio::spawn(orders.run_until_stopped()))
}

async fn stock_report(app: &TestApp, product: i64) -> Value {
    app.client
        .get(format!("{}/admin/products/{product}/stock", app.address))
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("stock report")
        .json()
        .await
        .expect("json")
}

/// Polls `check` every 50 ms until it returns `Some`, or `None` once `timeout` passed.
async fn until<T, F, Fut>(timeout: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A purchase that must be accepted; its request id.
async fn accepted(app: &TestApp, product: i64, user: i64) -> String {
    let response = app.purchase(product, user).await;
    assert_eq!(response.status(), 202, "user {user}");
    let body: Value = response.json().await.expect("json");
    body["request_id"].as_str().expect("request id").to_string()
}

#[tokio::test]
async fn a_second_purchase_after_a_lost_marker_fails_with_its_unit_back_and_the_first_stands() {
    let app = spawn_app().await;
    let (stop_orders, orders) = spawn_orders(&app).await;
    // Two buckets of one unit each: the second purchase finds its home bucket dry and takes
    // the other bucket's unit, which must go back there.
    let buckets = 2u16;
    let product = app.create_product_in_buckets(2, buckets as i16).await;
    app.wait_ready().await;
    let buyer = 7;
    let first = accepted(&app, product, buyer).await;
    let first_order = eventually("the first order", Duration::from_secs(30), || async {
        let result = app.result(product, buyer).await;
        (result["status"] == "success").then(|| result["order_id"].as_i64())?
    })
    .await;

    // Redis loses the buyer's marker, as a replica that lagged behind would not have it.
    let mut redis = app.ns.redis().await;
    for bucket in 0..buckets {
        let _: i64 = redis::cmd("HDEL")
            .arg(app.ns.keys().buyers(product, bucket))
            .arg(buyer)
            .query_async(&mut redis)
            .await
            .expect("hdel");
    }
    let second = accepted(&app, product, buyer).await;
    assert_ne!(first, second);

    // Quiet: the second purchase has ended (an order in its name, live or cancelled: the
    // fault matrix's reading of invariant 3), nothing is queued for a buyer or waits in the
    // outbox, and no unit is still owed back. Judged from outside; if it never comes, the
    // books below say why.
    let db = app.ns.db().await;
    let quiet = until(Duration::from_secs(60), || async {
        let report = stock_report(&app, product).await;
        let (ended, owed): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM orders WHERE request_id::text = $2), \
                    (SELECT count(*) FROM compensations \
                     WHERE product_id = $1 AND done_at IS NULL)",
        )
        .bind(product)
        .bind(&second)
        .fetch_one(&db)
        .await
        .ok()?;
        (ended == 1 && report["in_flight"] == 0 && report["outbox"] == 0 && owed == 0).then_some(())
    })
    .await;
    let report = stock_report(&app, product).await;
    assert_eq!(report["drift"], 0, "{report}");
    assert!(quiet.is_some(), "the second purchase never ended: {report}");
    let live: Vec<String> = sqlx::query_scalar(
        "SELECT request_id::text FROM orders \
         WHERE product_id = $1 AND user_id = $2 AND status <> 'cancelled'",
    )
    .bind(product)
    .bind(buyer)
    .fetch_all(&db)
    .await
    .expect("live orders");
    assert_eq!(live, vec![first.clone()]);
    // The second purchase ended as an explicit failure: a cancelled order in its name.
    let ended: Option<String> =
        sqlx::query_scalar("SELECT status FROM orders WHERE request_id::text = $1")
            .bind(&second)
            .fetch_optional(&db)
            .await
            .expect("second purchase");
    assert_eq!(ended.as_deref(), Some("cancelled"));
    db.close().await;

    // The buyer still sees the first order, and Redis knows they hold it again.
    let result = app.result(product, buyer).await;
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["order_id"], first_order, "{result}");
    assert_error(app.purchase(product, buyer).await, 409, "already_purchased").await;
    // The unit is on sale again.
    accepted(&app, product, 8).await;

    stop_orders.cancel();
    let _ = orders.await;
    app.shutdown().await;
}
