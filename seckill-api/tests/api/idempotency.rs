//! `Idempotency-Key`: one key, one purchase, one answer.

use std::collections::HashSet;

use futures_util::future::join_all;
use serde_json::Value;

use seckill_testkit::identity_headers;

use crate::helpers::{TestApp, assert_error, spawn_app};

async fn buy_with_key(app: &TestApp, product: i64, user: i64, key: &str) -> reqwest::Response {
    app.client
        .post(format!("{}/api/seckill/{product}", app.address))
        .headers(identity_headers(user, &[]))
        .header("idempotency-key", key)
        .send()
        .await
        .expect("purchase")
}

#[tokio::test]
async fn a_repeated_key_replays_the_first_answer_without_buying_twice() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;

    let first = buy_with_key(&app, product, 8, "order-abc").await;
    assert_eq!(first.status(), 202);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let first: Value = first.json().await.expect("json");

    let again = buy_with_key(&app, product, 8, "order-abc").await;
    assert_eq!(
        again.status(),
        202,
        "not 409: the same request, answered the same"
    );
    assert_eq!(
        again
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    let again: Value = again.json().await.expect("json");
    assert_eq!(again, first);
    assert_eq!(app.redis_remaining(product).await, Some(4));

    // Without the key the same user is simply told they already bought.
    assert_error(app.purchase(product, 8).await, 409, "already_purchased").await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_key_reused_for_another_product_gets_422() {
    let app = spawn_app().await;
    let first = app.create_product(5).await;
    let second = app.create_product(5).await;
    assert_eq!(buy_with_key(&app, first, 8, "k1").await.status(), 202);
    assert_error(
        buy_with_key(&app, second, 8, "k1").await,
        422,
        "idempotency_key_reused",
    )
    .await;
    assert_eq!(app.redis_remaining(second).await, None, "nothing sold");
    app.shutdown().await;
}

#[tokio::test]
async fn keys_belong_to_their_user() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    assert_eq!(buy_with_key(&app, product, 1, "same").await.status(), 202);
    assert_eq!(buy_with_key(&app, product, 2, "same").await.status(), 202);
    assert_eq!(app.redis_remaining(product).await, Some(3));
    app.shutdown().await;
}

#[tokio::test]
async fn concurrent_requests_with_one_key_buy_once() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    let responses = join_all((0..20).map(|_| buy_with_key(&app, product, 9, "burst"))).await;
    let mut request_ids = HashSet::new();
    for response in responses {
        match response.status().as_u16() {
            202 => {
                let body: Value = response.json().await.expect("json");
                request_ids.insert(body["request_id"].as_str().expect("id").to_string());
            }
            409 => {
                let body: Value = response.json().await.expect("json");
                assert_eq!(body["code"], "request_in_progress");
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(request_ids.len(), 1, "every 202 is the same purchase");
    assert_eq!(app.redis_remaining(product).await, Some(4));
    app.shutdown().await;
}

#[tokio::test]
async fn a_malformed_key_gets_400() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    for bad in ["", &"x".repeat(129), "has space"] {
        assert_error(
            buy_with_key(&app, product, 3, bad).await,
            400,
            "invalid_request",
        )
        .await;
    }
    app.shutdown().await;
}
