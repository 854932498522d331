//! A message refused for its signature holds nothing: parked, redriven or ignored, it never
//! takes, returns or locks a unit or a buyer, nor changes a genuine purchase under its
//! request id.

use std::time::Duration;

use serde_json::json;

use seckill_messaging::{OrderMessage, OrderSigner};
use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};
use crate::parking::{compensations_done, ids, redis_view, report, sold_in_redis};

/// Publishes `msg` signed with a key that is not the service's.
async fn publish_forged(app: &TestApp, msg: &OrderMessage) {
    let wrong = OrderSigner::new("not-the-key").sign(&serde_json::to_vec(msg).expect("json"));
    app.publish_signed_as(msg, Some(&wrong)).await;
}

async fn ledger_version(app: &TestApp, product: i64) -> i64 {
    sqlx::query_scalar("SELECT ledger_version FROM products WHERE id = $1")
        .bind(product)
        .fetch_one(&app.db)
        .await
        .expect("ledger version")
}

/// Every order of `product`: (buyer, status).
async fn orders_of(app: &TestApp, product: i64) -> Vec<(i64, String)> {
    sqlx::query_as("SELECT user_id, status FROM orders WHERE product_id = $1 ORDER BY id")
        .bind(product)
        .fetch_all(&app.db)
        .await
        .expect("orders")
}

#[tokio::test]
async fn ignoring_a_dead_letter_refused_for_its_signature_gives_up_nothing() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.compensation_poll = Duration::from_millis(50);
    })
    .await;
    // The last unit, sold in Redis to user 1, whose purchase is still on its way.
    let product = app.product(1).await;
    let genuine = app.message(product, 1);
    let request_id = genuine.request_id.to_string();
    sold_in_redis(&app, product, &[(1, request_id.clone())]).await;
    let version = ledger_version(&app, product).await;
    // A forger names user 5 (unsigned), and user 6 under the genuine purchase's request id
    // (signed with another key).
    let unsigned = app.message(product, 5);
    app.publish_signed_as(&unsigned, None).await;
    let mut copy = genuine.clone();
    copy.user_id = 6;
    publish_forged(&app, &copy).await;
    let mut forged = vec![unsigned.request_id.to_string(), request_id.clone()];
    forged.sort();
    let mut codes: Vec<String> = app.wait_parked(2).await.into_iter().map(|p| p.1).collect();
    codes.sort();
    assert_eq!(codes, ["bad_signature", "unsigned"]);

    // A redrive sends them back as they came: refused again, parked again.
    let redriven = report(&app, "redrive", json!({ "ids": forged })).await;
    assert_eq!(ids(&redriven), forged);
    let wait = Duration::from_secs(20);
    eventually("the forgeries refused again", wait, || async {
        let parked = app.parked().await;
        parked.iter().all(|p| p.2 == "pending").then_some(())
    })
    .await;

    // Ignored: marked and audited, and nothing else.
    let ignored = report(&app, "ignore", json!({ "ids": forged })).await;
    assert_eq!(ids(&ignored), forged);
    assert_eq!(ignored["compensated"], 0, "a forgery holds no unit");
    compensations_done(&app).await;
    let parked = app.parked().await;
    assert!(parked.iter().all(|p| p.2 == "ignored"), "{parked:?}");
    let mut audited: Vec<String> = sqlx::query_scalar(
        "SELECT unnest(event_ids) FROM dead_letter_audit WHERE action = 'ignore' AND NOT dry_run",
    )
    .fetch_all(&app.db)
    .await
    .expect("audit");
    audited.sort();
    assert_eq!(audited, forged);
    let compensations: i64 = sqlx::query_scalar("SELECT count(*) FROM compensations")
        .fetch_one(&app.db)
        .await
        .expect("compensations");
    assert_eq!(compensations, 0);
    let orders = orders_of(&app, product).await;
    assert!(orders.is_empty(), "no order in anyone's name: {orders:?}");
    assert_eq!(ledger_version(&app, product).await, version);

    // Redis offers no unit that never existed, and the named users are told nothing.
    let (remaining, marker, result, flag) = redis_view(&app, product, 5).await;
    assert_eq!(remaining, 0, "no phantom unit on sale");
    assert_eq!((marker, result), (None, None), "user 5 bought nothing");
    assert_eq!(flag.as_deref(), Some("1"), "still sold out");
    assert_eq!(redis_view(&app, product, 6).await.2, None, "nor did user 6");
    let buyer = redis_view(&app, product, 1).await;
    assert_eq!(buyer.1, Some(format!("h:{request_id}")));
    assert_eq!(buyer.2, Some(format!("queued:{request_id}")));

    // The genuine purchase lands: no tombstone took its request id.
    app.publish(&genuine).await;
    app.stop_when_drained().await;
    assert_eq!(orders_of(&app, product).await, [(1, "created".to_string())]);
    assert_eq!(app.stock_remaining(product).await, 0);
    assert_eq!(redis_view(&app, product, 1).await.0, 0);
    app.shutdown().await;
}
