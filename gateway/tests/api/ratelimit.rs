//! Rate limits: per user when the token verified, per client address otherwise, and an
//! address taken from `X-Forwarded-For` only through a trusted proxy.

use reqwest::Response;
use serde_json::Value;

use crate::echo::{Gateway, settings, spawn_echo, spawn_gateway};
use crate::helpers::user_token;

/// At most this many requests are sent looking for a 429: the quotas below replenish one
/// request per second, so a 429 comes right after the burst unless the machine stalls.
const TRIES: usize = 10;

pub fn header(response: &Response, name: &str) -> u64 {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("header {name} missing or not a number: {response:?}"))
}

/// Sends `request()` until a 429; returns the answers before it and the 429.
pub async fn until_limited<F, Fut>(mut request: F) -> (Vec<u16>, Response)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Response>,
{
    let mut before = Vec::new();
    for _ in 0..TRIES {
        let response = request().await;
        if response.status() == 429 {
            return (before, response);
        }
        before.push(response.status().as_u16());
    }
    panic!("no 429 in {TRIES} requests: {before:?}");
}

pub async fn assert_is_429(response: Response, limit: u64) {
    assert!(header(&response, "retry-after") >= 1);
    assert!(header(&response, "x-ratelimit-reset") >= 1);
    assert_eq!(header(&response, "x-ratelimit-limit"), limit);
    assert_eq!(header(&response, "x-ratelimit-remaining"), 0);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "rate_limited");
}

async fn limited_gateway(upstream: &str, trusted_proxies: &str) -> Gateway {
    spawn_gateway(gateway::Settings {
        rate_purchase_per_sec: 1,
        rate_purchase_burst: 2,
        rate_default_per_sec: 1,
        rate_default_burst: 3,
        trusted_proxies: trusted_proxies.into(),
        ..settings(upstream)
    })
    .await
}

#[tokio::test]
async fn a_user_over_the_purchase_quota_gets_429_with_headers_and_others_are_unaffected() {
    let echo = spawn_echo().await;
    let gateway = limited_gateway(&echo.url, "").await;
    let alice = user_token(41);
    let buy = |token: String| {
        let request = gateway.post("/api/seckill/1").bearer_auth(token);
        async move { request.send().await.expect("request") }
    };

    let first = buy(alice.clone()).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "x-ratelimit-limit"), 2);
    assert_eq!(header(&first, "x-ratelimit-remaining"), 1);
    let limited_before = gateway
        .metric("gateway_rate_limited_total", &[("route", "purchase")])
        .await;
    let (passed, limited) = until_limited(|| buy(alice.clone())).await;
    assert!(passed.iter().all(|s| *s == 200), "{passed:?}");
    assert_is_429(limited, 2).await;
    let limited_after = gateway
        .metric("gateway_rate_limited_total", &[("route", "purchase")])
        .await;
    assert!(limited_after > limited_before);
    let requests_429 = gateway
        .metric(
            "http_requests_total",
            &[
                ("service", "gateway"),
                ("route", "seckill-api"),
                ("status", "429"),
            ],
        )
        .await;
    assert!(requests_429 >= 1.0, "429s are counted under their upstream");
    let hits = echo.hits();

    // Another user has a bucket of their own, and Alice's other routes a quota of their own.
    let bob = buy(user_token(42)).await;
    assert_eq!(bob.status(), 200);
    assert_eq!(header(&bob, "x-ratelimit-remaining"), 1);
    let browse = gateway
        .get("/api/products/1")
        .bearer_auth(&alice)
        .send()
        .await
        .expect("request");
    assert_eq!(browse.status(), 200);
    assert_eq!(header(&browse, "x-ratelimit-limit"), 3);
    assert_eq!(echo.hits(), hits + 2, "the 429s never reached the backend");
}

#[tokio::test]
async fn a_forged_forwarded_for_from_an_untrusted_peer_does_not_escape_the_bucket() {
    let echo = spawn_echo().await;
    let gateway = limited_gateway(&echo.url, "").await;
    let mut n = 0;
    let (passed, limited) = until_limited(|| {
        n += 1;
        // A new "client address" on every request, and no token: charged to the socket peer.
        let request = gateway
            .get("/api/products")
            .header("x-forwarded-for", format!("198.51.100.{n}"));
        async move { request.send().await.expect("request") }
    })
    .await;
    assert!(passed.iter().all(|s| *s == 401), "{passed:?}");
    assert_is_429(limited, 3).await;
    let again = gateway
        .get("/api/products")
        .header("x-forwarded-for", "203.0.113.250")
        .header("x-real-ip", "203.0.113.251")
        .send()
        .await
        .expect("request");
    assert_eq!(again.status(), 429);
    assert_eq!(echo.hits(), 0);
}

#[tokio::test]
async fn behind_a_trusted_proxy_the_rightmost_untrusted_address_is_the_bucket() {
    let echo = spawn_echo().await;
    // The test client connects from 127.0.0.1: here it plays the trusted proxy.
    let gateway = limited_gateway(&echo.url, "127.0.0.1/32, 10.0.0.0/8").await;
    let from = |xff: &'static str| {
        let request = gateway.get("/api/products").header("x-forwarded-for", xff);
        async move { request.send().await.expect("request") }
    };
    // The client wrote 6.6.6.6 itself; the proxies saw 203.0.113.7, then a trusted hop.
    let (passed, limited) = until_limited(|| from("6.6.6.6, 203.0.113.7, 10.1.1.1")).await;
    assert!(passed.iter().all(|s| *s == 401), "{passed:?}");
    assert_is_429(limited, 3).await;
    // Forging another leftmost entry does not change the bucket...
    assert_eq!(from("1.1.1.1, 203.0.113.7").await.status(), 429);
    // ...while a different client behind the same proxy has its own.
    assert_eq!(from("6.6.6.6, 203.0.113.8").await.status(), 401);
}

#[tokio::test]
async fn ipv6_clients_share_a_bucket_per_64_by_default() {
    let echo = spawn_echo().await;
    let gateway = limited_gateway(&echo.url, "127.0.0.1/32").await;
    let from = |xff: String| {
        let request = gateway.get("/api/products").header("x-forwarded-for", xff);
        async move { request.send().await.expect("request") }
    };
    // A new address inside one /64 for every request: still one bucket.
    let mut host = 0;
    let (passed, limited) = until_limited(|| {
        host += 1;
        from(format!("2001:db8:7:7::{host:x}"))
    })
    .await;
    assert!(passed.iter().all(|s| *s == 401), "{passed:?}");
    assert_is_429(limited, 3).await;
    let next_door = from("2001:db8:7:8::1".into()).await;
    assert_eq!(next_door.status(), 401, "another /64 has its own bucket");

    // With /128, every address is a client of its own.
    let per_address = spawn_gateway(gateway::Settings {
        rate_default_per_sec: 1,
        rate_default_burst: 1,
        rate_limit_ipv6_prefix: 128,
        trusted_proxies: "127.0.0.1/32".into(),
        ..settings(&echo.url)
    })
    .await;
    for host in 1..=5 {
        let response = per_address
            .get("/api/products")
            .header("x-forwarded-for", format!("2001:db8:7:9::{host}"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 401, "address {host}");
    }
}

#[tokio::test]
async fn with_rate_limits_off_nothing_is_throttled() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        rate_limit_enabled: false,
        rate_purchase_per_sec: 1,
        rate_purchase_burst: 1,
        ..settings(&echo.url)
    })
    .await;
    let token = user_token(43);
    for _ in 0..5 {
        let response = gateway
            .post("/api/seckill/1")
            .bearer_auth(&token)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
        assert!(!response.headers().contains_key("x-ratelimit-limit"));
    }
}
