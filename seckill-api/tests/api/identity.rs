//! The gateway's identity credential as seckill-api checks it: bound to one request, within
//! the window either way, once.

use axum::http::HeaderValue;
use chrono::Utc;
use serde_json::json;

use seckill_auth::{IdentitySigner, RequestFacts};
use seckill_testkit::{INTERNAL_KEY, sign_request};

use crate::helpers::{TestApp, assert_error, spawn_app};

/// A purchase of `product` by user 5 signed `skew_ms` from now.
fn purchase_signed_at(app: &TestApp, product: i64, skew_ms: i64) -> reqwest::Request {
    let path = format!("/api/seckill/{product}");
    let mut request = app
        .client
        .post(format!("{}{path}", app.address))
        .header("x-request-id", "rid-skew")
        .build()
        .expect("request");
    let facts = RequestFacts {
        method: "POST",
        target: &path,
        request_id: "rid-skew",
        body: b"",
    };
    let ts = Utc::now().timestamp_millis() + skew_ms;
    let signer = IdentitySigner::new(INTERNAL_KEY, "seckill-api");
    signer.sign_at(5, "", ts, &facts, |values| {
        for (name, value) in seckill_auth::identity::IDENTITY_HEADERS.iter().zip(values) {
            let value = HeaderValue::from_bytes(value).expect("header value");
            request.headers_mut().insert(name, value);
        }
    });
    request
}

#[tokio::test]
async fn a_credential_older_than_the_window_or_beyond_the_skew_is_refused() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    // The window is 5 s by default: 6 s either way is outside it.
    for skew_ms in [-6_000, 6_000] {
        let request = purchase_signed_at(&app, product, skew_ms);
        let response = app.client.execute(request).await.expect("request");
        assert_error(response, 401, "unauthorized").await;
    }
    let fresh = purchase_signed_at(&app, product, -1_000);
    let response = app.client.execute(fresh).await.expect("request");
    assert_eq!(response.status(), 202, "a second-old credential is fine");
    app.shutdown().await;
}

#[tokio::test]
async fn an_admin_credential_is_bound_to_its_body_and_used_once() {
    let app = spawn_app().await;
    let now = Utc::now();
    let product = |name: &str| {
        json!({
            "name": name,
            "price_cents": 100,
            "stock": 3,
            "start_at": now,
            "end_at": now + chrono::Duration::hours(1),
        })
    };
    let url = format!("{}/admin/products", app.address);
    let mut signed = app
        .client
        .post(&url)
        .json(&product("cheap"))
        .build()
        .expect("request");
    sign_request(&mut signed, "seckill-api", 1, &["admin"]);
    let headers = signed.headers().clone();

    // The same credential on another body: a tampered request.
    let tampered = app
        .client
        .post(&url)
        .headers(headers.clone())
        .json(&product("free"))
        .send()
        .await
        .expect("request");
    assert_error(tampered, 401, "unauthorized").await;

    let original = signed.try_clone().expect("a buffered body");
    let created = app.client.execute(original).await.expect("request");
    assert_eq!(created.status(), 201);

    let replayed = app.client.execute(signed).await.expect("request");
    assert_error(replayed, 401, "unauthorized").await;
    app.shutdown().await;
}
