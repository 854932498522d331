//! Batched writes under redelivery storms, mixed batches and a crash mid-batch.

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use rand::seq::SliceRandom;

use seckill_testkit::eventually;

use crate::helpers::spawn_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivery_storm_writes_each_purchase_once_and_the_stock_exactly() {
    let mut app = spawn_app().await;
    let (a, b) = (app.product(500).await, app.product(500).await);
    // 300 distinct purchases over two products, each published five times, shuffled, so
    // copies of one purchase land in the same batch and in concurrent batches.
    let purchases: Vec<_> = (1..=300)
        .map(|user| app.message(if user % 3 == 0 { b } else { a }, user))
        .collect();
    let mut storm: Vec<_> = purchases.iter().flat_map(|m| vec![m.clone(); 5]).collect();
    storm.shuffle(&mut rand::rng());
    let (first, second) = storm.split_at(storm.len() / 2);
    tokio::join!(app.publish_many(first), app.publish_many(second));
    app.stop_when_drained().await;

    let (orders, distinct): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT request_id) FROM orders")
            .fetch_one(&app.db)
            .await
            .expect("count");
    assert_eq!((orders, distinct), (300, 300));
    let on_b = purchases.iter().filter(|m| m.product_id == b).count() as i32;
    assert_eq!(app.stock_remaining(a).await, 500 - (300 - on_b));
    assert_eq!(app.stock_remaining(b).await, 500 - on_b);
    app.shutdown().await;
}

#[tokio::test]
async fn one_bad_message_in_a_batch_does_not_hold_back_the_others() {
    let mut app = spawn_app().await;
    let product = app.product(3).await;
    // Four purchases for three units and one for a product that does not exist, in one
    // burst (one batch): the batch falls back to one-by-one and each gets its own outcome.
    let mut msgs: Vec<_> = (1..=4).map(|user| app.message(product, user)).collect();
    msgs.push(app.message(product + 1000, 5));
    app.publish_many(&msgs).await;
    let mut reasons: Vec<String> = app.wait_parked(2).await.into_iter().map(|p| p.1).collect();
    reasons.sort();
    assert_eq!(reasons, ["out_of_stock", "unknown_product"]);
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 3);
    assert_eq!(app.stock_remaining(product).await, 0);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_mid_batch_redelivers_and_loses_or_duplicates_nothing() {
    let mut app = spawn_app().await;
    let product = app.product(5_000).await;
    // The in-process consumer steps aside; a real process will be killed mid-stream.
    let ns = app.ns.clone();
    let channel = app.channel.clone();
    let db = app.db.clone();
    let msgs: Vec<_> = (1..=3_000).map(|user| app.message(product, user)).collect();
    app.stop_consuming().await;
    app.publish_many(&msgs).await;

    let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"))
        .env("SECKILL_HOST", "127.0.0.1")
        .env("SECKILL_ORDER_PORT", "0")
        .env("SECKILL_DATABASE_URL", &ns.database_url)
        .env("SECKILL_REDIS_URL", &ns.redis_url)
        .env("SECKILL_REDIS_CLUSTER", ns.redis_cluster.to_string())
        .env("SECKILL_AMQP_URL", &ns.amqp_url)
        .env("SECKILL_NAMESPACE", &ns.namespace)
        .env("SECKILL_INTERNAL_KEY", seckill_testkit::INTERNAL_KEY)
        // The order signing key stays the public default the in-process services use.
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .env("SECKILL_LOG_FILTER", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the order-service binary");
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM orders WHERE product_id = $1")
            .bind(product)
            .fetch_one(&db)
            .await
            .expect("count")
    };
    // Kill it while it is writing: some orders exist, most do not.
    eventually(
        "the process is writing orders",
        Duration::from_secs(30),
        || async {
            let written = count().await;
            (written > 0).then_some(written)
        },
    )
    .await;
    process.start_kill().expect("SIGKILL");
    let status = process.wait().await.expect("wait");
    let at_kill = count().await;
    assert!(!status.success(), "killed, not exited: {status}");
    assert!(
        at_kill < 3_000,
        "killed too late to prove anything ({at_kill} written)"
    );

    // Its unacked deliveries go back to the queue when the broker sees its connection
    // gone. Killed near the end, they may be all that is left: a fresh consumer started
    // before that would find the queue empty and stop at once.
    let queue = ns.topology().queue;
    eventually(
        "the broker dropped the killed consumer",
        Duration::from_secs(30),
        || async { (ns.queue_consumers(&channel, &queue).await == 0).then_some(()) },
    )
    .await;
    // A fresh consumer finishes the job.
    let mut again = crate::helpers::spawn_app_in(ns.clone()).await;
    again.stop_when_drained().await;
    let (orders, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT request_id) FROM orders WHERE product_id = $1",
    )
    .bind(product)
    .fetch_one(&db)
    .await
    .expect("count");
    assert_eq!(
        (orders, distinct),
        (3_000, 3_000),
        "{at_kill} written at the kill"
    );
    assert_eq!(again.stock_remaining(product).await, 2_000);
    let wanted: HashSet<_> = msgs.iter().map(|m| m.request_id).collect();
    let written: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT request_id FROM orders WHERE product_id = $1")
            .bind(product)
            .fetch_all(&db)
            .await
            .expect("ids");
    assert_eq!(written.into_iter().collect::<HashSet<_>>(), wanted);
    drop(channel);
    again.shutdown().await;
}
