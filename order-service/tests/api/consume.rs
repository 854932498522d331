//! From message to order: idempotency, dead letters, results, the buyer's order routes.

use std::time::Duration;

use futures_util::future::join_all;
use serde_json::Value;

use seckill_testkit::eventually;

use crate::helpers::spawn_app;

#[tokio::test]
async fn a_published_purchase_becomes_one_order_and_the_result_shows_success() {
    let app = spawn_app().await;
    let product = app.product(10).await;
    let msg = app.message(product, 42);
    app.publish(&msg).await;

    let stored = eventually("result written", Duration::from_secs(20), || async {
        app.stored_result(product, 42)
            .await
            .filter(|r| r.starts_with("success:"))
    })
    .await;
    let order_id: i64 = stored["success:".len()..].parse().expect("order id");
    assert_eq!(app.order_count(product).await, 1);
    assert_eq!(app.stock_remaining(product).await, 9);

    // The buyer sees it; another user does not.
    let mine = app.get_as(42, &format!("/api/orders/{order_id}")).await;
    assert_eq!(mine.status(), 200);
    let mine: Value = mine.json().await.expect("json");
    assert_eq!(mine["request_id"], msg.request_id.to_string());
    assert_eq!(mine["status"], "created");
    let theirs = app.get_as(43, &format!("/api/orders/{order_id}")).await;
    assert_eq!(theirs.status(), 404);
    let list: Value = app
        .get_as(42, "/api/orders")
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    app.shutdown().await;
}

#[tokio::test]
async fn duplicate_deliveries_of_one_purchase_create_exactly_one_order() {
    let mut app = spawn_app().await;
    let product = app.product(10).await;
    let msg = app.message(product, 7);
    join_all((0..20).map(|_| app.publish(&msg))).await;

    eventually("result written", Duration::from_secs(20), || async {
        app.stored_result(product, 7)
            .await
            .filter(|r| r.starts_with("success:"))
    })
    .await;
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 1);
    assert_eq!(
        app.stock_remaining(product).await,
        9,
        "stock decremented once"
    );
    assert_eq!(app.dead_letters().await, 0);
    app.shutdown().await;
}

/// Each order of `product`: request id, status, cancel reason; oldest first.
async fn order_rows(
    app: &crate::helpers::TestApp,
    product: i64,
) -> Vec<(String, String, Option<String>)> {
    sqlx::query_as(
        "SELECT request_id::text, status, cancel_reason FROM orders \
         WHERE product_id = $1 ORDER BY id",
    )
    .bind(product)
    .fetch_all(&app.db)
    .await
    .expect("orders")
}

/// A second purchase of one buyer under a new request id (Redis had lost their marker): it
/// is given up — a cancelled order in its name, its unit owed back through a compensation —
/// and the first order stands; copies of either purchase arriving later change nothing.
#[tokio::test]
async fn a_second_purchase_by_the_same_user_is_given_up_and_its_unit_owed_back() {
    // A linger long enough for both purchases to share a batch, so the batch path meets the
    // conflict (whichever path decides, the outcome must be the same).
    let mut app = crate::helpers::spawn_app_with(seckill_testkit::TestNamespace::new(), |s| {
        s.batch_linger = Duration::from_millis(200);
    })
    .await;
    let product = app.product(10).await;
    let purchases = [app.message(product, 9), app.message(product, 9)];
    app.publish_many(&purchases).await;
    eventually(
        "both purchases decided",
        Duration::from_secs(30),
        || async { (order_rows(&app, product).await.len() == 2).then_some(()) },
    )
    .await;
    // Copies of both (a redelivery, the relay publishing an entry its handler had published).
    app.publish_many(&purchases).await;
    app.stop_when_drained().await;

    let rows = order_rows(&app, product).await;
    let live: Vec<_> = rows.iter().filter(|r| r.1 != "cancelled").collect();
    assert_eq!(live.len(), 1, "{rows:?}");
    let loser = rows
        .iter()
        .find(|r| r.1 == "cancelled")
        .expect("a given-up purchase");
    assert_eq!(loser.2.as_deref(), Some("already_purchased"), "{rows:?}");
    assert_eq!(app.stock_remaining(product).await, 9, "one unit sold");
    let owed: Vec<(String, String, bool)> =
        sqlx::query_as("SELECT event_id, reason, restock FROM compensations WHERE product_id = $1")
            .bind(product)
            .fetch_all(&app.db)
            .await
            .expect("compensations");
    assert_eq!(
        owed,
        vec![(loser.0.clone(), "already_purchased".to_string(), true)]
    );
    assert_eq!(app.dead_letters().await, 0);
    app.shutdown().await;
}

#[tokio::test]
async fn an_unparseable_message_is_dead_lettered_without_an_order() {
    let app = spawn_app().await;
    let product = app.product(10).await;
    app.publish_raw(b"{\"not\": \"an order\"", "garbage").await;
    let parked = app.wait_parked(1).await;
    assert_eq!(
        parked[0].0, "garbage",
        "the message id names a body that did not parse"
    );
    assert_eq!(parked[0].1, "unparseable");
    assert_eq!(parked[0].2, "pending");
    assert_eq!(app.order_count(product).await, 0);
    app.shutdown().await;
}

#[tokio::test]
async fn a_purchase_of_an_unknown_product_is_dead_lettered_and_reported_failed() {
    let app = spawn_app().await;
    let msg = app.message(987_654, 5);
    app.publish(&msg).await;
    let parked = app.wait_parked(1).await;
    assert_eq!(parked[0].0, msg.request_id.to_string());
    assert_eq!(parked[0].1, "unknown_product");
    assert_eq!(
        app.stored_result(987_654, 5).await.as_deref(),
        Some("failed:unknown_product")
    );
    app.shutdown().await;
}

#[tokio::test]
async fn the_database_refuses_to_oversell_even_if_more_purchases_arrive_than_stock() {
    let mut app = spawn_app().await;
    let product = app.product(3).await;
    for user in 1..=5 {
        app.publish(&app.message(product, user)).await;
    }
    let parked = app.wait_parked(2).await;
    assert!(parked.iter().all(|p| p.1 == "out_of_stock"), "{parked:?}");
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 3);
    assert_eq!(app.stock_remaining(product).await, 0);
    app.shutdown().await;
}

/// The price of each order of `product`.
async fn order_prices(app: &crate::helpers::TestApp, product: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT price_cents FROM orders WHERE product_id = $1")
        .bind(product)
        .fetch_all(&app.db)
        .await
        .expect("prices")
}

#[tokio::test]
async fn an_order_costs_the_products_price_whatever_price_its_message_carries() {
    let mut app = crate::helpers::spawn_app_with(seckill_testkit::TestNamespace::new(), |s| {
        s.batch_linger = Duration::from_millis(200);
    })
    .await;
    let product = app.product(10).await; // priced 500
    let msgs: Vec<_> = (1..=4)
        .map(|user| {
            let mut msg = app.message(product, user);
            msg.price_cents = 1;
            msg
        })
        .collect();
    app.publish_many(&msgs).await;
    app.stop_when_drained().await;
    assert_eq!(order_prices(&app, product).await, vec![500; 4]);
    app.shutdown().await;
}

#[tokio::test]
async fn an_order_written_alone_after_its_batch_failed_costs_the_products_price_too() {
    // A purchase of an unknown product in the batch sends every message of it down the
    // one-by-one path.
    let mut app = crate::helpers::spawn_app_with(seckill_testkit::TestNamespace::new(), |s| {
        s.batch_linger = Duration::from_millis(200);
    })
    .await;
    let product = app.product(10).await;
    let mut cheap = app.message(product, 1);
    cheap.price_cents = 1;
    let mut unknown = app.message(987_655, 2);
    unknown.price_cents = 1;
    app.publish_many(&[cheap, unknown]).await;
    let parked = app.wait_parked(1).await;
    assert_eq!(parked[0].1, "unknown_product");
    app.stop_when_drained().await;
    assert_eq!(order_prices(&app, product).await, vec![500]);
    app.shutdown().await;
}
