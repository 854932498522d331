//! The catalog across replicas: the bloom filter answers unknown ids without Redis, and a
//! product created or changed through one replica is seen by the others (the
//! `product_changes` notifications), with no fixed sleeps: every wait is a poll.

use std::time::{Duration, Instant};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use reqwest::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use seckill_api::{Application, Settings};
use seckill_config::Secret;
use seckill_testkit::{SendAs, TestNamespace, eventually};

use crate::helpers::{assert_error, create_product_at, settings_for};

/// How long a change may take to reach another replica before the test fails.
const PROPAGATION: Duration = Duration::from_secs(10);

/// One seckill-api process; several may share a namespace (replicas of one deployment).
struct Replica {
    address: String,
    client: reqwest::Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Replica {
    async fn start(settings: Settings) -> Self {
        let app = Application::build(settings)
            .await
            .expect("build seckill-api");
        let address = format!("http://127.0.0.1:{}", app.port());
        let stop = app.shutdown_token();
        let task = tokio::spawn(app.run_until_stopped());
        Self {
            address,
            client: reqwest::Client::new(),
            stop,
            task,
        }
    }

    async fn get_product(&self, id: i64) -> Response {
        self.client
            .get(format!("{}/api/products/{id}", self.address))
            .send_as("seckill-api", 42, &[])
            .await
            .expect("product request")
    }

    async fn purchase(&self, id: i64, user_id: i64) -> Response {
        self.client
            .post(format!("{}/api/seckill/{id}", self.address))
            .send_as("seckill-api", user_id, &[])
            .await
            .expect("purchase request")
    }

    async fn patch(&self, id: impl std::fmt::Display, roles: &[&str], body: Value) -> Response {
        self.client
            .patch(format!("{}/admin/products/{id}", self.address))
            .json(&body)
            .send_as("seckill-api", 1, roles)
            .await
            .expect("patch request")
    }

    async fn create_product(&self, start: DateTime<Utc>, end: DateTime<Utc>) -> i64 {
        create_product_at(&self.client, &self.address, 10, start, end).await
    }

    /// One Prometheus sample (`name{labels}` as exported), 0 when absent. The recorder is
    /// process-wide, so parallel tests add to it too: compare with "at least".
    async fn metric(&self, sample: &str) -> f64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.address))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .filter_map(|line| line.rsplit_once(' '))
            .find(|(name, _)| *name == sample)
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or(0.0)
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

fn on_sale_now() -> (DateTime<Utc>, DateTime<Utc>) {
    let now = Utc::now();
    (
        now - ChronoDuration::seconds(60),
        now + ChronoDuration::hours(1),
    )
}

/// The id the next product inserted into this namespace's database will get.
async fn next_product_id(ns: &TestNamespace) -> i64 {
    let db = ns.db().await;
    let (last, called): (i64, bool) =
        sqlx::query_as("SELECT last_value, is_called FROM products_id_seq")
            .fetch_one(&db)
            .await
            .expect("read the id sequence");
    db.close().await;
    if called { last + 1 } else { last }
}

async fn null_entry_exists(ns: &TestNamespace, id: i64) -> bool {
    let mut redis = ns.redis().await;
    redis::cmd("EXISTS")
        .arg(ns.keys().missing_product(id))
        .query_async(&mut redis)
        .await
        .expect("exists")
}

/// A TCP server that accepts connections and never answers: a Redis that hangs. Any command
/// sent to it waits out the client's 2 s timeout.
async fn unresponsive_redis() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("redis://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

#[tokio::test]
async fn an_unknown_product_is_404_from_the_bloom_filter_even_when_redis_hangs() {
    let ns = TestNamespace::new();
    let (redis_url, redis_task) = unresponsive_redis().await;
    let mut settings = settings_for(&ns);
    settings.backend.redis_url = Secret::new(&redis_url);
    settings.backend.redis_cluster = false;
    let app = Replica::start(settings).await;
    let miss = r#"seckill_bloom_checks_total{result="miss"}"#;
    let misses_before = app.metric(miss).await;

    // A lookup that asked Redis (even the null cache, which falls through on errors) would
    // wait for its 2 s timeout first: a prompt 404 was answered from memory.
    let unknown = 9_000_000_001;
    let started = Instant::now();
    assert_error(app.get_product(unknown).await, 404, "product_not_found").await;
    assert_error(app.purchase(unknown, 7).await, 404, "product_not_found").await;
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(1), "took {elapsed:?}");

    let misses_after = app.metric(miss).await;
    assert!(
        misses_after >= misses_before + 2.0,
        "bloom misses went from {misses_before} to {misses_after}"
    );
    app.stop().await;
    redis_task.abort();
    ns.cleanup().await;
}

#[tokio::test]
async fn a_product_created_on_one_replica_becomes_visible_on_another() {
    let ns = TestNamespace::new();
    let a = Replica::start(settings_for(&ns)).await;
    let b = Replica::start(settings_for(&ns)).await;

    let id = next_product_id(&ns).await;
    assert_error(b.get_product(id).await, 404, "product_not_found").await;
    // A lookup past the bloom filter would have written a null-cache entry.
    assert!(
        !null_entry_exists(&ns, id).await,
        "B's 404 must come from its bloom filter"
    );

    let (start, end) = on_sale_now();
    assert_eq!(
        a.create_product(start, end).await,
        id,
        "ids are sequential here"
    );
    let on_b = &b;
    let seen: Value = eventually("the new product on replica B", PROPAGATION, || async move {
        let response = on_b.get_product(id).await;
        if response.status() == 200 {
            response.json().await.ok()
        } else {
            None
        }
    })
    .await;
    assert_eq!(seen["id"], id);
    assert_eq!(b.purchase(id, 11).await.status(), 202);

    a.stop().await;
    b.stop().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_window_changed_on_one_replica_applies_on_another() {
    let ns = TestNamespace::new();
    let a = Replica::start(settings_for(&ns)).await;
    let b = Replica::start(settings_for(&ns)).await;
    let (start, end) = on_sale_now();
    let id = a.create_product(start, end).await;
    let on_b = &b;
    eventually("the product on replica B", PROPAGATION, || async move {
        (on_b.get_product(id).await.status() == 200).then_some(())
    })
    .await;
    // B caches the product and loads its stock into Redis with the open window.
    assert_eq!(b.purchase(id, 21).await.status(), 202);

    let closed_at = Utc::now() - ChronoDuration::seconds(1);
    let response = a
        .patch(
            id,
            &["admin"],
            json!({"name": "closed early", "end_at": closed_at}),
        )
        .await;
    assert_eq!(response.status(), 200);
    let patched: Value = response.json().await.expect("json");
    assert_eq!(patched["name"], "closed early");
    assert_eq!(patched["stock_total"], 10, "stock is not editable");

    // Without an invalidation B's cached copy would stay open for its whole TTL (30 s).
    eventually(
        "replica B to see the sale closed",
        PROPAGATION,
        || async move {
            let body: Value = on_b.get_product(id).await.json().await.ok()?;
            (body["name"] == "closed early" && body["active"] == false).then_some(())
        },
    )
    .await;
    assert_error(b.purchase(id, 22).await, 422, "activity_not_active").await;

    // The loaded buckets carry the new window too (the Lua step checks it, not Moka).
    let buckets = patched["stock_buckets"].as_i64().expect("stock_buckets") as u16;
    let mut redis = ns.redis().await;
    for bucket in 0..buckets {
        let end_ms: Option<i64> = redis::cmd("HGET")
            .arg(ns.keys().stock(id, bucket))
            .arg("end_ms")
            .query_async(&mut redis)
            .await
            .expect("hget");
        if let Some(end_ms) = end_ms {
            assert_eq!(end_ms, closed_at.timestamp_millis(), "bucket {bucket}");
        }
    }

    a.stop().await;
    b.stop().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_sale_closed_with_an_end_long_past_keeps_its_buyers_when_reopened() {
    let ns = TestNamespace::new();
    let app = Replica::start(settings_for(&ns)).await;
    let now = Utc::now();
    let id = app
        .create_product(
            now - ChronoDuration::hours(3),
            now + ChronoDuration::hours(1),
        )
        .await;
    // Loads the stock. No order-service runs here: the purchase waits in the outbox, as an
    // accepted purchase does during a broker outage, and Postgres knows nothing of it.
    assert_eq!(app.purchase(id, 41).await.status(), 202);

    // Closed with an end two hours past (beyond the keys' hour of grace), then reopened.
    for (end_at, active) in [
        (now - ChronoDuration::hours(2), false),
        (now + ChronoDuration::hours(1), true),
    ] {
        let response = app.patch(id, &["admin"], json!({ "end_at": end_at })).await;
        assert_eq!(response.status(), 200);
        let on = &app;
        eventually(
            "the replica to see the window",
            PROPAGATION,
            || async move {
                let body: Value = on.get_product(id).await.json().await.ok()?;
                (body["active"] == active).then_some(())
            },
        )
        .await;
    }

    // Had closing expired the buckets, they would have reloaded from Postgres alone: the
    // buyer could buy again, and the unit in the outbox would be sold twice.
    assert_error(app.purchase(id, 41).await, 409, "already_purchased").await;
    let body: Value = app.get_product(id).await.json().await.expect("json");
    let buckets = body["stock_buckets"].as_i64().expect("stock_buckets") as u16;
    let mut redis = ns.redis().await;
    let mut remaining = 0;
    for bucket in 0..buckets {
        let units: i64 = redis::cmd("HGET")
            .arg(ns.keys().stock(id, bucket))
            .arg("remaining")
            .query_async(&mut redis)
            .await
            .expect("every bucket is still loaded");
        remaining += units;
    }
    assert_eq!(remaining, 9, "ten units, one sold");

    app.stop().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_sale_opened_early_on_one_replica_sells_on_another() {
    let ns = TestNamespace::new();
    let a = Replica::start(settings_for(&ns)).await;
    let b = Replica::start(settings_for(&ns)).await;
    let now = Utc::now();
    let id = a
        .create_product(
            now + ChronoDuration::hours(1),
            now + ChronoDuration::hours(2),
        )
        .await;
    let on_b = &b;
    // B caches the product as "not yet on sale".
    eventually(
        "replica B to know the product",
        PROPAGATION,
        || async move {
            let response = on_b.purchase(id, 31).await;
            (response.status() == 422).then_some(())
        },
    )
    .await;

    let response = a
        .patch(
            id,
            &["admin"],
            json!({"start_at": now - ChronoDuration::seconds(5)}),
        )
        .await;
    assert_eq!(response.status(), 200);
    eventually("replica B to open the sale", PROPAGATION, || async move {
        (on_b.purchase(id, 32).await.status() == 202).then_some(())
    })
    .await;

    a.stop().await;
    b.stop().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn patching_a_product_validates_like_creating_one() {
    let ns = TestNamespace::new();
    let app = Replica::start(settings_for(&ns)).await;
    let (start, end) = on_sale_now();
    let id = app.create_product(start, end).await;

    let cases = [
        json!({}),
        json!({"name": ""}),
        json!({"name": "x".repeat(201)}),
        json!({"price_cents": -1}),
        json!({"start_at": end, "end_at": start}),
        json!({"start_at": start, "end_at": start}),
        // Half a window is checked against the stored other half.
        json!({"start_at": end + ChronoDuration::minutes(1)}),
        json!({"end_at": start - ChronoDuration::minutes(1)}),
        json!({"end_at": "tomorrow"}),
        json!({"stock": 5}),
        json!({"buckets": 4}),
    ];
    for case in cases {
        let response = app.patch(id, &["admin"], case.clone()).await;
        assert_eq!(response.status(), 400, "{case}");
        assert_error(response, 400, "invalid_request").await;
    }
    let not_json = app
        .client
        .patch(format!("{}/admin/products/{id}", app.address))
        .header("content-type", "application/json")
        .body("{not json")
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("request");
    assert_error(not_json, 400, "invalid_request").await;
    assert_error(
        app.patch("abc", &["admin"], json!({"name": "y"})).await,
        400,
        "invalid_request",
    )
    .await;

    let rename = json!({"name": "y"});
    assert_error(
        app.patch(id + 1_000, &["admin"], rename.clone()).await,
        404,
        "product_not_found",
    )
    .await;
    assert_error(app.patch(id, &[], rename.clone()).await, 403, "forbidden").await;
    let anonymous = app
        .client
        .patch(format!("{}/admin/products/{id}", app.address))
        .json(&rename)
        .send()
        .await
        .expect("request");
    assert_error(anonymous, 401, "unauthorized").await;

    // Nothing above changed the product.
    let body: Value = app.get_product(id).await.json().await.expect("json");
    assert_eq!(body["name"], "test product");
    let stored_end: DateTime<Utc> = serde_json::from_value(body["end_at"].clone()).expect("end_at");
    // Postgres keeps microseconds.
    assert_eq!(stored_end.timestamp_micros(), end.timestamp_micros());

    app.stop().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_replica_whose_listener_reconnects_catches_up_on_missed_products() {
    let ns = TestNamespace::new();
    let app = Replica::start(settings_for(&ns)).await;
    let db = ns.db().await;
    // A product that no notification announces, as if inserted while the listener was away.
    sqlx::query("ALTER TABLE products DISABLE TRIGGER products_notify_change")
        .execute(&db)
        .await
        .expect("disable trigger");
    let (start, end) = on_sale_now();
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO products (name, price_cents, stock_total, stock_remaining, start_at, end_at) \
         VALUES ('silent', 100, 3, 3, $1, $2) RETURNING id",
    )
    .bind(start)
    .bind(end)
    .fetch_one(&db)
    .await
    .expect("insert");
    assert_error(app.get_product(id).await, 404, "product_not_found").await;

    // Drop the listening connection: the replica reconnects and rebuilds its filter.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_all(&db)
    .await
    .expect("terminate the listener");
    assert_eq!(killed, vec![true], "exactly one listener connection");
    let app_ref = &app;
    eventually(
        "the silent product after the rebuild",
        PROPAGATION,
        || async move { (app_ref.get_product(id).await.status() == 200).then_some(()) },
    )
    .await;

    db.close().await;
    app.stop().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn order_stock_decrements_do_not_notify_but_catalogue_changes_do() {
    let ns = TestNamespace::new();
    let app = Replica::start(settings_for(&ns)).await;
    let (start, end) = on_sale_now();
    let selling = app.create_product(start, end).await;
    let renamed = app.create_product(start, end).await;
    let db = ns.db().await;
    let mut listener = sqlx::postgres::PgListener::connect(&ns.database_url)
        .await
        .expect("listener");
    listener.listen("product_changes").await.expect("listen");

    // What order-service does on every order, then an admin edit. Notifications arrive in
    // commit order, so if the first were notified it would be the first one received.
    sqlx::query("UPDATE products SET stock_remaining = stock_remaining - 1 WHERE id = $1")
        .bind(selling)
        .execute(&db)
        .await
        .expect("decrement");
    sqlx::query("UPDATE products SET name = 'renamed' WHERE id = $1")
        .bind(renamed)
        .execute(&db)
        .await
        .expect("rename");
    let first = tokio::time::timeout(PROPAGATION, listener.recv())
        .await
        .expect("a notification")
        .expect("recv");
    assert_eq!(first.payload(), renamed.to_string());

    drop(listener);
    db.close().await;
    app.stop().await;
    ns.cleanup().await;
}
