//! The purchase path: decisions, the outbox and its relay to RabbitMQ.

use std::collections::HashSet;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use futures_util::future::join_all;
use lapin::options::BasicGetOptions;
use serde_json::Value;

use seckill_messaging::OrderMessage;
use seckill_testkit::{SendAs, eventually};

use crate::helpers::{assert_error, spawn_app};

#[tokio::test]
async fn purchase_returns_202_and_the_result_is_queued() {
    let app = spawn_app().await;
    let product = app.create_product(10).await;

    let response = app.purchase(product, 42).await;
    assert_eq!(response.status(), 202);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["status"], "queued");
    let request_id = body["request_id"].as_str().expect("request_id").to_string();

    let result = app.result(product, 42).await;
    assert_eq!(result["status"], "queued");
    assert_eq!(result["request_id"], request_id.as_str());
    assert_eq!(app.result(product, 43).await["status"], "none");
    assert_eq!(app.redis_remaining(product).await, Some(9));
    app.shutdown().await;
}

#[tokio::test]
async fn seckill_returns_409_when_user_already_bought() {
    let app = spawn_app().await;
    let product = app.create_product(10).await;
    assert_eq!(app.purchase(product, 7).await.status(), 202);

    assert_error(app.purchase(product, 7).await, 409, "already_purchased").await;
    assert_eq!(app.redis_remaining(product).await, Some(9));
    app.shutdown().await;
}

#[tokio::test]
async fn seckill_returns_410_when_sold_out() {
    let app = spawn_app().await;
    let product = app.create_product(2).await;
    assert_eq!(app.purchase(product, 1).await.status(), 202);
    assert_eq!(app.purchase(product, 2).await.status(), 202);

    assert_error(app.purchase(product, 3).await, 410, "sold_out").await;
    assert_eq!(app.redis_remaining(product).await, Some(0));
    app.shutdown().await;
}

#[tokio::test]
async fn seckill_returns_404_for_an_unknown_product() {
    let app = spawn_app().await;
    assert_error(app.purchase(999_999, 1).await, 404, "product_not_found").await;
    app.shutdown().await;
}

#[tokio::test]
async fn seckill_returns_400_for_a_non_numeric_or_non_positive_product_id() {
    let app = spawn_app().await;
    for bad in ["abc", "-1", "0", "1.5", "99999999999999999999999"] {
        assert_error(app.purchase(bad, 1).await, 400, "invalid_request").await;
    }
    app.shutdown().await;
}

#[tokio::test]
async fn seckill_returns_422_outside_the_sale_window() {
    let app = spawn_app().await;
    let now = Utc::now();
    let future = app
        .create_product_window(
            5,
            now + ChronoDuration::hours(1),
            now + ChronoDuration::hours(2),
        )
        .await;
    let past = app
        .create_product_window(
            5,
            now - ChronoDuration::hours(2),
            now - ChronoDuration::hours(1),
        )
        .await;

    assert_error(app.purchase(future, 1).await, 422, "activity_not_active").await;
    assert_error(app.purchase(past, 1).await, 422, "activity_not_active").await;
    assert_eq!(
        app.redis_remaining(future).await,
        None,
        "nothing loaded, nothing sold"
    );
    app.shutdown().await;
}

#[tokio::test]
async fn seckill_returns_401_without_a_valid_gateway_identity() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    let url = format!("{}/api/seckill/{product}", app.address);

    let bare = app.client.post(&url).send().await.expect("request");
    assert_error(bare, 401, "unauthorized").await;

    // A caller that went around the gateway and invented the headers.
    let forged = app
        .client
        .post(&url)
        .header("x-user-id", "5")
        .header("x-user-roles", "")
        .header("x-identity-ts", Utc::now().timestamp_millis().to_string())
        .header("x-identity-sig", "00".repeat(32))
        .send()
        .await
        .expect("request");
    assert_error(forged, 401, "unauthorized").await;
    assert_eq!(app.redis_remaining(product).await, None);
    app.shutdown().await;
}

#[tokio::test]
async fn stock_loads_lazily_and_counts_orders_already_in_the_database() {
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    assert_eq!(app.redis_remaining(product).await, None, "not preloaded");

    // An order that exists in Postgres before Redis ever saw the product (e.g. Redis lost
    // its data): the load must not resurrect its unit nor let its buyer buy again.
    let db = app.ns.db().await;
    sqlx::query(
        "INSERT INTO orders (request_id, user_id, product_id, price_cents, accepted_at) \
         VALUES ($1, 77, $2, 1999, now())",
    )
    .bind(uuid::Uuid::new_v4())
    .bind(product)
    .execute(&db)
    .await
    .expect("insert order");

    assert_error(app.purchase(product, 77).await, 409, "already_purchased").await;
    assert_eq!(app.redis_remaining(product).await, Some(4));
    assert_eq!(app.purchase(product, 78).await.status(), 202);
    assert_eq!(app.redis_remaining(product).await, Some(3));
    app.shutdown().await;
}

#[tokio::test]
async fn a_concurrent_burst_sells_exactly_the_stock_and_relays_every_acceptance_once() {
    let app = spawn_app().await;
    let stock = 40;
    let users = 200;
    let product = app.create_product(stock).await;
    let (_connection, channel) = app.ns.channel().await;

    let responses = join_all((1..=users).map(|user| app.purchase(product, user))).await;
    let mut accepted = HashSet::new();
    let mut sold_out = 0;
    for response in responses {
        match response.status().as_u16() {
            202 => {
                let body: Value = response.json().await.expect("json");
                accepted.insert(body["request_id"].as_str().expect("id").to_string());
            }
            410 => sold_out += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(accepted.len(), stock as usize);
    assert_eq!(sold_out, users as usize - stock as usize);
    assert_eq!(app.redis_remaining(product).await, Some(0));

    // Every acceptance reaches the queue exactly once, with the contract's properties.
    let queue = app.ns.topology().queue;
    let mut seen = HashSet::new();
    let mut buyers = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < accepted.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} relayed",
            seen.len()
        );
        let Some(message) = channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .expect("basic_get")
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        assert_eq!(
            message.delivery.properties.delivery_mode(),
            &Some(2),
            "persistent"
        );
        // Purchases accepted together may share a message (group commit): each part is
        // the single-order message it stands for.
        let parts = seckill_messaging::batch::messages(
            &message.delivery.data,
            &message.delivery.properties,
        )
        .expect("a readable message");
        for part in parts {
            let props = &part.properties;
            let body: OrderMessage = serde_json::from_slice(&part.data).expect("contract body");
            assert_eq!(
                props.message_id().as_ref().map(|m| m.to_string()),
                Some(body.request_id.to_string())
            );
            assert_eq!(body.product_id, product);
            assert!(seen.insert(body.request_id.to_string()), "published twice");
            assert!(buyers.insert(body.user_id), "one user bought twice");
        }
    }
    assert_eq!(seen, accepted);

    // Confirmed entries leave the outbox.
    eventually("outbox drained", Duration::from_secs(10), || async {
        (app.outbox_len(product).await == 0).then_some(())
    })
    .await;
    app.shutdown().await;
}

#[tokio::test]
async fn purchases_accepted_while_the_broker_is_unreachable_are_relayed_once_it_is_back() {
    // The relay's broker is a closed port: purchases are still accepted (the outbox holds
    // them) and nothing is lost; a second replica with a working broker relays them.
    let ns = seckill_testkit::TestNamespace::new();
    let mut settings = crate::helpers::settings_for(&ns);
    settings.backend.amqp_url = seckill_config::Secret::new("amqp://guest:guest@127.0.0.1:1/%2f");
    settings.relay_reclaim_idle = Duration::from_millis(200);
    let offline = seckill_api::Application::build(settings)
        .await
        .expect("build");
    let address = format!("http://127.0.0.1:{}", offline.port());
    let stop = offline.shutdown_token();
    let task = tokio::spawn(offline.run_until_stopped());
    let client = reqwest::Client::new();
    let now = Utc::now();
    let (start, end) = (
        now - ChronoDuration::minutes(1),
        now + ChronoDuration::hours(1),
    );
    let product = crate::helpers::create_product_at(&client, &address, 5, start, end).await;
    for user in 1..=3 {
        let response = client
            .post(format!("{address}/api/seckill/{product}"))
            .send_as("seckill-api", user, &[])
            .await
            .expect("purchase");
        assert_eq!(response.status(), 202);
    }
    stop.cancel();
    let _ = task.await;

    let (_connection, channel) = ns.channel().await;
    let queue = ns.topology().queue;
    assert_eq!(ns.queue_depth(&channel, &queue).await, 0);
    let mut settings = crate::helpers::settings_for(&ns);
    settings.relay_reclaim_idle = Duration::from_millis(200);
    let online = seckill_api::Application::build(settings)
        .await
        .expect("build");
    let stop = online.shutdown_token();
    let task = tokio::spawn(online.run_until_stopped());
    let queued = seckill_testkit::TakenPurchases::from(&ns).await;
    eventually("backlog relayed", Duration::from_secs(20), || async {
        (queued.count().await == 3).then_some(())
    })
    .await;
    stop.cancel();
    let _ = task.await;
    ns.cleanup().await;
}

#[tokio::test]
async fn an_unroutable_publish_is_kept_in_the_outbox_until_the_queue_is_back() {
    // `mandatory`: with the queue gone the broker returns the message instead of dropping
    // it; the relay must keep the entry, re-declare the topology and publish it again.
    let app = spawn_app().await;
    let product = app.create_product(5).await;
    let (connection, channel) = app.ns.channel().await;
    let queue = app.ns.topology().queue;
    eventually("relay connected", Duration::from_secs(10), || async {
        let ready = app
            .client
            .get(format!("{}/readyz", app.address))
            .send()
            .await;
        ready.ok().filter(|r| r.status() == 200).map(|_| ())
    })
    .await;
    channel
        .queue_delete(queue.as_str().into(), Default::default())
        .await
        .expect("delete the queue");
    assert_eq!(app.purchase(product, 1).await.status(), 202);
    // The entry survives the return and arrives once the relay has re-declared the queue.
    eventually(
        "message delivered after the return",
        Duration::from_secs(15),
        || async {
            // A passive declare of a missing queue closes its channel: one channel per look.
            let Ok(look) = connection.create_channel().await else {
                return None;
            };
            let depth = look
                .queue_declare(
                    queue.as_str().into(),
                    lapin::options::QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    Default::default(),
                )
                .await
                .map(|q| q.message_count())
                .unwrap_or(0);
            (depth == 1 && app.outbox_len(product).await == 0).then_some(())
        },
    )
    .await;
    let _ = connection.close(200, "done".into()).await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_202_is_answered_once_the_broker_has_the_order_message() {
    let app = crate::helpers::spawn_app().await;
    let product = app.create_product(5).await;
    let (_connection, channel) = app.ns.channel().await;
    let queue = app.ns.topology().queue;
    // Ready means the handlers' publisher is connected too (a purchase made before goes to
    // the outbox, which is the fallback, not what this test is about).
    eventually("ready", Duration::from_secs(10), || async {
        let ready = app
            .client
            .get(format!("{}/readyz", app.address))
            .send()
            .await;
        ready.ok().filter(|r| r.status() == 200).map(|_| ())
    })
    .await;
    for user in 1..=3 {
        assert_eq!(app.purchase(product, user).await.status(), 202);
        // Already in the queue when the answer comes, and no longer in the outbox: the
        // 202 does not depend on Redis keeping the intent.
        assert_eq!(app.ns.queue_depth(&channel, &queue).await, user as u32);
        assert_eq!(app.outbox_len(product).await, 0);
    }
    app.shutdown().await;
}
