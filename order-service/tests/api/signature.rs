//! Order messages are authenticated: only what seckill-api signed becomes an order, and an
//! unsigned or forged message is parked with its reason, never retried.

use serde_json::{Value, json};

use seckill_messaging::OrderSigner;
use seckill_testkit::{SendAs, TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app, spawn_app_with};

/// The price of each order of `product`.
async fn order_prices(app: &TestApp, product: i64) -> Vec<i64> {
    sqlx::query_scalar("SELECT price_cents FROM orders WHERE product_id = $1")
        .bind(product)
        .fetch_all(&app.db)
        .await
        .expect("prices")
}

/// Whether the service's `/metrics` counts a dead letter for `reason`.
async fn counted_dead_letter(app: &TestApp, reason: &str) -> bool {
    let text = app
        .get_as(1, "/metrics")
        .await
        .text()
        .await
        .expect("metrics");
    let series = format!("orders_dead_lettered_total{{reason=\"{reason}\"}}");
    text.lines()
        .any(|l| l.starts_with(&series) && !l.ends_with(" 0"))
}

/// Puts `product` on sale (it was unknown, so its purchases were parked) and redrives its
/// dead letters as an admin.
async fn redrive_once_on_sale(app: &TestApp, product: i64) -> reqwest::Response {
    let now = chrono::Utc::now();
    sqlx::query(
        "INSERT INTO products (id, name, price_cents, stock_total, stock_remaining, start_at, end_at) \
         VALUES ($1, 'late', 500, 5, 5, $2, $3)",
    )
    .bind(product)
    .bind(now - chrono::Duration::minutes(1))
    .bind(now + chrono::Duration::hours(1))
    .execute(&app.db)
    .await
    .expect("insert product");
    reqwest::Client::new()
        .post(format!("{}/admin/dlq/redrive", app.address))
        .json(&json!({ "product_id": product }))
        .send_as("order-service", 900, &["admin"])
        .await
        .expect("redrive")
}

#[tokio::test]
async fn an_unsigned_message_is_dead_lettered_as_unsigned_and_makes_no_order() {
    let mut app = spawn_app().await;
    let product = app.product(10).await;
    let msg = app.message(product, 1);
    app.publish_signed_as(&msg, None).await;
    let parked = app.wait_parked(1).await;
    assert_eq!(parked[0].0, msg.request_id.to_string());
    assert_eq!(parked[0].1, "unsigned");
    assert_eq!(
        parked[0].3, 1,
        "dead-lettered on its first delivery, no retry"
    );
    assert!(counted_dead_letter(&app, "unsigned").await);
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 0);
    assert_eq!(app.stock_remaining(product).await, 10);
    app.shutdown().await;
}

#[tokio::test]
async fn while_upgrading_an_unsigned_message_becomes_an_order_and_a_forged_one_is_still_parked() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| s.accept_unsigned = true).await;
    let product = app.product(10).await;
    // Published by a seckill-api from before signing.
    let old = app.message(product, 1);
    app.publish_signed_as(&old, None).await;
    let mut forged = app.message(product, 2);
    forged.price_cents = 0;
    let wrong = OrderSigner::new("not-the-key").sign(&serde_json::to_vec(&forged).expect("json"));
    app.publish_signed_as(&forged, Some(&wrong)).await;
    let parked = app.wait_parked(1).await;
    assert_eq!(parked[0].0, forged.request_id.to_string());
    assert_eq!(parked[0].1, "bad_signature");
    app.stop_when_drained().await;
    assert_eq!(
        app.order_count(product).await,
        1,
        "the unsigned purchase landed"
    );
    assert_eq!(app.stock_remaining(product).await, 9);
    app.shutdown().await;
}

#[tokio::test]
async fn a_forged_message_is_dead_lettered_as_bad_signature_and_makes_no_order() {
    let mut app = spawn_app().await;
    let product = app.product(10).await;
    // A genuine purchase by user 1, rewritten for user 2 at price 0 under its signature.
    let genuine = app.message(product, 1);
    let signature = app
        .signer
        .sign(&serde_json::to_vec(&genuine).expect("json"));
    let mut rewritten = genuine.clone();
    rewritten.user_id = 2;
    rewritten.price_cents = 0;
    app.publish_signed_as(&rewritten, Some(&signature)).await;
    // And one signed with a key that is not the service's.
    let mut other_key = app.message(product, 3);
    other_key.price_cents = 0;
    let wrong =
        OrderSigner::new("not-the-key").sign(&serde_json::to_vec(&other_key).expect("json"));
    app.publish_signed_as(&other_key, Some(&wrong)).await;
    // And a header that is no signature at all.
    let garbled = app.message(product, 4);
    app.publish_signed_as(&garbled, Some("v1:zz")).await;

    let parked = app.wait_parked(3).await;
    assert!(parked.iter().all(|p| p.1 == "bad_signature"), "{parked:?}");
    assert!(counted_dead_letter(&app, "bad_signature").await);
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 0);
    assert_eq!(app.stock_remaining(product).await, 10);
    app.shutdown().await;
}

#[tokio::test]
async fn a_signed_message_becomes_an_order_at_the_postgres_price_not_its_own() {
    let mut app = spawn_app().await;
    let product = app.product(10).await; // priced 500
    let mut msg = app.message(product, 1);
    msg.price_cents = 0;
    // Signed with the service's key, as seckill-api would: the signature vouches for who
    // bought what, never for the price.
    app.publish(&msg).await;
    app.stop_when_drained().await;
    assert_eq!(order_prices(&app, product).await, vec![500]);
    app.shutdown().await;
}

#[tokio::test]
async fn a_message_signed_with_the_previous_key_is_accepted_during_a_rotation() {
    let old = "the-key-being-retired";
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.backend.order_signing_key = "the-new-key".into();
        s.backend.order_signing_key_previous = old.into();
    })
    .await;
    let product = app.product(10).await;
    let msg = app.message(product, 1);
    let signature = OrderSigner::new(old).sign(&serde_json::to_vec(&msg).expect("json"));
    app.publish_signed_as(&msg, Some(&signature)).await;
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_redrive_keeps_the_signature_a_dead_letter_arrived_with() {
    let mut app = spawn_app().await;
    // A signed purchase of a product the database does not know yet, and an unsigned one;
    // both parked, both redriven once the product exists.
    let missing = 777_101;
    let signed = app.message(missing, 1);
    app.publish(&signed).await;
    let unsigned = app.message(missing, 2);
    app.publish_signed_as(&unsigned, None).await;
    app.wait_parked(2).await;
    let redriven: Value = redrive_once_on_sale(&app, missing)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(redriven["event_ids"].as_array().map(Vec::len), Some(2));
    // The signed one becomes an order; the unsigned one is refused again and parked again.
    let id = unsigned.request_id.to_string();
    let wait = std::time::Duration::from_secs(20);
    let back = eventually("the unsigned one parked again", wait, || async {
        let parked = app.parked().await;
        let back = parked.into_iter().find(|p| p.0 == id && p.2 == "pending")?;
        Some(back)
    })
    .await;
    assert_eq!(back.1, "unsigned");
    app.stop_when_drained().await;
    assert_eq!(app.order_count(missing).await, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_forgery_under_a_parked_purchases_request_id_does_not_replace_it() {
    let mut app = spawn_app().await;
    // A genuine purchase of a product the database does not know yet: parked, signed.
    let missing = 777_202;
    let genuine = app.message(missing, 1);
    app.publish(&genuine).await;
    let parked = app.wait_parked(1).await;
    let id = genuine.request_id.to_string();
    let last_attempt = || async {
        sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
            "SELECT last_attempt FROM dead_letters WHERE event_id = $1",
        )
        .bind(&id)
        .fetch_one(&app.db)
        .await
        .expect("last attempt")
    };
    let first = last_attempt().await;
    // The same request id, rewritten for someone else, unsigned: refused and recorded.
    let mut forged = genuine.clone();
    forged.user_id = 2;
    app.publish_signed_as(&forged, None).await;
    let wait = std::time::Duration::from_secs(20);
    eventually("the forgery recorded", wait, || async {
        (last_attempt().await > first).then_some(())
    })
    .await;
    let now = app.parked().await;
    assert_eq!(now.len(), 1);
    assert_eq!(now[0].1, parked[0].1, "the genuine reason is kept");

    // The genuine purchase is still what a redrive sends, and it becomes user 1's order.
    let redriven = redrive_once_on_sale(&app, missing).await;
    assert!(redriven.status().is_success());
    app.stop_when_drained().await;
    let buyers: Vec<i64> = sqlx::query_scalar("SELECT user_id FROM orders WHERE product_id = $1")
        .bind(missing)
        .fetch_all(&app.db)
        .await
        .expect("buyers");
    assert_eq!(buyers, vec![1]);
    app.shutdown().await;
}
