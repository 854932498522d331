//! Transient failures climb the retry tiers; past the cap they are dead letters with a reason.

use std::time::Duration;

use lapin::options::BasicGetOptions;
use lapin::types::AMQPValue;

use seckill_messaging::{HEADER_ATTEMPT, HEADER_ERROR_CODE};
use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::spawn_app_with;

fn quick_retries(settings: &mut order_service::Settings) {
    settings.retry_tiers_ms = "100,200".into();
    settings.max_attempts = 3;
    settings.lock_timeout_ms = 150;
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
    let dlq = app.ns.topology().dead_letter_queue;
    let dead = eventually("dead letter", Duration::from_secs(20), || async {
        app.channel
            .basic_get(dlq.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic_get")
    })
    .await;
    drop(lock);
    let headers = dead.delivery.properties.headers().clone().expect("headers");
    let code = headers
        .inner()
        .get(HEADER_ERROR_CODE)
        .and_then(|v| v.as_long_string());
    assert_eq!(
        code.map(|c| c.to_string()).as_deref(),
        Some("retries_exhausted")
    );
    assert!(matches!(
        headers.inner().get(HEADER_ATTEMPT),
        Some(AMQPValue::LongInt(2))
    ));
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 0);
    app.shutdown().await;
}

#[tokio::test]
async fn a_lock_released_within_the_retries_ends_in_exactly_one_order() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        quick_retries(s);
        s.retry_tiers_ms = "300,300".into();
        s.max_attempts = 10;
    })
    .await;
    let product = app.product(5).await;
    let lock = lock_product(&app.db, product).await;
    let msg = app.message(product, 8);
    app.publish(&msg).await;
    // Wait until it has gone to a retry tier at least once, then let it through.
    let tier = app.ns.topology().retry_queue(300);
    eventually("a retry", Duration::from_secs(10), || async {
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
    assert_eq!(app.stock_remaining(product).await, 4);
    let dlq = app.ns.topology().dead_letter_queue;
    assert_eq!(app.ns.queue_depth(&app.channel, &dlq).await, 0);
    app.shutdown().await;
}
