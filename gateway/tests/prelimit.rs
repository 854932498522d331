//! The pre-limit on unverified tokens, in a test binary of its own: it counts the gateway's
//! signature checks (`gateway_token_verifications_total`), and the metrics recorder is one
//! per process, so no other test's gateway may verify tokens alongside.

#[allow(dead_code)]
#[path = "api/echo.rs"]
mod echo;

use seckill_auth::mint_token;
use seckill_testkit::JWT_SECRET;

use echo::{settings, spawn_echo, spawn_gateway};

#[tokio::test]
async fn garbage_tokens_from_one_address_get_429_without_a_signature_check_each() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        // One worker: a token verified once is then known to every request.
        workers: 1,
        rate_unverified_per_sec: 1,
        rate_unverified_burst: 3,
        ..settings(&echo.url)
    })
    .await;
    let good = mint_token(JWT_SECRET, 9, &[], 600);
    let with_token = |token: String| {
        let request = gateway.get("/api/products").bearer_auth(token);
        async move { request.send().await.expect("request").status().as_u16() }
    };
    assert_eq!(with_token(good.clone()).await, 200, "verified, then known");
    let before = gateway
        .metric("gateway_token_verifications_total", &[])
        .await;

    let mut statuses = Vec::new();
    for n in 0..40 {
        // A new garbage token each time, as a flood would send, so none is ever known.
        statuses.push(with_token(format!("garbage.{n}.token")).await);
    }
    let refused = statuses.iter().filter(|s| **s == 429).count();
    let checked = statuses.iter().filter(|s| **s == 401).count();
    assert_eq!(refused + checked, 40, "{statuses:?}");
    assert!(refused >= 30, "{statuses:?}");
    let after = gateway
        .metric("gateway_token_verifications_total", &[])
        .await;
    // The burst and what one second regains while the flood runs; each 401 was one check.
    assert_eq!(after - before, checked as f64, "{statuses:?}");
    assert!(checked <= 6, "{statuses:?}");

    // The known token still passes: it is never charged to the pre-limit.
    assert_eq!(with_token(good).await, 200);
}
