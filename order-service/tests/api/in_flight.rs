//! What order-service tells seckill-api's fence of the purchases it has in hand or passed on
//! (`order_service::in_flight`).

use std::time::Duration;

use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::{spawn_app, spawn_app_with};

/// Transit notes of `product`: request ids.
async fn noted(app: &crate::helpers::TestApp, product: i64) -> Vec<uuid::Uuid> {
    sqlx::query_scalar("SELECT request_id FROM order_transit WHERE product_id = $1")
        .bind(product)
        .fetch_all(&app.db)
        .await
        .expect("transit notes")
}

#[tokio::test]
async fn a_dead_letter_that_cannot_reach_the_parking_lot_stays_noted_in_transit() {
    let app = spawn_app().await;
    // The dead-letter queue no longer takes what the dead-letter exchange routes: the copy
    // is refused, the original is rejected into the exchange and kept by its quorum queue
    // until a target confirms it — in flight, with no dead letter in Postgres.
    app.topology_declared().await;
    let topology = app.ns.topology();
    app.channel
        .queue_unbind(
            topology.dead_letter_queue.as_str().into(),
            topology.dead_letter_exchange.as_str().into(),
            "".into(),
            Default::default(),
        )
        .await
        .expect("unbind the dead-letter queue");
    let genuine = app.message(987_001, 5);
    app.publish(&genuine).await;
    // A forgery names a product too, but holds nothing: never noted.
    let forged = app.message(987_002, 6);
    app.publish_signed_as(&forged, None).await;
    eventually(
        "the genuine purchase noted",
        Duration::from_secs(20),
        || async { (noted(&app, 987_001).await == [genuine.request_id]).then_some(()) },
    )
    .await;
    // Both went through the consumer once its report names neither product any more.
    eventually(
        "both deliveries settled",
        Duration::from_secs(20),
        || async {
            let held: Vec<Vec<i64>> = sqlx::query_scalar("SELECT products FROM order_holders")
                .fetch_all(&app.db)
                .await
                .expect("reports");
            (held == [Vec::<i64>::new()]).then_some(())
        },
    )
    .await;
    assert_eq!(app.dead_letters().await, 0);
    assert!(noted(&app, 987_002).await.is_empty(), "a forgery was noted");
    app.shutdown().await;
}

#[tokio::test]
async fn each_consuming_connection_reports_what_it_holds_and_removes_its_report_on_stop() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.lock_timeout = Duration::from_secs(5);
    })
    .await;
    let product = app.product(5).await;
    // A purchase waits on the product's row lock in the consumer's hands.
    let mut lock = app.db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM products WHERE id = $1 FOR UPDATE")
        .bind(product)
        .execute(&mut *lock)
        .await
        .expect("lock the product");
    app.publish(&app.message(product, 1)).await;
    let reports = |app: &crate::helpers::TestApp| {
        let db = app.db.clone();
        async move {
            sqlx::query_as::<_, (Vec<i64>, bool)>(
                "SELECT products, as_of > clock_timestamp() - interval '2 seconds' \
                 FROM order_holders",
            )
            .fetch_all(&db)
            .await
            .expect("reports")
        }
    };
    eventually(
        "the held product reported",
        Duration::from_secs(10),
        || async { (reports(&app).await == [(vec![product], true)]).then_some(()) },
    )
    .await;
    lock.rollback().await.expect("unlock");
    eventually("the order written", Duration::from_secs(20), || async {
        (app.order_count(product).await == 1).then_some(())
    })
    .await;
    eventually("the purchase released", Duration::from_secs(10), || async {
        (reports(&app).await == [(vec![], true)]).then_some(())
    })
    .await;
    assert_eq!(app.order_count(product).await, 1);
    app.stop_when_drained().await;
    assert!(
        reports(&app).await.is_empty(),
        "a stopped connection left its report"
    );
    app.shutdown().await;
}
