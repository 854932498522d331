//! The waiting room's backend side (DESIGN.md §9): the mode on the product, the room's set-up
//! in Redis, and the refusal of purchases the gateway did not admit.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use reqwest::Response;
use serde_json::{Value, json};

use seckill_testkit::SendAs;

use crate::helpers::{TestApp, assert_error, spawn_app, spawn_app_in, spawn_app_with};

/// Creates a product with `body`'s fields over a default on-sale product; the answer.
async fn create(app: &TestApp, fields: Value) -> Response {
    let now = Utc::now();
    let mut body = json!({
        "name": "queued product",
        "price_cents": 700,
        "stock": 3,
        "buckets": 2,
        "start_at": now - ChronoDuration::seconds(60),
        "end_at": now + ChronoDuration::hours(1),
    });
    for (field, value) in fields.as_object().expect("an object") {
        body[field] = value.clone();
    }
    app.client
        .post(format!("{}/admin/products", app.address))
        .json(&body)
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("create product")
}

/// Creates a product with `fields`, expecting `201`; its JSON.
async fn created(app: &TestApp, fields: Value) -> Value {
    let response = create(app, fields).await;
    assert_eq!(response.status(), 201);
    response.json().await.expect("json")
}

async fn patch(app: &TestApp, product: i64, changes: Value) -> Response {
    app.client
        .patch(format!("{}/admin/products/{product}", app.address))
        .json(&changes)
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("patch product")
}

async fn get_product(app: &TestApp, product: i64) -> Value {
    let response = app
        .client
        .get(format!("{}/api/products/{product}", app.address))
        .send_as("seckill-api", 9, &[])
        .await
        .expect("get product");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// A purchase with `query` (e.g. `admitted=3`), signed as the gateway signs it.
async fn purchase_with(app: &TestApp, product: i64, user: i64, query: &str) -> Response {
    app.client
        .post(format!("{}/api/seckill/{product}?{query}", app.address))
        .send_as("seckill-api", user, &[])
        .await
        .expect("purchase")
}

/// The room's hash, field by field (empty when it does not exist).
async fn room(app: &TestApp, product: i64) -> HashMap<String, String> {
    let mut redis = app.ns.redis().await;
    redis::cmd("HGETALL")
        .arg(app.ns.keys().room(product))
        .query_async(&mut redis)
        .await
        .expect("hgetall")
}

fn millis(at: &Value) -> String {
    let at: DateTime<Utc> = serde_json::from_value(at.clone()).expect("a time");
    at.timestamp_millis().to_string()
}

fn id(product: &Value) -> i64 {
    product["id"].as_i64().expect("id")
}

#[tokio::test]
async fn a_product_created_with_a_fifo_room_shows_it_and_has_its_room_in_redis() {
    let app = spawn_app().await;
    let product = created(&app, json!({"waiting_room": "fifo"})).await;
    assert_eq!(product["waiting_room"], "fifo", "{product}");
    let id = id(&product);
    assert_eq!(get_product(&app, id).await["waiting_room"], "fifo");
    let listed: Value = app
        .client
        .get(format!("{}/api/products", app.address))
        .send_as("seckill-api", 9, &[])
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let listed = listed
        .as_array()
        .expect("a list")
        .iter()
        .find(|p| p["id"] == id)
        .expect("the product is listed");
    assert_eq!(listed["waiting_room"], "fifo");

    let room = room(&app, id).await;
    assert_eq!(room["mode"], "fifo");
    assert_eq!(room["start_ms"], millis(&product["start_at"]));
    assert_eq!(room["end_ms"], millis(&product["end_at"]));
    assert_eq!(room["stock"], "3");
    assert_eq!(room["buckets"], "2");
    // It expires a day after the sale ends.
    let mut redis = app.ns.redis().await;
    let expires: i64 = redis::cmd("PEXPIRETIME")
        .arg(app.ns.keys().room(id))
        .query_async(&mut redis)
        .await
        .expect("pexpiretime");
    let end_ms: i64 = room["end_ms"].parse().expect("a number");
    assert_eq!(expires, end_ms + 24 * 60 * 60 * 1000);

    // Without the field, no room: `open`, and no hash at all.
    let plain = created(&app, json!({})).await;
    assert_eq!(plain["waiting_room"], "open", "{plain}");
    assert!(self::room(&app, self::id(&plain)).await.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn a_raffle_room_has_a_seed_fixed_at_its_creation_and_needs_admission() {
    let app = spawn_app().await;
    let product = created(&app, json!({"waiting_room": "raffle"})).await;
    assert_eq!(product["waiting_room"], "raffle", "{product}");
    let id = id(&product);
    let first = room(&app, id).await;
    assert_eq!(first["mode"], "raffle");
    let seed = first["seed"].clone();
    assert!(
        seed.len() == 64
            && seed
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()),
        "{seed}"
    );
    // A change writes the set-up again: the seed, like the line, stays as created.
    let later = Utc::now() + ChronoDuration::hours(2);
    assert_eq!(
        patch(&app, id, json!({"end_at": later})).await.status(),
        200
    );
    let again = room(&app, id).await;
    assert_eq!(again["end_ms"], later.timestamp_millis().to_string());
    assert_eq!(again["seed"], seed);
    assert_eq!(again["line"], first["line"]);
    // Another room draws from another seed.
    let other = room(
        &app,
        self::id(&created(&app, json!({"waiting_room": "raffle"})).await),
    )
    .await;
    assert_ne!(other["seed"], seed);

    assert_error(app.purchase(id, 5).await, 428, "admission_required").await;
    assert_eq!(purchase_with(&app, id, 5, "admitted=0").await.status(), 202);
    app.shutdown().await;
}

#[tokio::test]
async fn a_patch_turns_the_room_on_and_off_in_postgres_and_in_redis() {
    let app = spawn_app().await;
    let product = id(&created(&app, json!({"waiting_room": "open"})).await);
    assert!(room(&app, product).await.is_empty());

    let on = patch(&app, product, json!({"waiting_room": "fifo"})).await;
    assert_eq!(on.status(), 200);
    assert_eq!(
        on.json::<Value>().await.expect("json")["waiting_room"],
        "fifo"
    );
    assert_eq!(get_product(&app, product).await["waiting_room"], "fifo");
    assert_eq!(room(&app, product).await["mode"], "fifo");

    // The gateway's counters live in the same hash: a set-up write leaves them alone.
    let mut redis = app.ns.redis().await;
    let () = redis::cmd("HSET")
        .arg(app.ns.keys().room(product))
        .arg("cursor")
        .arg(7)
        .query_async(&mut redis)
        .await
        .expect("hset");

    let off = patch(&app, product, json!({"waiting_room": "open"})).await;
    assert_eq!(off.status(), 200);
    assert_eq!(
        off.json::<Value>().await.expect("json")["waiting_room"],
        "open"
    );
    assert_eq!(get_product(&app, product).await["waiting_room"], "open");
    let room = room(&app, product).await;
    assert_eq!(room["mode"], "open");
    assert_eq!(room["cursor"], "7");
    // Off, a plain purchase buys.
    assert_eq!(app.purchase(product, 5).await.status(), 202);
    app.shutdown().await;
}

#[tokio::test]
async fn a_purchase_of_a_room_product_needs_the_gateways_admission() {
    let app = spawn_app().await;
    let product = id(&created(&app, json!({"waiting_room": "fifo"})).await);

    let refused = app.purchase(product, 5).await;
    assert_eq!(refused.status(), 428);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["code"], "admission_required", "{body}");
    let message = body["message"].as_str().expect("a message");
    assert!(
        message.contains(&format!("/api/rooms/{product}/join")),
        "{message}"
    );
    // Refused before any stock work: nothing loaded, nothing taken.
    assert_eq!(app.redis_remaining(product).await, None);
    let report: Value = app
        .client
        .get(format!("{}/admin/products/{product}/stock", app.address))
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("stock report")
        .json()
        .await
        .expect("json");
    assert_eq!(report["redis_remaining"], 3, "{report}");
    assert_eq!(report["in_flight"], 0, "{report}");

    // A malformed admission is the gateway's bug, never a purchase.
    for bad in ["admitted=abc", "admitted=-1", "admitted="] {
        assert_error(
            purchase_with(&app, product, 5, bad).await,
            400,
            "invalid_request",
        )
        .await;
    }
    assert_eq!(app.redis_remaining(product).await, None);

    // Admitted by the gateway (the query is under its signature): bought.
    assert_eq!(
        purchase_with(&app, product, 5, "admitted=3").await.status(),
        202
    );
    assert_eq!(app.redis_remaining(product).await, Some(2));

    // A product without a room takes an admission like a plain purchase.
    let open = id(&created(&app, json!({})).await);
    assert_eq!(
        purchase_with(&app, open, 5, "admitted=3").await.status(),
        202
    );
    app.shutdown().await;
}

#[tokio::test]
async fn a_refusal_for_want_of_admission_is_not_pinned_to_the_idempotency_key() {
    let app = spawn_app().await;
    let product = id(&created(&app, json!({"waiting_room": "fifo"})).await);
    let send = |query: &'static str| {
        app.client
            .post(format!("{}/api/seckill/{product}{query}", app.address))
            .header("Idempotency-Key", "click-1")
            .send_as("seckill-api", 6, &[])
    };
    assert_error(send("").await.expect("purchase"), 428, "admission_required").await;
    let admitted = send("?admitted=0").await.expect("purchase");
    assert_eq!(admitted.status(), 202);
    assert!(admitted.headers().get("idempotent-replayed").is_none());
    app.shutdown().await;
}

#[tokio::test]
async fn an_unknown_room_mode_is_a_400() {
    let app = spawn_app().await;
    for bad in [
        json!("lottery"),
        json!("FIFO"),
        json!(""),
        json!(1),
        json!(null),
    ] {
        let response = create(&app, json!({ "waiting_room": bad })).await;
        if bad.is_null() {
            // Absent and null are the same: the default.
            assert_eq!(response.status(), 201);
            continue;
        }
        assert_error(response, 400, "invalid_request").await;
    }
    let product = id(&created(&app, json!({})).await);
    let response = patch(&app, product, json!({"waiting_room": "lottery"})).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "invalid_request", "{body}");
    assert!(
        body["message"]
            .as_str()
            .expect("message")
            .contains("waiting_room"),
        "{body}"
    );
    // Nothing to change names the new field too.
    let empty = patch(&app, product, json!({})).await;
    assert_eq!(empty.status(), 400);
    let body: Value = empty.json().await.expect("json");
    assert!(
        body["message"]
            .as_str()
            .expect("message")
            .contains("waiting_room"),
        "{body}"
    );
    assert_eq!(get_product(&app, product).await["waiting_room"], "open");
    app.shutdown().await;
}

#[tokio::test]
async fn the_sync_writes_a_lost_room_again_but_not_an_ended_sales() {
    let app = spawn_app_with(|settings| settings.room_sync = Duration::from_millis(200)).await;
    let product = id(&created(&app, json!({"waiting_room": "fifo"})).await);
    let now = Utc::now();
    let ended = id(&created(
        &app,
        json!({
            "waiting_room": "fifo",
            "start_at": now - ChronoDuration::hours(2),
            "end_at": now - ChronoDuration::hours(1),
        }),
    )
    .await);
    // Each change listener hands the inserts to the sync too (which writes the ended sale's
    // room as changed): both heard before the rooms are deleted.
    seckill_testkit::eventually("both inserts heard", Duration::from_secs(10), || async {
        (app.metric("seckill_product_changes_total").await >= 2.0).then_some(())
    })
    .await;
    let mut redis = app.ns.redis().await;
    // Twice: the second time back, a whole round ran after the second deletion of both.
    for _ in 0..2 {
        for key in [app.ns.keys().room(product), app.ns.keys().room(ended)] {
            let () = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut redis)
                .await
                .expect("del");
        }
        let restored = seckill_testkit::eventually(
            "the room written again",
            Duration::from_secs(10),
            || async {
                let room = room(&app, product).await;
                (room.get("mode").map(String::as_str) == Some("fifo")).then_some(room)
            },
        )
        .await;
        assert_eq!(restored["stock"], "3");
    }
    assert!(room(&app, ended).await.is_empty());
    app.shutdown().await;
}

#[tokio::test]
async fn a_room_turned_off_on_one_replica_is_off_on_the_others() {
    let app = spawn_app().await;
    let other = spawn_app_in(app.ns.clone(), |_| {}).await;
    let product = id(&created(&app, json!({"waiting_room": "fifo"})).await);
    // The other replica hears of the product, and caches it with its room on.
    seckill_testkit::eventually(
        "the room on the other replica",
        Duration::from_secs(10),
        || async { (other.purchase(product, 5).await.status() == 428).then_some(()) },
    )
    .await;

    assert_eq!(
        patch(&app, product, json!({"waiting_room": "open"}))
            .await
            .status(),
        200
    );
    // The change listener drops the other replica's copy.
    seckill_testkit::eventually(
        "the room off on the other replica",
        Duration::from_secs(10),
        || async {
            let response = other.purchase(product, 5).await;
            (response.status() == 202).then_some(())
        },
    )
    .await;
    assert_eq!(room(&app, product).await["mode"], "open");
    other.stop().await;
    app.shutdown().await;
}
