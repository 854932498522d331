//! A sold-out product's purchases answered by the gateway itself, and a unit put back on
//! sale bought through the gateway within the bound (`docs/DESIGN.md` §3, "Sold out,
//! remembered outside Redis — and its bound").
//!
//! A binary of its own: the metrics recorder is process-wide, so the counts this test reads
//! must not include other tests' requests.

#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use std::time::{Duration, Instant};

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use helpers::{Platform, final_result, spawn_platform_tuned, user_token};
use seckill_store::reopened::{self, Event};
use seckill_testkit::eventually;

/// How long after units go back on sale a buyer may still hear `sold_out`: the replicas'
/// `sold_out_local_ttl_ms` and the gateway's `sold_out_ttl_ms`, both 500 ms by default.
const BOUND: Duration = Duration::from_millis(500);

const EDGE_ANSWERS: &str = "gateway_sold_out_answers_total";
const FOLLOWING: &str = "gateway_sold_out_following";
const REPLICA_FOLLOWING: &str = "seckill_sold_out_following";
const REPLICA_SOLD_OUT: &str = "seckill_purchases_total{outcome=\"sold_out\"}";

/// A metric's value in the Prometheus text at `url` (0 when absent).
async fn metric(platform: &Platform, url: &str, name: &str) -> f64 {
    let text = platform
        .client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            (series == name).then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sold_out_product_is_answered_at_the_gateway_and_a_returned_unit_sells_within_the_bound()
{
    // Flags that outlive the test: only the announcement can make either forget. Start-up
    // refuses memories this long (`seckill_config::MAX_SOLD_OUT_MEMORY`); building the
    // services directly takes the settings as given.
    let platform = spawn_platform_tuned(
        |api| api.sold_out_local_ttl = Duration::from_secs(600),
        |_| {},
        |gateway| gateway.sold_out_ttl = Duration::from_secs(600),
    )
    .await;
    let admin = platform.gateway_admin.clone();
    eventually(
        "the gateway and the replica follow the announcements",
        Duration::from_secs(20),
        || async {
            let gateway = metric(&platform, &admin, FOLLOWING).await;
            let replica = metric(&platform, &platform.seckill_api, REPLICA_FOLLOWING).await;
            (gateway == 1.0 && replica == 1.0).then_some(())
        },
    )
    .await;
    let product = platform.create_product(1, -60).await;
    let first = user_token(501);
    let buy_with_key = || async {
        platform
            .client
            .post(format!("{}/api/seckill/{product}", platform.gateway))
            .bearer_auth(&first)
            .header("idempotency-key", "first-try")
            .send()
            .await
            .expect("purchase")
    };
    let bought = buy_with_key().await;
    assert_eq!(bought.status(), 202);
    let bought: Value = bought.json().await.expect("json");
    let order_id = final_result(&platform, product, &first).await["order_id"]
        .as_i64()
        .expect("an order");

    // The first late buyer hears it from the replica, with the flag's generation.
    let late = platform.buy(product, &user_token(502)).await;
    assert_eq!(late.status(), 410);
    let flag = late
        .headers()
        .get("seckill-sold-out")
        .expect("the replica's 410 names its flag")
        .to_str()
        .expect("ascii")
        .to_string();
    let (flagged, _generation) = reopened::parse(flag.as_bytes()).expect("`<product> <gen>`");
    assert_eq!(flagged, product);

    // Everyone after hears it from the gateway: the replica answers no more of them.
    let edge_before = metric(&platform, &admin, EDGE_ANSWERS).await;
    let replica_before = metric(&platform, &platform.seckill_api, REPLICA_SOLD_OUT).await;
    for user in 503..523 {
        let answer = platform.buy(product, &user_token(user)).await;
        assert_eq!(answer.status(), 410);
        assert_eq!(
            answer
                .headers()
                .get("seckill-sold-out")
                .map(|v| v.as_bytes()),
            Some(flag.as_bytes())
        );
        let body: Value = answer.json().await.expect("json");
        assert_eq!(body["code"], "sold_out");
    }
    assert_eq!(
        metric(&platform, &admin, EDGE_ANSWERS).await,
        edge_before + 20.0
    );
    assert_eq!(
        metric(&platform, &platform.seckill_api, REPLICA_SOLD_OUT).await,
        replica_before,
        "no late purchase reached the replica"
    );
    // A retry of the first purchase with its key is the replica's to answer: the first answer.
    let replayed = buy_with_key().await;
    assert_eq!(
        replayed.status(),
        202,
        "the key's first answer, not sold out"
    );
    let replayed: Value = replayed.json().await.expect("json");
    assert_eq!(replayed["request_id"], bought["request_id"]);

    // A unit goes back on sale: the buyer cancels. This test hears the announcement too.
    let (heard_tx, mut heard) = tokio::sync::mpsc::unbounded_channel();
    let listening = CancellationToken::new();
    tokio::spawn(reopened::follow(
        reopened::urls(&platform.ns.redis_url, platform.ns.redis_cluster),
        platform.ns.keys().reopened_channel(),
        listening.clone(),
        move |event| {
            let _ = heard_tx.send(event);
        },
    ));
    assert_eq!(
        heard.recv().await,
        Some(Event::Subscribed),
        "the test's own subscription"
    );
    let cancelled = platform
        .post(&format!("/api/orders/{order_id}/cancel"), &first)
        .await;
    assert_eq!(cancelled.status(), 200);
    let announced = tokio::time::timeout(Duration::from_secs(30), heard.recv())
        .await
        .expect("the unit went back on sale within 30 s");
    let Some(Event::Reopened { product_id, .. }) = announced else {
        panic!("expected the reopen, got {announced:?}");
    };
    assert_eq!(product_id, product);
    let reopened_at = Instant::now();

    // Bought through the gateway within the bound, by whoever asks first.
    let mut buyer = 600;
    let bought_after = loop {
        buyer += 1;
        let status = platform.buy(product, &user_token(buyer)).await.status();
        if status == 202 {
            break reopened_at.elapsed();
        }
        assert_eq!(status, 410, "only sold out until it sells");
        assert!(
            reopened_at.elapsed() < Duration::from_secs(10),
            "the returned unit did not sell within 10 s of its announcement"
        );
    };
    assert!(
        bought_after < BOUND,
        "the returned unit sold {bought_after:?} after it was announced; the bound is {BOUND:?}"
    );
    listening.cancel();
    platform.shutdown().await;
}
