//! The compensation relay putting a unit back on sale: the product's sold-out flag must come
//! down within its bound (docs/DESIGN.md §3) even when the step that lowers it failed.

use std::time::Duration;

use chrono::Utc;

use seckill_store::RedisConn;
use seckill_store::ledger::{BucketLoad, HeldUnit, Ledger, Window};
use seckill_testkit::{SendAs, eventually};

use crate::helpers::{TestApp, spawn_app};

/// Overwrites `key` with a string: every script on it then fails (`WRONGTYPE`) while the
/// scripts on other keys run, so one step of the compensation fails for as long as the test
/// wants, on a single Redis and on a cluster alike.
async fn make_unusable(redis: &mut RedisConn, key: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg("unusable")
        .query_async(redis)
        .await
        .expect("set");
}

/// Gives `key` back as a hash holding `fields`, in one step (a retry running in between
/// must not see it half-made).
async fn restore_hash(redis: &mut RedisConn, key: &str, fields: &[&str]) {
    let _: () =
        redis::Script::new("redis.call('DEL', KEYS[1]) redis.call('HSET', KEYS[1], unpack(ARGV))")
            .key(key)
            .arg(fields)
            .invoke_async(redis)
            .await
            .expect("restore");
}

/// The compensation rows of `product`: (units back in Redis, attempts of the row).
async fn progress(app: &TestApp, redis: &mut RedisConn, product: i64) -> (Option<i64>, i32) {
    let remaining: Option<i64> = redis::cmd("HGET")
        .arg(app.ns.keys().stock(product, 0))
        .arg("remaining")
        .query_async(redis)
        .await
        .expect("hget");
    let attempts: Option<i32> =
        sqlx::query_scalar("SELECT attempts FROM compensations WHERE product_id = $1")
            .bind(product)
            .fetch_optional(&app.db)
            .await
            .expect("attempts");
    (remaining, attempts.unwrap_or(0))
}

#[tokio::test]
async fn a_unit_back_in_its_bucket_does_not_stay_behind_the_sold_out_flag_when_the_reopen_failed() {
    let app = spawn_app().await;
    let product = app.product(1).await;
    let message = app.message(product, 1);
    app.publish(&message).await;
    let order: i64 = eventually("the order", Duration::from_secs(20), || async {
        sqlx::query_scalar("SELECT id FROM orders WHERE product_id = $1")
            .bind(product)
            .fetch_optional(&app.db)
            .await
            .expect("order")
    })
    .await;

    // The product's one bucket as seckill-api loads it (the order holds the only unit), and
    // the flag a sweep raised when it found the bucket dry.
    let ledger = Ledger::new(app.ns.keys());
    let mut redis = app.ns.redis().await;
    let now = Utc::now().timestamp_millis();
    let window = Window {
        start_ms: now - 60_000,
        end_ms: now + 3_600_000,
        expire_at_ms: now + 7_200_000,
    };
    let held = HeldUnit {
        user_id: 1,
        request_id: message.request_id.to_string(),
        result: format!("success:{order}"),
    };
    let load = BucketLoad {
        units: 0,
        version: 0,
        window,
    };
    assert!(
        ledger
            .load_bucket(&mut redis, product, 0, &load, [held])
            .await
            .expect("load")
    );
    assert!(
        ledger
            .raise_sold_out(&mut redis, product, "", window.expire_at_ms)
            .await
            .expect("flag")
    );

    // From now on the product's state refuses every script (as while its node is down):
    // the unit goes back into its bucket, but the reopen that lowers the flag fails.
    let state = app.ns.keys().product_state(product);
    make_unusable(&mut redis, &state).await;
    let response = reqwest::Client::new()
        .post(format!("{}/api/orders/{order}/cancel", app.address))
        .send_as("order-service", 1, &[])
        .await
        .expect("cancel");
    assert_eq!(response.status(), 200);
    // Several failed retries, as during an outage of a few seconds.
    eventually(
        "the unit back and the reopen failed 6 times",
        Duration::from_secs(60),
        || async {
            let (remaining, attempts) = progress(&app, &mut app.ns.redis().await, product).await;
            (remaining == Some(1) && attempts >= 6).then_some(())
        },
    )
    .await;

    // The state answers again, its flag still up over the unit that is back: the next retry
    // must come within the flag's bound (500 ms; the deadline leaves room for a loaded machine).
    restore_hash(&mut redis, &state, &["sold_out", "1"]).await;
    eventually(
        "the sold-out flag lowered",
        Duration::from_secs(10),
        || async {
            let flag: Option<String> = redis::cmd("HGET")
                .arg(&state)
                .arg("sold_out")
                .query_async(&mut app.ns.redis().await)
                .await
                .expect("hget");
            flag.is_none().then_some(())
        },
    )
    .await;
    assert_eq!(progress(&app, &mut redis, product).await.0, Some(1));
    app.shutdown().await;
}
