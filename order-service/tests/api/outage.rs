//! A database outage on the test's own Postgres: the breaker opens, the consumer pauses,
//! nothing is acked or dead-lettered because of the outage, and after recovery every
//! message becomes exactly one order.

use std::time::{Duration, Instant};

use serde_json::Value;

use seckill_testkit::{OwnPostgres, SendAs, TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};

/// How long the database stays down.
const OUTAGE: Duration = Duration::from_secs(20);
const BATCH: usize = 8;

async fn breaker_state(app: &TestApp) -> String {
    let body: Value = reqwest::Client::new()
        .get(format!("{}/admin/orders/breaker", app.address))
        .send_as("order-service", 1, &["admin"])
        .await
        .expect("get breaker")
        .json()
        .await
        .expect("json");
    body["state"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_opens_the_breaker_pauses_the_consumer_and_loses_nothing() {
    let postgres = OwnPostgres::start().await;
    let mut ns = TestNamespace::new();
    ns.database_url = postgres.url(&format!("seckill_{}", ns.namespace));
    let mut app = spawn_app_with(ns, |s| {
        s.batch_size = BATCH;
        s.breaker_window_size = 10;
        s.breaker_minimum_calls = 3;
        s.breaker_wait_open = Duration::from_secs(1);
        s.breaker_half_open_calls = 1;
        s.requeue_delay = Duration::from_millis(100);
    })
    .await;
    let product = app.product(2_000).await;
    let queue = app.ns.topology().queue;
    let dlq = app.ns.topology().dead_letter_queue;
    let retry_tiers: Vec<String> = app
        .ns
        .topology()
        .retry_tiers_ms
        .iter()
        .map(|&ms| app.ns.topology().retry_queue(ms))
        .collect();

    // Before: orders flow.
    let before: Vec<_> = (1..=200).map(|user| app.message(product, user)).collect();
    app.publish_many(&before).await;
    eventually(
        "orders before the outage",
        Duration::from_secs(20),
        || async { (app.order_count(product).await == 200).then_some(()) },
    )
    .await;

    // During: the database is gone while messages keep arriving.
    postgres.stop().await;
    let during: Vec<_> = (201..=500).map(|user| app.message(product, user)).collect();
    app.publish_many(&during).await;
    eventually("the breaker opens", Duration::from_secs(30), || async {
        matches!(breaker_state(&app).await.as_str(), "open" | "half_open").then_some(())
    })
    .await;
    let down_until = Instant::now() + OUTAGE;
    // Batches that were waiting on the database when it opened fail and hand their
    // messages back (unacked, so nothing is lost meanwhile); then the queue holds them all.
    eventually(
        "the in-flight batches hand back",
        Duration::from_secs(15),
        || async {
            let ready = app.ns.queue_depth(&app.channel, &queue).await as usize;
            (ready >= 300 - BATCH).then_some(())
        },
    )
    .await;
    while Instant::now() < down_until {
        // Paused: the messages wait in the queue (at most one trial batch out of it), and
        // nothing is dead-lettered or sent to a retry tier because of the outage.
        let ready = app.ns.queue_depth(&app.channel, &queue).await;
        assert!(
            ready as usize >= 300 - BATCH,
            "only {ready} of 300 still queued"
        );
        assert_eq!(app.ns.queue_depth(&app.channel, &dlq).await, 0);
        for tier in &retry_tiers {
            assert_eq!(app.ns.queue_depth(&app.channel, tier).await, 0, "{tier}");
        }
        assert_ne!(
            breaker_state(&app).await,
            "closed",
            "closed while the database is down"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // After: trial calls pass, the breaker closes, the backlog drains exactly once.
    postgres.restart().await;
    eventually(
        "every message is an order",
        Duration::from_secs(60),
        || async { (app.order_count(product).await == 500).then_some(()) },
    )
    .await;
    eventually("the breaker closes", Duration::from_secs(10), || async {
        (breaker_state(&app).await == "closed").then_some(())
    })
    .await;
    app.stop_when_drained().await;
    let (orders, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT request_id) FROM orders WHERE product_id = $1",
    )
    .bind(product)
    .fetch_one(&app.db)
    .await
    .expect("count");
    assert_eq!((orders, distinct), (500, 500));
    assert_eq!(app.stock_remaining(product).await, 1_500);
    assert_eq!(app.dead_letters().await, 0);
    app.shutdown().await;
}
