//! Transient failures climb the retry tiers; past the cap they are dead letters with a reason.

use std::time::Duration;

use seckill_messaging::Topology;
use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};

fn quick_retries(settings: &mut order_service::Settings) {
    settings.retry_tiers = vec![Duration::from_millis(100), Duration::from_millis(200)];
    settings.max_attempts = 3;
    settings.lock_timeout = Duration::from_millis(150);
}

/// Holds the product's row lock in a transaction of its own until dropped or committed.
async fn lock_product(
    db: &sqlx::PgPool,
    product: i64,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM products WHERE id = $1 FOR UPDATE")
        .bind(product)
        .execute(&mut *tx)
        .await
        .expect("lock");
    tx
}

#[tokio::test]
async fn a_message_stuck_behind_a_lock_is_retried_and_then_dead_lettered_with_its_reason() {
    let mut app = spawn_app_with(TestNamespace::new(), quick_retries).await;
    let product = app.product(5).await;
    let lock = lock_product(&app.db, product).await;
    let msg = app.message(product, 7);
    app.publish(&msg).await;

    // Three lock timeouts later (first delivery + two tiers) it is a dead letter.
    // Parked with its reason and its three deliveries.
    let parked = app.wait_parked(1).await;
    drop(lock);
    let (event_id, code, status, attempts) = &parked[0];
    assert_eq!(event_id, &msg.request_id.to_string());
    assert_eq!(code, "retries_exhausted");
    assert_eq!(status, "pending");
    assert_eq!(*attempts, 3);
    let last_error: String =
        sqlx::query_scalar("SELECT last_error FROM dead_letters WHERE event_id = $1")
            .bind(event_id)
            .fetch_one(&app.db)
            .await
            .expect("last error");
    assert!(last_error.contains("lock"), "{last_error}");
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 0);
    app.shutdown().await;
}

#[tokio::test]
async fn a_lock_released_within_the_retries_ends_in_exactly_one_order() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        quick_retries(s);
        s.retry_tiers = vec![Duration::from_millis(300); 2];
        s.max_attempts = 10;
    })
    .await;
    let product = app.product(5).await;
    let lock = lock_product(&app.db, product).await;
    let msg = app.message(product, 8);
    app.publish(&msg).await;
    retried_then_ordered(&mut app, product, lock, 300, Duration::from_secs(10)).await;
    assert_eq!(app.stock_remaining(product).await, 4);
    app.shutdown().await;
}

/// A batch that fails for a moment is retried purchase by purchase: each part goes to the
/// retry tier as the single-order message it stands for (its own signature intact), and
/// each comes back as its order once the lock is gone.
#[tokio::test]
async fn a_batch_locked_out_is_retried_part_by_part_and_ends_in_one_order_each() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        quick_retries(s);
        s.retry_tiers = vec![Duration::from_millis(300); 2];
        s.max_attempts = 10;
    })
    .await;
    let product = app.product(5).await;
    let lock = lock_product(&app.db, product).await;
    let parts: Vec<_> = (1..=3)
        .map(|user| (app.message(product, user), None))
        .collect();
    app.publish_batch_to(None, &parts, &[]).await;
    let tier = app.ns.topology().retry_queue(300);
    eventually("three retries", Duration::from_secs(10), || async {
        (app.ns.queue_depth(&app.channel, &tier).await == 3).then_some(())
    })
    .await;
    drop(lock);
    eventually("three orders", Duration::from_secs(10), || async {
        (app.order_count(product).await == 3).then_some(())
    })
    .await;
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 3);
    assert_eq!(app.stock_remaining(product).await, 2);
    assert_eq!(app.dead_letters().await, 0);
    app.shutdown().await;
}

/// Waits until the purchase locked out of `product` has gone to the `tier_ms` retry tier
/// (within `within`), then releases the `lock`: it must end in exactly one order, no dead
/// letter.
async fn retried_then_ordered(
    app: &mut TestApp,
    product: i64,
    lock: sqlx::Transaction<'static, sqlx::Postgres>,
    tier_ms: u64,
    within: Duration,
) {
    let tier = app.ns.topology().retry_queue(tier_ms);
    eventually("a retry", within, || async {
        (app.ns.queue_depth(&app.channel, &tier).await > 0).then_some(())
    })
    .await;
    drop(lock);
    eventually("the order", Duration::from_secs(10), || async {
        (app.order_count(product).await == 1).then_some(())
    })
    .await;
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 1);
    assert_eq!(app.dead_letters().await, 0);
}

#[tokio::test]
async fn a_publisher_channel_closed_under_the_consumer_is_reopened_and_retries_resume() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        quick_retries(s);
        s.retry_tiers = vec![Duration::from_secs(1); 2];
        s.max_attempts = 10;
    })
    .await;
    let product = app.product(5).await;
    // Publishing a retry to a missing exchange is a channel error: the broker closes the
    // service's confirm channel, while its consuming channel stays up.
    app.topology_declared().await;
    let retry_exchange = app.ns.topology().retry_exchange;
    app.channel
        .exchange_delete(retry_exchange.as_str().into(), Default::default())
        .await
        .expect("delete the retry exchange");
    let lock = lock_product(&app.db, product).await;
    let msg = app.message(product, 9);
    app.publish(&msg).await;
    // Only a consumer that reconnects (declaring the exchange again) can retry it.
    retried_then_ordered(&mut app, product, lock, 1000, Duration::from_secs(15)).await;
    app.shutdown().await;
}

#[tokio::test]
async fn an_order_whose_result_cannot_be_written_is_retried_then_acked_not_requeued_forever() {
    // Redis is unreachable for this replica: every result write fails.
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.backend.redis_url = seckill_config::Secret::new("redis://127.0.0.1:1");
        s.retry_tiers = vec![Duration::from_millis(50)];
        s.max_attempts = 2;
        s.requeue_delay = Duration::from_millis(50);
    })
    .await;
    let product = app.product(5).await;
    app.publish(&app.message(product, 1)).await;
    eventually("the order", Duration::from_secs(20), || async {
        (app.order_count(product).await == 1).then_some(())
    })
    .await;
    // Retried through the tiers (each finding the order and failing the result again, after
    // the Redis pool's own connect attempts), then acked: the order stands. Before, it was
    // requeued without end.
    eventually("retries spent", Duration::from_secs(60), || async {
        let text = app.get_as(1, "/metrics").await.text().await.ok()?;
        text.lines()
            .any(|l| l.starts_with("orders_results_abandoned_total ") && !l.ends_with(" 0"))
            .then_some(())
    })
    .await;
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 1);
    app.shutdown().await;
}

#[tokio::test]
async fn a_retry_no_queue_takes_is_a_failed_publish_and_the_message_is_kept() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        quick_retries(s);
        s.retry_tiers = vec![Duration::from_millis(100)];
        s.max_attempts = 10;
    })
    .await;
    let product = app.product(5).await;
    // The tier's queue no longer takes what its exchange routes: a mandatory publish to it
    // comes back, confirmed as an ack with the message attached.
    app.topology_declared().await;
    let topology = app.ns.topology();
    let tier = topology.retry_queue(100);
    app.channel
        .queue_unbind(
            tier.as_str().into(),
            topology.retry_exchange.as_str().into(),
            Topology::retry_routing_key(100).as_str().into(),
            Default::default(),
        )
        .await
        .expect("unbind the retry tier");
    let lock = lock_product(&app.db, product).await;
    let msg = app.message(product, 3);
    app.publish(&msg).await;
    // Lock timeouts, retries returned: the original is requeued each time, never acked.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(app.order_count(product).await, 0);
    assert_eq!(app.dead_letters().await, 0);
    app.channel
        .queue_bind(
            tier.as_str().into(),
            topology.retry_exchange.as_str().into(),
            Topology::retry_routing_key(100).as_str().into(),
            Default::default(),
            Default::default(),
        )
        .await
        .expect("bind the retry tier again");
    drop(lock);
    eventually("the order", Duration::from_secs(10), || async {
        (app.order_count(product).await == 1).then_some(())
    })
    .await;
    app.stop_when_drained().await;
    assert_eq!(app.dead_letters().await, 0);
    app.shutdown().await;
}
