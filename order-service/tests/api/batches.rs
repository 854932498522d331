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

/// Group commit: one message carrying several purchases is one delivery, and each of its
/// purchases becomes its order as if it had come alone.
#[tokio::test]
async fn a_batch_message_becomes_one_order_per_purchase() {
    let mut app = spawn_app().await;
    let product = app.product(10).await;
    let parts: Vec<_> = (1..=5)
        .map(|user| (app.message(product, user), None))
        .collect();
    app.publish_batch_to(None, &parts, &[]).await;
    let orders = eventually("five orders", Duration::from_secs(20), || async {
        let count = app.order_count(product).await;
        (count == 5).then_some(count)
    })
    .await;
    app.stop_when_drained().await;
    assert_eq!(orders, 5);
    assert_eq!(app.stock_remaining(product).await, 5);
    for user in 1..=5 {
        let result = app.stored_result(product, user).await.unwrap_or_default();
        assert!(result.starts_with("success:"), "user {user}: {result:?}");
    }
    let written: Vec<uuid::Uuid> =
        sqlx::query_scalar("SELECT request_id FROM orders WHERE product_id = $1 ORDER BY user_id")
            .bind(product)
            .fetch_all(&app.db)
            .await
            .expect("orders");
    let sent: Vec<uuid::Uuid> = parts.iter().map(|(m, _)| m.request_id).collect();
    assert_eq!(written, sent);
    assert!(app.parked().await.is_empty());
    app.shutdown().await;
}

/// A batch's purchases fail alone: a forged part, one the database refuses and one of an
/// unknown product are each dead-lettered as their own message — with their own body and
/// signature, so each can be redriven or ignored by itself — and their neighbours become
/// orders.
#[tokio::test]
async fn a_part_that_fails_is_dead_lettered_alone_and_its_neighbours_are_written() {
    let mut app = spawn_app().await;
    let product = app.product(3).await;
    let genuine: Vec<_> = (1..=3).map(|user| app.message(product, user)).collect();
    let forged = app.message(product, 4);
    let forged_signature = seckill_messaging::OrderSigner::new("not-the-key")
        .sign(&serde_json::to_vec(&forged).expect("json"));
    let fourth_unit = app.message(product, 5);
    let unknown = app.message(product + 1000, 6);
    let mut parts: Vec<_> = genuine.iter().map(|m| (m.clone(), None)).collect();
    parts.insert(1, (forged.clone(), Some(forged_signature.clone())));
    parts.push((fourth_unit.clone(), None));
    parts.push((unknown.clone(), None));
    app.publish_batch_to(None, &parts, &[]).await;

    let mut parked: Vec<(String, String)> = app
        .wait_parked(3)
        .await
        .into_iter()
        .map(|(event, code, _, _)| (event, code))
        .collect();
    parked.sort();
    let mut expected = vec![
        (forged.request_id.to_string(), "bad_signature".to_string()),
        (
            fourth_unit.request_id.to_string(),
            "out_of_stock".to_string(),
        ),
        (
            unknown.request_id.to_string(),
            "unknown_product".to_string(),
        ),
    ];
    expected.sort();
    assert_eq!(parked, expected);
    app.stop_when_drained().await;
    assert_eq!(app.order_count(product).await, 3);
    assert_eq!(app.stock_remaining(product).await, 0);
    // Each dead letter is the single-order message it stood for in the batch.
    let stored: Vec<(String, Vec<u8>, Option<String>)> =
        sqlx::query_as("SELECT event_id, body, signature FROM dead_letters ORDER BY event_id")
            .fetch_all(&app.db)
            .await
            .expect("dead letters");
    for (event, body, signature) in stored {
        let msg: seckill_messaging::OrderMessage =
            serde_json::from_slice(&body).expect("a single order's body");
        assert_eq!(msg.request_id.to_string(), event);
        if event == forged.request_id.to_string() {
            assert_eq!(signature.as_deref(), Some(forged_signature.as_str()));
        } else {
            assert!(
                app.signer.verify(&body, signature.as_deref()).is_ok(),
                "{event}: its own signature"
            );
        }
    }
    app.shutdown().await;
}

/// A batch the broker dead-letters whole (its delivery limit reached) is parked purchase by
/// purchase, each under its own request id and signature check.
#[tokio::test]
async fn a_batch_dead_lettered_whole_is_parked_one_entry_per_purchase() {
    let app = spawn_app().await;
    let product = app.product(5).await;
    let parts: Vec<_> = (1..=3)
        .map(|user| (app.message(product, user), None))
        .collect();
    let dlx = app.ns.topology().dead_letter_exchange;
    app.publish_batch_to(Some(&dlx), &parts, &[]).await;
    let mut parked: Vec<String> = app
        .wait_parked(3)
        .await
        .into_iter()
        .map(|(event, code, status, _)| {
            assert_eq!((code.as_str(), status.as_str()), ("rejected", "pending"));
            event
        })
        .collect();
    parked.sort();
    let mut sent: Vec<String> = parts
        .iter()
        .map(|(m, _)| m.request_id.to_string())
        .collect();
    sent.sort();
    assert_eq!(parked, sent);
    app.shutdown().await;
}
