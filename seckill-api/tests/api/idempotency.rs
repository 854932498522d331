//! `Idempotency-Key`: one key, one purchase, one answer.

use std::collections::HashSet;

use futures_util::future::join_all;
use serde_json::Value;

use axum::http::StatusCode;
use seckill_api::error::ApiError;
use seckill_api::idempotency::{Claim, Idempotency};
use seckill_testkit::SendAs;

use crate::helpers::{TestApp, assert_error, spawn_app};

async fn buy_with_key(app: &TestApp, product: i64, user: i64, key: &str) -> reqwest::Response {
    app.client
        .post(format!("{}/api/seckill/{product}", app.address))
        .header("idempotency-key", key)
        .send_as("seckill-api", user, &[])
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

/// Leaves the record an earlier request under `key` would leave had it run purchase
/// `request_id` and then died (or failed transiently) before storing its answer.
async fn unfinished_claim(app: &TestApp, user: i64, key: &str, product: i64, request_id: &str) {
    let record = serde_json::json!({
        "state": "pending",
        "product_id": product,
        "request_id": request_id,
        "lease_until_ms": chrono::Utc::now().timestamp_millis() - 1,
    });
    let mut redis = app.ns.redis().await;
    let _: () = redis::cmd("SET")
        .arg(app.ns.keys().idempotency(user, key))
        .arg(record.to_string())
        .query_async(&mut redis)
        .await
        .expect("set");
}

#[tokio::test]
async fn a_retry_after_an_unanswered_purchase_that_bought_replays_its_202() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    // The earlier request's purchase went through; its answer never reached the record.
    let bought: Value = app.purchase(product, 8).await.json().await.expect("json");
    let request_id = bought["request_id"].as_str().expect("request id");
    unfinished_claim(&app, 8, "click-1", product, request_id).await;

    let retry = buy_with_key(&app, product, 8, "click-1").await;
    assert_eq!(retry.status(), 202, "the purchase was accepted: not a 409");
    let retry: Value = retry.json().await.expect("json");
    assert_eq!(retry["request_id"], request_id);
    // Stored now: the next retry replays it.
    let again = buy_with_key(&app, product, 8, "click-1").await;
    assert_eq!(again.status(), 202);
    assert!(again.headers().contains_key("idempotent-replayed"));
    assert_eq!(app.redis_remaining(product).await, Some(4), "bought once");
    app.shutdown().await;
}

#[tokio::test]
async fn a_retry_after_an_unanswered_purchase_that_never_ran_buys() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    let never_ran = uuid::Uuid::now_v7().to_string();
    unfinished_claim(&app, 8, "click-1", product, &never_ran).await;

    let retry = buy_with_key(&app, product, 8, "click-1").await;
    assert_eq!(retry.status(), 202);
    let retry: Value = retry.json().await.expect("json");
    assert_ne!(retry["request_id"], never_ran.as_str());
    assert_eq!(app.redis_remaining(product).await, Some(4));
    app.shutdown().await;
}

#[tokio::test]
async fn a_request_whose_lease_passed_cannot_touch_the_claim_that_took_over() {
    let app = spawn_app().await;
    let redis =
        seckill_store::Redis::new(&app.ns.redis_url, app.ns.redis_cluster, 1).expect("redis");
    let idem = Idempotency::new(redis, app.ns.keys());
    let Claim::Fresh(first) = idem.claim(8, "k", 1).await.expect("claim") else {
        panic!("a new key is fresh");
    };
    // The first request stalls past its lease; a retry takes the key over.
    unfinished_claim(&app, 8, "k", 1, &first.request_id.to_string()).await;
    let Claim::TakeOver {
        ticket: second,
        earlier,
    } = idem.claim(8, "k", 1).await.expect("claim")
    else {
        panic!("a claim past its lease is taken over");
    };
    assert_eq!(earlier, first.request_id);
    // The first request wakes up: neither its release nor its answer reaches the record.
    idem.release(8, "k", &first, first.request_id)
        .await
        .expect("release");
    idem.complete(8, "k", &first, StatusCode::GONE, "{}")
        .await
        .expect("complete");
    assert!(
        matches!(
            idem.claim(8, "k", 1).await,
            Err(ApiError::RequestInProgress)
        ),
        "still the second request's"
    );
    idem.complete(8, "k", &second, StatusCode::ACCEPTED, "{\"ok\":1}")
        .await
        .expect("complete");
    match idem.claim(8, "k", 1).await.expect("claim") {
        Claim::Replay { status, body } => {
            assert_eq!(status, StatusCode::ACCEPTED);
            assert_eq!(body, "{\"ok\":1}");
        }
        other => panic!("expected the second answer, got {other:?}"),
    }
    app.shutdown().await;
}

#[tokio::test]
async fn a_retry_while_the_earlier_sweep_is_still_open_keeps_nothing_and_looks_again() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    assert_eq!(app.purchase(product, 9).await.status(), 202, "load");
    // The earlier request under the key was sweeping: its reservation names its purchase,
    // and whether it took a unit is not known before the reservation's fence has passed.
    let earlier = uuid::Uuid::now_v7().to_string();
    let buckets = app.buckets(product).await;
    let mut redis = app.ns.redis().await;
    let _: () = redis::cmd("HSET")
        .arg(
            app.ns
                .keys()
                .buyers(product, seckill_store::home_bucket(8, buckets)),
        )
        .arg(8)
        .arg(format!(
            "r:{}:{earlier}",
            chrono::Utc::now().timestamp_millis()
        ))
        .query_async(&mut redis)
        .await
        .expect("reservation");
    unfinished_claim(&app, 8, "click-1", product, &earlier).await;

    // Not a 202 for a purchase that may hold nothing, not a 409 kept for good: a 503.
    assert_error(
        buy_with_key(&app, product, 8, "click-1").await,
        503,
        "unavailable",
    )
    .await;
    // And the next retry still looks for the earlier purchase: once its sweep is known to
    // have taken a unit, that purchase is the answer.
    let _: () = redis::cmd("HSET")
        .arg(
            app.ns
                .keys()
                .buyers(product, seckill_store::home_bucket(8, buckets)),
        )
        .arg(8)
        .arg(format!("t0:{earlier}"))
        .query_async(&mut redis)
        .await
        .expect("closed marker");
    let retry = buy_with_key(&app, product, 8, "click-1").await;
    assert_eq!(retry.status(), 202);
    let retry: Value = retry.json().await.expect("json");
    assert_eq!(retry["request_id"], earlier.as_str());
    app.shutdown().await;
}
