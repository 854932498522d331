//! Once a product is gone, late requests are answered from the sold-out flags, not by Lua.
//!
//! A binary of its own: the metrics recorder is process-wide, so the counts this test reads
//! must not include other tests' requests.

#[path = "api/helpers.rs"]
#[allow(dead_code)]
mod helpers;

use std::time::Duration;

use helpers::spawn_app_with;

const PURCHASE_LUA: &str = "seckill_lua_seconds_count{script=\"purchase\"}";
const LOCAL_FLAG: &str = "seckill_sold_out_flag_hits_total{flag=\"local\"}";
const REDIS_FLAG: &str = "seckill_sold_out_flag_hits_total{flag=\"redis\"}";
const RAISED: &str = "seckill_sold_out_flags_raised_total";

#[tokio::test]
async fn late_requests_are_answered_by_the_flags_without_running_lua() {
    // A local flag that outlives the test, so the counts below are exact (start-up refuses
    // more than 500 ms; `Application::build` takes the settings as given).
    let app = spawn_app_with(|s| s.sold_out_local_ttl = Duration::from_secs(60)).await;
    let product = app.create_product_in_buckets(3, 4).await;
    for user in 1..=3 {
        assert_eq!(app.purchase(product, user).await.status(), 202);
    }
    // The first buyer to find every bucket dry sweeps and raises the Redis flag.
    assert_eq!(app.purchase(product, 4).await.status(), 410);
    assert_eq!(app.metric(RAISED).await, 1.0);
    let lua_before = app.metric(PURCHASE_LUA).await;
    let local_before = app.metric(LOCAL_FLAG).await;
    for user in 5..25 {
        assert_eq!(app.purchase(product, user).await.status(), 410);
    }
    assert_eq!(
        app.metric(PURCHASE_LUA).await,
        lua_before,
        "no Lua after sold out"
    );
    assert_eq!(app.metric(LOCAL_FLAG).await, local_before + 20.0);

    // Another replica (no local flag yet) learns it from the Redis flag: one home-bucket
    // script, no sweep, then its own local flag.
    let other = helpers::spawn_app_in(app.ns.clone(), |s| {
        s.sold_out_local_ttl = Duration::from_secs(60)
    })
    .await;
    let redis_before = app.metric(REDIS_FLAG).await;
    let lua_before = app.metric(PURCHASE_LUA).await;
    for user in 30..40 {
        assert_eq!(other.purchase(product, user).await.status(), 410);
    }
    assert_eq!(app.metric(REDIS_FLAG).await, redis_before + 1.0);
    assert_eq!(app.metric(PURCHASE_LUA).await, lua_before + 1.0);
    assert_eq!(app.metric(RAISED).await, 1.0, "no second sweep");
    other.stop().await;
    app.shutdown().await;
}
