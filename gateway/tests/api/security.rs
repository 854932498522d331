//! Hostile callers: bad tokens, spoofed identity, going around the gateway.

use std::time::Duration;

use seckill_auth::mint_token;
use seckill_testkit::{JWT_SECRET, eventually};

use crate::helpers::{assert_error, spawn_platform, user_token};

#[tokio::test]
async fn missing_or_invalid_tokens_get_401_with_www_authenticate() {
    let platform = spawn_platform().await;
    let product = platform.create_product(5, -60).await;
    let url = format!("{}/api/seckill/{product}", platform.gateway);

    let no_token = platform.client.post(&url).send().await.expect("request");
    assert!(no_token.headers().contains_key("www-authenticate"));
    assert_error(no_token, 401, "unauthorized").await;

    let expired = mint_token(JWT_SECRET, 5, &[], -300);
    let wrong_secret = mint_token("some-other-secret-entirely", 5, &[], 300);
    let mut tampered = user_token(5);
    tampered.insert(tampered.len() - 3, 'x');
    let alg_none = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiI1IiwiZXhwIjo5OTk5OTk5OTk5fQ.";
    for token in [
        expired.as_str(),
        &wrong_secret,
        &tampered,
        alg_none,
        "garbage",
    ] {
        assert_error(platform.buy(product, token).await, 401, "unauthorized").await;
    }
    platform.shutdown().await;
}

#[tokio::test]
async fn a_user_token_cannot_reach_admin_routes() {
    let platform = spawn_platform().await;
    let response = platform
        .client
        .post(format!("{}/admin/products", platform.gateway))
        .bearer_auth(user_token(5))
        .json(&serde_json::json!({"name": "x"}))
        .send()
        .await
        .expect("request");
    assert_error(response, 403, "forbidden").await;
    platform.shutdown().await;
}

#[tokio::test]
async fn a_spoofed_user_header_is_ignored_and_the_order_belongs_to_the_token() {
    let platform = spawn_platform().await;
    let product = platform.create_product(5, -60).await;
    let response = platform
        .client
        .post(format!("{}/api/seckill/{product}", platform.gateway))
        .bearer_auth(user_token(11))
        .header("x-user-id", "999")
        .header("x-user-roles", "admin")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 202);

    let db = platform.ns.db().await;
    let owner: i64 = eventually("order written", Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            sqlx::query_scalar("SELECT user_id FROM orders WHERE product_id = $1")
                .bind(product)
                .fetch_optional(&db)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    assert_eq!(owner, 11);
    db.close().await;
    platform.shutdown().await;
}

#[tokio::test]
async fn backends_refuse_callers_that_went_around_the_gateway() {
    let platform = spawn_platform().await;
    let product = platform.create_product(5, -60).await;
    // Straight to seckill-api, with the headers a client might hope backends trust.
    let direct = platform
        .client
        .post(format!("{}/api/seckill/{product}", platform.seckill_api))
        .header("x-user-id", "12")
        .bearer_auth(user_token(12))
        .send()
        .await
        .expect("request");
    assert_error(direct, 401, "unauthorized").await;
    let orders = platform
        .client
        .get(format!("{}/api/orders", platform.order_service))
        .header("x-user-id", "12")
        .send()
        .await
        .expect("request");
    assert_error(orders, 401, "unauthorized").await;
    platform.shutdown().await;
}

#[tokio::test]
async fn an_oversize_body_gets_413() {
    let platform = spawn_platform().await;
    let response = platform
        .client
        .post(format!("{}/admin/products", platform.gateway))
        .bearer_auth(crate::helpers::admin_token())
        .header("content-type", "application/json")
        .body(vec![b' '; 100 * 1024])
        .send()
        .await
        .expect("request");
    assert_error(response, 413, "payload_too_large").await;
    platform.shutdown().await;
}

#[tokio::test]
async fn gateway_metrics_count_proxied_requests() {
    let platform = spawn_platform().await;
    let _ = platform.buy(1, &user_token(1)).await;
    let metrics = platform
        .client
        .get(format!("{}/metrics", platform.gateway_admin))
        .send()
        .await
        .expect("request")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("route=\"seckill-api\""),
        "no proxied series in: {metrics}"
    );
    platform.shutdown().await;
}

#[tokio::test]
async fn an_oversize_or_odd_request_id_is_replaced_not_propagated() {
    let platform = spawn_platform().await;
    let product = platform.create_product(5, -60).await;
    let hostile = "x".repeat(20_000);
    let response = platform
        .client
        .post(format!("{}/api/seckill/{product}", platform.gateway))
        .bearer_auth(user_token(21))
        .header("x-request-id", &hostile)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 202);
    let echoed = response
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .expect("a request id")
        .to_string();
    assert_ne!(echoed, hostile);
    assert!(echoed.len() <= 128);

    // The purchase still becomes an order: the relay was not poisoned by the header.
    let db = platform.ns.db().await;
    eventually("order written", Duration::from_secs(30), || {
        let db = db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT user_id FROM orders WHERE product_id = $1")
                .bind(product)
                .fetch_optional(&db)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    db.close().await;
    platform.shutdown().await;
}
