//! A message refused for its signature holds nothing: parked, redriven or ignored, it never
//! takes, returns or locks a unit or a buyer, nor changes a genuine purchase under its
//! request id.

use std::time::Duration;

use serde_json::json;

use seckill_messaging::{OrderMessage, OrderSigner};
use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};
use crate::parking::{
    compensations_done, create_product_with_id, ids, redis_view, report, sold_in_redis,
};

/// A signature of `msg` made with a key that is not the service's.
fn wrong_signature(msg: &OrderMessage) -> String {
    OrderSigner::new("not-the-key").sign(&serde_json::to_vec(msg).expect("json"))
}

/// Publishes `msg` signed with a key that is not the service's.
async fn publish_forged(app: &TestApp, msg: &OrderMessage) {
    app.publish_signed_as(msg, Some(&wrong_signature(msg)))
        .await;
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

/// A product's last unit, sold in Redis to user 1, whose purchase is still on its way, on a
/// service that looks for compensations every 50 ms.
struct LastUnit {
    app: TestApp,
    product: i64,
    /// User 1's purchase, not yet published.
    genuine: OrderMessage,
    /// Its request id.
    request_id: String,
    /// The product's ledger version once the unit was sold.
    version: i64,
}

impl LastUnit {
    async fn on_its_way() -> Self {
        let app = spawn_app_with(TestNamespace::new(), |s| {
            s.compensation_poll = Duration::from_millis(50);
        })
        .await;
        let product = app.product(1).await;
        let genuine = app.message(product, 1);
        let request_id = genuine.request_id.to_string();
        sold_in_redis(&app, product, &[(1, request_id.clone())]).await;
        let version = ledger_version(&app, product).await;
        Self {
            app,
            product,
            genuine,
            request_id,
            version,
        }
    }
}

#[tokio::test]
async fn ignoring_a_dead_letter_refused_for_its_signature_gives_up_nothing() {
    let LastUnit {
        mut app,
        product,
        genuine,
        request_id,
        version,
    } = LastUnit::on_its_way().await;
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

/// A parked entry as the recorder left it: (buyer, product, reason, status, redrives,
/// signed, operator, body).
type Parked = (
    Option<i64>,
    Option<i64>,
    String,
    String,
    i32,
    bool,
    Option<String>,
    String,
);

async fn entry(app: &TestApp, event_id: &str) -> Option<Parked> {
    sqlx::query_as(
        "SELECT user_id, product_id, error_code, status, redrives, signature IS NOT NULL, \
                operator, convert_from(body, 'UTF8') \
         FROM dead_letters WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_optional(&app.db)
    .await
    .expect("entry")
}

/// `msg` as published, as an entry shows its body.
fn body(msg: &OrderMessage) -> String {
    serde_json::to_string(msg).expect("json")
}

/// Waits until the entry of `event_id` says `error_code`, and returns it.
async fn wait_for_reason(app: &TestApp, event_id: &str, error_code: &str) -> Parked {
    let wait = Duration::from_secs(20);
    eventually("the dead letter recorded", wait, || async {
        entry(app, event_id).await.filter(|e| e.2 == error_code)
    })
    .await
}

async fn last_attempt(app: &TestApp, event_id: &str) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT last_attempt FROM dead_letters WHERE event_id = $1")
        .bind(event_id)
        .fetch_one(&app.db)
        .await
        .expect("last attempt")
}

#[tokio::test]
async fn a_genuine_dead_letter_takes_over_the_entry_a_forgery_parked_first() {
    let mut app = spawn_app_with(TestNamespace::new(), |_| {}).await;
    // User 1 buys a product the database does not know yet: the purchase will be parked
    // (unknown_product). A forger who learnt its request id gets there first, for user 2
    // and another product.
    let product = app.product(5).await;
    let missing = 777_301;
    let genuine = app.message(missing, 1);
    let id = genuine.request_id.to_string();
    let mut forgery = genuine.clone();
    forgery.user_id = 2;
    forgery.product_id = product;
    app.publish_signed_as(&forgery, None).await;
    assert_eq!(app.wait_parked(1).await[0].1, "unsigned");
    // The operator redrives it (refused again), then ignores it.
    let redriven = report(&app, "redrive", json!({ "ids": [id] })).await;
    assert_eq!(ids(&redriven), [id.as_str()]);
    let wait = Duration::from_secs(20);
    eventually("the forgery refused again", wait, || async {
        let entry = entry(&app, &id).await.expect("parked");
        (entry.3 == "pending").then_some(())
    })
    .await;
    let ignored = report(&app, "ignore", json!({ "ids": [id] })).await;
    assert_eq!(ids(&ignored), [id.as_str()]);

    // The genuine dead letter arrives: the entry is the purchase's, as if it came first.
    app.publish(&genuine).await;
    let taken_over = wait_for_reason(&app, &id, "unknown_product").await;
    assert_eq!(
        taken_over,
        (
            Some(1),
            Some(missing),
            "unknown_product".to_string(),
            "pending".to_string(),
            0,
            true,
            None,
            body(&genuine)
        )
    );

    // Once the product exists, a redrive makes it user 1's order; user 2 bought nothing.
    create_product_with_id(&app, missing, 5).await;
    let redriven = report(&app, "redrive", json!({ "product_id": missing })).await;
    assert_eq!(ids(&redriven), [id]);
    app.stop_when_drained().await;
    assert_eq!(orders_of(&app, missing).await, [(1, "created".to_string())]);
    assert!(orders_of(&app, product).await.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn while_upgrading_an_unsigned_dead_letter_is_genuine_and_no_forgery_changes_it() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| s.accept_unsigned = true).await;
    let product = app.product(5).await;
    let missing = 777_302;
    // Two purchases from a seckill-api of before signing, of a product not known yet.
    let first = app.message(missing, 1);
    let second = app.message(missing, 3);
    let first_id = first.request_id.to_string();
    let second_id = second.request_id.to_string();

    // A forgery after the first one's dead letter changes nothing of it.
    app.publish_signed_as(&first, None).await;
    let parked = wait_for_reason(&app, &first_id, "unknown_product").await;
    let before = last_attempt(&app, &first_id).await;
    let mut copy = first.clone();
    copy.user_id = 2;
    copy.product_id = product;
    publish_forged(&app, &copy).await;
    let wait = Duration::from_secs(20);
    eventually("the forgery recorded", wait, || async {
        (last_attempt(&app, &first_id).await > before).then_some(())
    })
    .await;
    assert_eq!(entry(&app, &first_id).await, Some(parked));

    // A forgery before the second one's dead letter gives way to it.
    let mut copy = second.clone();
    copy.user_id = 4;
    copy.product_id = product;
    publish_forged(&app, &copy).await;
    wait_for_reason(&app, &second_id, "bad_signature").await;
    app.publish_signed_as(&second, None).await;
    let taken_over = wait_for_reason(&app, &second_id, "unknown_product").await;
    assert_eq!(
        taken_over,
        (
            Some(3),
            Some(missing),
            "unknown_product".to_string(),
            "pending".to_string(),
            0,
            false,
            None,
            body(&second)
        )
    );

    // Both become their buyers' orders once the product exists.
    create_product_with_id(&app, missing, 5).await;
    let redriven = report(&app, "redrive", json!({ "product_id": missing })).await;
    let mut both = vec![first_id, second_id];
    both.sort();
    assert_eq!(ids(&redriven), both);
    app.stop_when_drained().await;
    let buyers: Vec<i64> = orders_of(&app, missing)
        .await
        .into_iter()
        .map(|o| o.0)
        .collect();
    assert_eq!(buyers.len(), 2);
    assert!(buyers.contains(&1) && buyers.contains(&3), "{buyers:?}");
    assert!(orders_of(&app, product).await.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn an_unsigned_purchase_redriven_after_the_upgrade_stays_the_purchases_entry() {
    let app = spawn_app_with(TestNamespace::new(), |_| {}).await;
    // Parked before signing existed (no signature), and redriven once unsigned messages are
    // refused: it comes back as `unsigned`, with its own body.
    let missing = 777_303;
    let purchase = app.message(missing, 1);
    let id = purchase.request_id.to_string();
    sqlx::query(
        "INSERT INTO dead_letters (event_id, user_id, product_id, body, error_code, last_error, \
                                   attempts) \
         VALUES ($1, $2, $3, $4, 'unknown_product', 'no such product', 1)",
    )
    .bind(&id)
    .bind(purchase.user_id)
    .bind(missing)
    .bind(serde_json::to_vec(&purchase).expect("body"))
    .execute(&app.db)
    .await
    .expect("park");
    let redriven = report(&app, "redrive", json!({ "ids": [id] })).await;
    assert_eq!(ids(&redriven), [id.as_str()]);
    let wait = Duration::from_secs(20);
    let back = eventually("refused and recorded", wait, || async {
        entry(&app, &id).await.filter(|e| e.3 != "redriven")
    })
    .await;
    // Still the purchase (it holds its unit), and pending again: once unsigned messages are
    // accepted again, it can be redriven, or ignored with its unit given back.
    assert_eq!(
        back,
        (
            Some(1),
            Some(missing),
            "unknown_product".to_string(),
            "pending".to_string(),
            1,
            false,
            Some("admin:900".to_string()),
            body(&purchase)
        )
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_forgery_published_to_the_dead_letter_exchange_is_one_whatever_reason_it_claims() {
    let LastUnit {
        mut app,
        product,
        genuine,
        version,
        ..
    } = LastUnit::on_its_way().await;
    // Dead letters order-service never gave up, published straight to the dead-letter
    // exchange with reasons of purchases that hold a unit: user 5's unsigned, user 6's
    // signed with another key.
    let unsigned = app.message(product, 5);
    app.publish_dead_letter(&unsigned, None, "retries_exhausted")
        .await;
    let badly_signed = app.message(product, 6);
    app.publish_dead_letter(
        &badly_signed,
        Some(&wrong_signature(&badly_signed)),
        "rejected",
    )
    .await;
    let mut parked: Vec<(String, String)> = app
        .wait_parked(2)
        .await
        .into_iter()
        .map(|p| (p.0, p.1))
        .collect();
    parked.sort();
    let mut expected = vec![
        (unsigned.request_id.to_string(), "unsigned".to_string()),
        (
            badly_signed.request_id.to_string(),
            "bad_signature".to_string(),
        ),
    ];
    expected.sort();
    assert_eq!(parked, expected, "parked as forgeries, whatever they claim");

    // Ignored: marked, and nothing else.
    let forged: Vec<String> = expected.into_iter().map(|e| e.0).collect();
    let ignored = report(&app, "ignore", json!({ "ids": forged })).await;
    assert_eq!(ids(&ignored), forged);
    assert_eq!(ignored["compensated"], 0, "a forgery holds no unit");
    compensations_done(&app).await;
    let compensations: i64 = sqlx::query_scalar("SELECT count(*) FROM compensations")
        .fetch_one(&app.db)
        .await
        .expect("compensations");
    assert_eq!(compensations, 0);
    let orders = orders_of(&app, product).await;
    assert!(orders.is_empty(), "no order in anyone's name: {orders:?}");
    assert_eq!(ledger_version(&app, product).await, version);
    let (remaining, marker, result, flag) = redis_view(&app, product, 5).await;
    assert_eq!(remaining, 0, "no phantom unit on sale");
    assert_eq!((marker, result), (None, None), "user 5 bought nothing");
    assert_eq!(flag.as_deref(), Some("1"), "still sold out");
    assert_eq!(redis_view(&app, product, 6).await.2, None, "nor did user 6");

    // The genuine purchase lands.
    app.publish(&genuine).await;
    app.stop_when_drained().await;
    assert_eq!(orders_of(&app, product).await, [(1, "created".to_string())]);
    assert_eq!(app.stock_remaining(product).await, 0);
    app.shutdown().await;
}

#[tokio::test]
async fn a_forgery_published_to_the_dead_letter_exchange_never_changes_a_genuine_entry() {
    let mut app = spawn_app_with(TestNamespace::new(), |_| {}).await;
    // User 1's purchase of a product the database does not know yet: parked.
    let product = app.product(5).await;
    let missing = 777_304;
    let genuine = app.message(missing, 1);
    let id = genuine.request_id.to_string();
    app.publish(&genuine).await;
    let parked = wait_for_reason(&app, &id, "unknown_product").await;

    // Under its request id, a forger claims user 2's purchase of the product on sale ran out
    // of retries (signed with another key), then that it was rejected (unsigned).
    let mut copy = genuine.clone();
    copy.user_id = 2;
    copy.product_id = product;
    let forgeries = [
        (Some(wrong_signature(&copy)), "retries_exhausted"),
        (None, "rejected"),
    ];
    for (signature, claimed) in forgeries {
        let before = last_attempt(&app, &id).await;
        app.publish_dead_letter(&copy, signature.as_deref(), claimed)
            .await;
        let wait = Duration::from_secs(20);
        eventually("the forgery recorded", wait, || async {
            (last_attempt(&app, &id).await > before).then_some(())
        })
        .await;
        assert_eq!(
            entry(&app, &id).await.as_ref(),
            Some(&parked),
            "a forgery claiming {claimed} changed the purchase's entry"
        );
    }

    // Once the product exists, a redrive makes it user 1's order; user 2 bought nothing.
    create_product_with_id(&app, missing, 5).await;
    let redriven = report(&app, "redrive", json!({ "product_id": missing })).await;
    assert_eq!(ids(&redriven), [id]);
    app.stop_when_drained().await;
    assert_eq!(orders_of(&app, missing).await, [(1, "created".to_string())]);
    assert!(orders_of(&app, product).await.is_empty());
    app.shutdown().await;
}
