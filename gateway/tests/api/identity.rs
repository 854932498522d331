//! The identity credential the gateway signs, captured on its way to a backend (an echo in
//! its place) and replayed against the real services.

use std::collections::BTreeMap;

use seckill_auth::{IdentityVerifier, RequestFacts};
use seckill_config::Secret;
use seckill_testkit::INTERNAL_KEY;

use crate::echo::{seen_headers, settings, spawn_echo, spawn_gateway};
use crate::helpers::{assert_error, spawn_platform, user_token};

/// The headers that carry a credential, as a backend received them.
const CARRIED: [&str; 5] = [
    "x-request-id",
    "x-user-id",
    "x-user-roles",
    "x-identity-ts",
    "x-identity-sig",
];

fn carried(seen: &BTreeMap<String, String>) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    for name in CARRIED {
        let value = seen.get(name).unwrap_or_else(|| panic!("{name} forwarded"));
        headers.insert(name, value.parse().expect("header value"));
    }
    headers
}

#[tokio::test]
async fn a_captured_credential_works_once_and_only_for_its_own_request() {
    let platform = spawn_platform().await;
    let product = platform.create_product(5, -60).await;
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;
    let path = format!("/api/seckill/{product}");
    let response = gateway
        .post(&path)
        .bearer_auth(user_token(31))
        .send()
        .await
        .expect("request");
    let captured = carried(&seen_headers(response).await);

    let api = &platform.seckill_api;
    let client = &platform.client;
    let elsewhere = [
        client.get(format!("{api}{path}/result")),
        client.post(format!("{api}/api/seckill/{}", product + 1)),
        client.post(format!("{api}{path}?quantity=2")),
        client.post(format!("{api}{path}")).body("{}"),
    ];
    for request in elsewhere {
        let response = request
            .headers(captured.clone())
            .send()
            .await
            .expect("request");
        assert_error(response, 401, "unauthorized").await;
    }
    let own = || {
        client
            .post(format!("{api}{path}"))
            .headers(captured.clone())
    };
    let first = own().send().await.expect("request");
    assert_eq!(first.status(), 202, "the captured credential was valid");
    let replayed = own().send().await.expect("request");
    assert_error(replayed, 401, "unauthorized").await;
    platform.shutdown().await;
}

#[tokio::test]
async fn each_backend_gets_a_credential_under_its_own_key() {
    let echo = spawn_echo().await;
    let order_key = "order-service-only-key-0123";
    let gateway = spawn_gateway(gateway::Settings {
        order_service_internal_key: Some(Secret::new(order_key)),
        ..settings(&echo.url)
    })
    .await;
    let cases = [
        ("/api/orders", order_key, "order-service"),
        ("/api/products", INTERNAL_KEY, "seckill-api"),
    ];
    for (path, key, service) in cases {
        let response = gateway
            .get(path)
            .bearer_auth(user_token(8))
            .send()
            .await
            .expect("request");
        let seen = seen_headers(response).await;
        let headers = carried(&seen);
        let facts = RequestFacts {
            method: "GET",
            target: path,
            request_id: &seen["x-request-id"],
            body: b"",
        };
        let window = std::time::Duration::from_secs(5);
        let own = IdentityVerifier::new(key, service, window);
        let other_key = if key == INTERNAL_KEY {
            order_key
        } else {
            INTERNAL_KEY
        };
        let other = IdentityVerifier::new(other_key, service, window);
        assert!(other.verify(&headers, &facts).await.is_err(), "{path}");
        let identity = own.verify(&headers, &facts).await.expect("verifies");
        assert_eq!(identity.user_id, 8, "{path}");
    }
}
