//! The parking lot: dead letters recorded in Postgres, redriven once the cause is fixed
//! (dry run, idempotent, audited), quarantined when they keep failing, ignored with their
//! unit put back on sale.

use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use serde_json::{Value, json};

use seckill_messaging::OrderMessage;
use seckill_testkit::{SendAs, TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};

const ADMIN: i64 = 900;

async fn admin_post(app: &TestApp, path: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/admin/dlq/{path}", app.address))
        .json(&body)
        .send_as("order-service", ADMIN, &["admin"])
        .await
        .expect("admin request")
}

pub(crate) async fn report(app: &TestApp, path: &str, body: Value) -> Value {
    let response = admin_post(app, path, body).await;
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.expect("json")
}

pub(crate) fn ids(report: &Value) -> Vec<String> {
    let mut ids: Vec<String> = report["event_ids"]
        .as_array()
        .expect("event ids")
        .iter()
        .map(|v| v.as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

/// Inserts a product with a chosen id (the "fix": the catalogue was missing it).
pub(crate) async fn create_product_with_id(app: &TestApp, id: i64, stock: i32) {
    let now = Utc::now();
    sqlx::query(
        "INSERT INTO products (id, name, price_cents, stock_total, stock_remaining, start_at, end_at) \
         VALUES ($1, 'late', 500, $2, $2, $3, $4)",
    )
    .bind(id)
    .bind(stock)
    .bind(now - ChronoDuration::minutes(1))
    .bind(now + ChronoDuration::hours(1))
    .execute(&app.db)
    .await
    .expect("insert product");
}

async fn statuses(app: &TestApp) -> Vec<String> {
    app.parked().await.into_iter().map(|p| p.2).collect()
}

#[tokio::test]
async fn poison_messages_are_parked_and_after_the_fix_a_redrive_makes_each_one_order() {
    let mut app = spawn_app_with(TestNamespace::new(), |_| {}).await;
    // Purchases of a product the database does not know (yet): permanent failures.
    let missing = 777_001;
    let msgs: Vec<_> = (1..=20).map(|user| app.message(missing, user)).collect();
    app.publish_many(&msgs).await;
    let parked = app.wait_parked(20).await;
    assert!(
        parked
            .iter()
            .all(|p| p.1 == "unknown_product" && p.2 == "pending")
    );
    let mut expected: Vec<String> = msgs.iter().map(|m| m.request_id.to_string()).collect();
    expected.sort();

    // Operators only, and never "everything" by accident.
    let as_user = reqwest::Client::new()
        .post(format!("{}/admin/dlq/redrive", app.address))
        .json(&json!({ "product_id": missing }))
        .send_as("order-service", 5, &[])
        .await
        .expect("request");
    assert_eq!(as_user.status(), 403);
    let unbounded = admin_post(&app, "redrive", json!({})).await;
    assert_eq!(unbounded.status(), 400);
    let body: Value = unbounded.json().await.expect("json");
    assert_eq!(body["code"], "invalid_request");
    let typo = admin_post(&app, "redrive", json!({ "product": missing })).await;
    assert_eq!(typo.status(), 400, "unknown fields are refused");
    for (path, body) in [
        ("ignore", json!({ "ids": ["a\u{0}b"] })),
        (
            "redrive",
            json!({ "from": "2026-01-02T00:00:00Z", "to": "2026-01-01T00:00:00Z" }),
        ),
    ] {
        let refused = admin_post(&app, path, body).await;
        assert_eq!(refused.status(), 400, "{path}");
        let body: Value = refused.json().await.expect("json");
        assert_eq!(body["code"], "invalid_request");
    }

    // A dry run names them all and changes nothing.
    let dry = report(
        &app,
        "redrive",
        json!({ "product_id": missing, "dry_run": true }),
    )
    .await;
    assert_eq!(ids(&dry), expected);
    assert_eq!(dry["dry_run"], true);
    assert!(statuses(&app).await.iter().all(|s| s == "pending"));

    // Fix the cause, then redrive: every purchase becomes exactly one order.
    create_product_with_id(&app, missing, 20).await;
    let done = report(&app, "redrive", json!({ "product_id": missing })).await;
    assert_eq!(ids(&done), expected);
    eventually("redriven orders", Duration::from_secs(20), || async {
        (app.order_count(missing).await == 20).then_some(())
    })
    .await;
    assert!(statuses(&app).await.iter().all(|s| s == "redriven"));

    // A second redrive of the same entries does nothing.
    let again = report(&app, "redrive", json!({ "product_id": missing })).await;
    assert!(ids(&again).is_empty());
    app.stop_when_drained().await;
    let (orders, distinct): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(DISTINCT request_id) FROM orders WHERE product_id = $1",
    )
    .bind(missing)
    .fetch_one(&app.db)
    .await
    .expect("count");
    assert_eq!((orders, distinct), (20, 20));
    assert_eq!(app.stock_remaining(missing).await, 0);

    // Every action is in the audit trail, dry run included, with its operator.
    let audit: Vec<(String, String, bool, i32)> = sqlx::query_as(
        "SELECT operator, action, dry_run, cardinality(event_ids) FROM dead_letter_audit ORDER BY id",
    )
    .fetch_all(&app.db)
    .await
    .expect("audit");
    let operator = format!("admin:{ADMIN}");
    assert_eq!(
        audit,
        vec![
            (operator.clone(), "redrive".into(), true, 20),
            (operator.clone(), "redrive".into(), false, 20),
            (operator, "redrive".into(), false, 0),
        ]
    );
    app.shutdown().await;
}

#[tokio::test]
async fn an_entry_failing_again_after_its_redrives_is_quarantined_until_cleared() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.quarantine_after_redrives = 1;
    })
    .await;
    let missing = 777_002;
    let msg = app.message(missing, 3);
    app.publish(&msg).await;
    app.wait_parked(1).await;
    let id = msg.request_id.to_string();

    // Redriven through the CLI without fixing anything: it fails again and is quarantined.
    let ns = &app.ns;
    let cli = |args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"));
        command
            .args(args)
            .env("SECKILL_DATABASE_URL", &ns.database_url)
            .env("SECKILL_AMQP_URL", &ns.amqp_url)
            .env("SECKILL_REDIS_URL", &ns.redis_url)
            .env("SECKILL_REDIS_CLUSTER", ns.redis_cluster.to_string())
            .env("SECKILL_NAMESPACE", &ns.namespace);
        command
    };
    let output = cli(&[
        "dead-letters",
        "redrive",
        "--id",
        &id,
        "--operator",
        "alice",
    ])
    .output()
    .await
    .expect("run the CLI");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).expect("json report");
    assert_eq!(printed["event_ids"], json!([id]));
    eventually("quarantined", Duration::from_secs(20), || async {
        (statuses(&app).await == ["quarantined"]).then_some(())
    })
    .await;

    // No redrive while quarantined; an operator clears it, fixes the cause, redrives.
    let refused = report(&app, "redrive", json!({ "ids": [id] })).await;
    assert!(ids(&refused).is_empty());
    let cleared = report(&app, "clear", json!({ "ids": [id] })).await;
    assert_eq!(ids(&cleared), vec![id.clone()]);
    assert_eq!(statuses(&app).await, ["pending"]);
    create_product_with_id(&app, missing, 1).await;
    let output = cli(&["dead-letters", "redrive", "--product", &missing.to_string()])
        .output()
        .await
        .expect("run the CLI");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    eventually("the order", Duration::from_secs(20), || async {
        (app.order_count(missing).await == 1).then_some(())
    })
    .await;
    let listed = cli(&["dead-letters", "list", "--status", "redriven"])
        .output()
        .await
        .expect("run the CLI");
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("json list");
    assert_eq!(listed[0]["event_id"], id.as_str());
    assert_eq!(
        listed[0]["operator"]
            .as_str()
            .map(|o| o.starts_with("cli:")),
        Some(true)
    );
    let audit: Vec<String> =
        sqlx::query_scalar("SELECT operator || ':' || action FROM dead_letter_audit ORDER BY id")
            .fetch_all(&app.db)
            .await
            .expect("audit");
    assert_eq!(audit[0], "alice:redrive");
    assert_eq!(audit.len(), 4, "{audit:?}");
    app.stop_when_drained().await;
    app.shutdown().await;
}

/// Redis as seckill-api leaves it after selling a product's last units: the bucket dry,
/// each buyer's marker and `queued` result in place, the sold-out flag up.
pub(crate) async fn sold_in_redis(app: &TestApp, product: i64, buyers: &[(i64, String)]) {
    let keys = app.ns.keys();
    let mut redis = app.ns.redis().await;
    let expire_at = (Utc::now() + ChronoDuration::hours(2)).timestamp_millis();
    let _: () = redis::cmd("HSET")
        .arg(keys.stock(product, 0))
        .arg("remaining")
        .arg(0)
        .arg("expire_at")
        .arg(expire_at)
        .query_async(&mut redis)
        .await
        .expect("stock");
    for (user, request_id) in buyers {
        let _: () = redis::cmd("HSET")
            .arg(keys.buyers(product, 0))
            .arg(user)
            .arg(format!("h:{request_id}"))
            .query_async(&mut redis)
            .await
            .expect("marker");
        let _: () = redis::cmd("HSET")
            .arg(keys.results(product, 0))
            .arg(user)
            .arg(format!("queued:{request_id}"))
            .query_async(&mut redis)
            .await
            .expect("result");
    }
    let _: () = redis::cmd("HSET")
        .arg(keys.product_state(product))
        .arg("sold_out")
        .arg("1")
        .arg("gen")
        .arg("5")
        .query_async(&mut redis)
        .await
        .expect("state");
}

/// (remaining in the bucket, the user's marker, the user's result, sold-out flag)
pub(crate) async fn redis_view(
    app: &TestApp,
    product: i64,
    user: i64,
) -> (i64, Option<String>, Option<String>, Option<String>) {
    let keys = app.ns.keys();
    let mut redis = app.ns.redis().await;
    let remaining: i64 = redis::cmd("HGET")
        .arg(keys.stock(product, 0))
        .arg("remaining")
        .query_async(&mut redis)
        .await
        .expect("remaining");
    let marker = redis::cmd("HGET")
        .arg(keys.buyers(product, 0))
        .arg(user)
        .query_async(&mut redis)
        .await
        .expect("marker");
    let result = redis::cmd("HGET")
        .arg(keys.results(product, 0))
        .arg(user)
        .query_async(&mut redis)
        .await
        .expect("result");
    let flag = redis::cmd("HGET")
        .arg(keys.product_state(product))
        .arg("sold_out")
        .query_async(&mut redis)
        .await
        .expect("flag");
    (remaining, marker, result, flag)
}

/// Waits until every compensation is relayed.
pub(crate) async fn compensations_done(app: &TestApp) {
    eventually("compensations relayed", Duration::from_secs(10), || async {
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM compensations WHERE done_at IS NULL")
                .fetch_one(&app.db)
                .await
                .expect("count");
        (pending == 0).then_some(())
    })
    .await;
}

/// Parks `purchase` as out of retries, then an operator ignores it: its unit is returned
/// (the compensation relayed).
async fn parked_then_ignored(app: &TestApp, purchase: &OrderMessage) {
    sqlx::query(
        "INSERT INTO dead_letters (event_id, user_id, product_id, body, error_code, last_error, \
                                   attempts) \
         VALUES ($1, $2, $3, $4, 'retries_exhausted', 'lock timeout', 5)",
    )
    .bind(purchase.request_id.to_string())
    .bind(purchase.user_id)
    .bind(purchase.product_id)
    .bind(serde_json::to_vec(purchase).expect("body"))
    .execute(&app.db)
    .await
    .expect("park");
    let ignored = report(
        app,
        "ignore",
        json!({ "ids": [purchase.request_id.to_string()] }),
    )
    .await;
    assert_eq!(ignored["compensated"], 1);
    compensations_done(app).await;
}

/// (live orders, cancelled orders) of `product`.
async fn orders_by_state(app: &TestApp, product: i64) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status <> 'cancelled'), \
                count(*) FILTER (WHERE status = 'cancelled') \
         FROM orders WHERE product_id = $1",
    )
    .bind(product)
    .fetch_one(&app.db)
    .await
    .expect("orders")
}

#[tokio::test]
async fn ignoring_an_out_of_stock_dead_letter_releases_its_buyer_without_a_phantom_unit() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.compensation_poll = Duration::from_millis(50);
    })
    .await;
    // Redis sold two units, the database holds one: the second purchase is a dead letter.
    let product = app.product(1).await;
    let first = app.message(product, 1);
    app.publish(&first).await;
    eventually("the first order", Duration::from_secs(20), || async {
        (app.order_count(product).await == 1).then_some(())
    })
    .await;
    let second = app.message(product, 2);
    sold_in_redis(
        &app,
        product,
        &[
            (1, first.request_id.to_string()),
            (2, second.request_id.to_string()),
        ],
    )
    .await;
    app.publish(&second).await;
    let parked = app.wait_parked(1).await;
    assert_eq!(parked[0].1, "out_of_stock");

    let dry = report(
        &app,
        "ignore",
        json!({ "ids": [parked[0].0], "dry_run": true }),
    )
    .await;
    assert_eq!(dry["compensated"], 0);
    assert_eq!(
        orders_by_state(&app, product).await,
        (1, 0),
        "a dry run writes nothing"
    );

    let ignored = report(&app, &format!("{}/ignore", parked[0].0), json!({})).await;
    assert_eq!(ids(&ignored), [second.request_id.to_string()]);
    assert_eq!(ignored["compensated"], 1);
    compensations_done(&app).await;
    // The unit it took in Redis never existed in the database: it stays gone. The buyer is
    // released and told why.
    let view = redis_view(&app, product, 2).await;
    assert_eq!(view.0, 0, "no phantom unit goes back on sale");
    assert_eq!(view.1, None, "the buyer may buy again");
    assert_eq!(view.2.as_deref(), Some("failed:out_of_stock"));
    assert_eq!(view.3.as_deref(), Some("1"), "still sold out");
    assert_eq!(statuses(&app).await, ["ignored"]);

    // Ignoring again does nothing; a relay that ran again (a crash before it recorded its
    // success) changes nothing either.
    let again = report(&app, "ignore", json!({ "ids": [parked[0].0] })).await;
    assert!(ids(&again).is_empty());
    sqlx::query("UPDATE compensations SET done_at = NULL")
        .execute(&app.db)
        .await
        .expect("replay");
    compensations_done(&app).await;
    assert_eq!(redis_view(&app, product, 2).await.0, 0);
    // A late copy of the given-up purchase is a no-op, not a second dead letter.
    app.publish(&second).await;
    app.stop_when_drained().await;
    assert_eq!(orders_by_state(&app, product).await, (1, 1));
    assert_eq!(app.parked().await.len(), 1);
    assert_eq!(app.stock_remaining(product).await, 0);
    // The first buyer's order stands.
    assert_eq!(
        redis_view(&app, product, 1).await.1,
        Some(format!("h:{}", first.request_id))
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_copy_arriving_after_its_dead_letter_was_ignored_does_not_resell_the_returned_unit() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.compensation_poll = Duration::from_millis(50);
    })
    .await;
    // One unit, sold in Redis to user 7, whose purchase ran out of retries (its copy is
    // parked) while another copy still waits in a retry tier.
    let product = app.product(1).await;
    let purchase = app.message(product, 7);
    sold_in_redis(&app, product, &[(7, purchase.request_id.to_string())]).await;
    parked_then_ignored(&app, &purchase).await;
    let view = redis_view(&app, product, 7).await;
    assert_eq!(view.0, 1, "the unit is back on sale");
    assert_eq!(view.2.as_deref(), Some("failed:retries_exhausted"));
    assert_eq!(
        orders_by_state(&app, product).await,
        (0, 1),
        "given up for good"
    );

    // The copy from the retry tier arrives: it must not become an order, or the database
    // would sell the unit Redis is offering again.
    app.publish(&purchase).await;
    app.stop_when_drained().await;
    assert_eq!(orders_by_state(&app, product).await, (0, 1));
    assert_eq!(app.stock_remaining(product).await, 1);
    let view = redis_view(&app, product, 7).await;
    assert_eq!(
        view.2.as_deref(),
        Some("failed:retries_exhausted"),
        "not overwritten"
    );
    assert_eq!(app.parked().await.len(), 1, "and not a new dead letter");
    app.shutdown().await;
}

#[tokio::test]
async fn a_given_up_purchase_whose_sweep_never_closed_releases_its_buyer() {
    let mut app = spawn_app_with(TestNamespace::new(), |s| {
        s.compensation_poll = Duration::from_millis(50);
    })
    .await;
    // User 8 bought the last unit through a sweep whose close answer was lost: the home
    // bucket still holds the sweep's reservation (which names the purchase it was for), not
    // the marker the close would have written.
    let product = app.product(1).await;
    let purchase = app.message(product, 8);
    sold_in_redis(&app, product, &[(8, purchase.request_id.to_string())]).await;
    let mut redis = app.ns.redis().await;
    let _: () = redis::cmd("HSET")
        .arg(app.ns.keys().buyers(product, 0))
        .arg(8)
        .arg(format!(
            "r:{}:{}",
            Utc::now().timestamp_millis() - 60_000,
            purchase.request_id
        ))
        .query_async(&mut redis)
        .await
        .expect("reservation");
    parked_then_ignored(&app, &purchase).await;
    let (remaining, marker, result, _) = redis_view(&app, product, 8).await;
    assert_eq!(remaining, 1, "the unit is back on sale");
    // Left in place, the reservation would later resolve (through the sweep's takers
    // entry) into "holds a unit": 409 for good, over an order that never was.
    assert_eq!(marker, None, "the buyer may buy again");
    assert_eq!(result.as_deref(), Some("failed:retries_exhausted"));
    app.stop_when_drained().await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_redrive_no_queue_takes_fails_and_leaves_the_entry_pending() {
    let app = spawn_app_with(TestNamespace::new(), |_| {}).await;
    let missing = 777_002;
    let msg = app.message(missing, 1);
    app.publish(&msg).await;
    app.wait_parked(1).await;
    create_product_with_id(&app, missing, 1).await;
    // Nothing bound to the order exchange: the redrive's mandatory publish comes back.
    let topology = app.ns.topology();
    let bind_order_queue = |bind: bool| {
        let channel = app.channel.clone();
        let topology = topology.clone();
        async move {
            let (queue, exchange, key) = (
                topology.queue.as_str().into(),
                topology.exchange.as_str().into(),
                topology.routing_key.as_str().into(),
            );
            if bind {
                channel
                    .queue_bind(queue, exchange, key, Default::default(), Default::default())
                    .await
            } else {
                channel
                    .queue_unbind(queue, exchange, key, Default::default())
                    .await
            }
            .expect("(un)bind the order queue");
        }
    };
    app.topology_declared().await;
    bind_order_queue(false).await;
    let refused = admin_post(&app, "redrive", json!({ "product_id": missing })).await;
    assert_eq!(refused.status(), 503);
    assert_eq!(statuses(&app).await, ["pending"]);
    assert_eq!(app.order_count(missing).await, 0);

    bind_order_queue(true).await;
    let done = report(&app, "redrive", json!({ "product_id": missing })).await;
    assert_eq!(ids(&done), [msg.request_id.to_string()]);
    eventually("the redriven order", Duration::from_secs(20), || async {
        (app.order_count(missing).await == 1).then_some(())
    })
    .await;
    app.shutdown().await;
}
