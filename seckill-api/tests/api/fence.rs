//! Redis losing a product's ledger mid-sale: sales pause until every accepted purchase has
//! landed, then the ledger is rebuilt from Postgres and sales resume by themselves.

use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicPublishOptions, BasicRejectOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation};
use serde_json::Value;

use seckill_api::stock::fence::{Fence, STATS_INTERVAL};
use seckill_messaging::{HEADER_SIGNATURE, OrderMessage, OrderSigner, Topology};
use seckill_testkit::{OwnBroker, SendAs, eventually};

use crate::helpers::{TestApp, assert_error, spawn_app};

/// Deletes every key of the product's sale, outbox streams included: what a Redis that
/// restarted without its data has of it.
async fn wipe(app: &TestApp, product: i64) {
    let keys = app.ns.keys();
    let mut doomed = vec![keys.product_state(product), keys.load_lock(product)];
    for bucket in 0..app.buckets(product).await {
        doomed.extend([
            keys.stock(product, bucket),
            keys.buyers(product, bucket),
            keys.takers(product, bucket),
            keys.results(product, bucket),
            keys.returns(product, bucket),
            keys.released(product, bucket),
            keys.outbox(product, bucket),
        ]);
    }
    let mut redis = app.ns.redis().await;
    for key in doomed {
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut redis)
            .await
            .expect("del");
    }
}

async fn ledger_state(app: &TestApp, product: i64) -> Value {
    app.client
        .get(format!("{}/admin/products/{product}/stock", app.address))
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("stock report")
        .json()
        .await
        .expect("json")
}

#[tokio::test]
async fn a_lost_ledger_is_rebuilt_only_once_every_accepted_purchase_has_landed() {
    let app = spawn_app().await;
    let product = app.create_product_in_buckets(6, 2).await;
    // Ready: the handlers publish, so each 202 below means RabbitMQ has the purchase (before,
    // a 202 rests on the outbox, which the wipe below would take with it).
    app.wait_ready().await;
    for user in 1..=3 {
        assert_eq!(
            app.purchase(product, user).await.status(),
            202,
            "user {user}"
        );
    }
    // Redis forgets the sale while the three purchases wait in RabbitMQ (no order-service
    // runs yet): loading now would sell their units again.
    wipe(&app, product).await;
    assert_error(app.purchase(product, 10).await, 503, "ledger_rebuilding").await;
    assert_eq!(ledger_state(&app, product).await["ledger"], "rebuilding");
    assert_error(app.purchase(product, 1).await, 503, "ledger_rebuilding").await;

    // order-service writes the three orders; then the ledger is rebuilt from Postgres.
    let orders = order_service::Application::build(order_service::Settings {
        backend: app.ns.backend_settings(),
        port: 0,
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    let stop_orders = orders.shutdown_token();
    let orders = tokio::spawn(orders.run_until_stopped());
    eventually("sales resume", Duration::from_secs(60), || async {
        (app.purchase(product, 10).await.status() == 202).then_some(())
    })
    .await;
    assert_eq!(ledger_state(&app, product).await["ledger"], "in_redis");
    // The earlier buyers' markers came back with their orders: nobody buys twice.
    for user in 1..=3 {
        assert_error(app.purchase(product, user).await, 409, "already_purchased").await;
    }
    // And exactly the stock is sold: 3 before the loss, 3 after.
    let mut accepted = 4;
    for user in 11..=30 {
        if app.purchase(product, user).await.status() == 202 {
            accepted += 1;
        }
    }
    assert_eq!(accepted, 6);
    stop_orders.cancel();
    let _ = orders.await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_lost_bucket_is_passed_over_by_sweeps_while_other_buckets_sell() {
    let app = spawn_app().await;
    let (stock, buckets) = (6, 3u16);
    let product = app.create_product_in_buckets(stock, buckets as i16).await;
    let homed =
        |bucket: u16| (1..).filter(move |&u| seckill_store::home_bucket(u, buckets) == bucket);
    // Bucket 0's two units go to buyers homed there.
    let mut in_zero = homed(0);
    for user in in_zero.by_ref().take(2) {
        assert_eq!(
            app.purchase(product, user).await.status(),
            202,
            "user {user}"
        );
    }
    // Redis loses bucket 1 only (its stock hash).
    let mut redis = app.ns.redis().await;
    let _: i64 = redis::cmd("DEL")
        .arg(app.ns.keys().stock(product, 1))
        .query_async(&mut redis)
        .await
        .expect("del");
    // Buyers homed in the dry bucket 0 sweep: bucket 1 is passed over (it waits for its
    // rebuild), bucket 2 still sells, whichever the sweep visits first.
    for user in in_zero.take(2) {
        assert_eq!(
            app.purchase(product, user).await.status(),
            202,
            "user {user}"
        );
    }
    // Bucket 2 is dry now too: with bucket 1 unknown, the answer is 503, not sold out.
    let next = homed(0).nth(4).expect("a fifth buyer homed in bucket 0");
    assert_error(app.purchase(product, next).await, 503, "ledger_rebuilding").await;
    app.shutdown().await;
}

/// Makes the database refuse the first update that marks a product's ledger loaded (a
/// failed statement, a connection lost at that moment); later ones pass.
async fn refuse_first_ledger_loaded_update(app: &TestApp) {
    let db = app.ns.db().await;
    for statement in [
        "CREATE SEQUENCE ledger_loaded_updates",
        "CREATE FUNCTION refuse_first_ledger_loaded() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN \
           IF nextval('ledger_loaded_updates') = 1 THEN \
             RAISE EXCEPTION 'refused once by the test'; \
           END IF; \
           RETURN NEW; \
         END $$",
        "CREATE TRIGGER refuse_first_ledger_loaded BEFORE UPDATE OF ledger_loaded ON products \
         FOR EACH ROW WHEN (NEW.ledger_loaded AND NOT OLD.ledger_loaded) \
         EXECUTE FUNCTION refuse_first_ledger_loaded()",
    ] {
        sqlx::query(statement)
            .execute(&db)
            .await
            .expect("install the refusal");
    }
    db.close().await;
}

#[tokio::test]
async fn one_failed_update_of_the_loaded_flag_does_not_let_a_lost_ledger_rebuild_at_once() {
    let app = spawn_app().await;
    let product = app.create_product_in_buckets(6, 2).await;
    app.wait_ready().await;
    refuse_first_ledger_loaded_update(&app).await;
    // The first load meets the refusal; the purchase is retried until it is accepted.
    eventually("a purchase accepted", Duration::from_secs(20), || async {
        let status = app.purchase(product, 1).await.status();
        assert!(
            status == 202 || status.is_server_error(),
            "unexpected {status}"
        );
        (status == 202).then_some(())
    })
    .await;
    let db = app.ns.db().await;
    let loaded: bool = sqlx::query_scalar("SELECT ledger_loaded FROM products WHERE id = $1")
        .bind(product)
        .fetch_one(&db)
        .await
        .expect("ledger_loaded");
    db.close().await;
    // Redis forgets the sale while the purchase waits in RabbitMQ (no order-service runs):
    // the product was loaded, so nothing is sold until that purchase has landed.
    wipe(&app, product).await;
    assert_error(app.purchase(product, 10).await, 503, "ledger_rebuilding").await;
    assert!(loaded, "the product's ledger_loaded stayed false");
    app.shutdown().await;
}

/// `at-least-once` dead-lettering keeps a dead letter in its source quorum queue until its
/// target confirmed it: neither ready nor unacknowledged there, it is still a purchase in
/// flight, and RabbitMQ's management API counts it in `messages` (with `messages_dlx`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_in_transit_between_quorum_queues_holds_the_fence() {
    let broker = OwnBroker::start_with_management().await;
    let management = broker.management_url().expect("management API");
    let connection = seckill_messaging::connect(&broker.amqp_url(), "test", Duration::ZERO)
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    // Two namespaces on one broker: one holds a dead letter in transit, the other nothing.
    let (busy, idle) = (Topology::new("transit"), Topology::new("idle"));
    for topology in [&busy, &idle] {
        topology.declare(&channel).await.expect("declare");
    }
    // The dead-letter queue no longer takes what the dead-letter exchange routes: a message
    // the main queue dead-letters stays in it (`at-least-once`) until a target confirms it.
    channel
        .queue_unbind(
            busy.dead_letter_queue.as_str().into(),
            busy.dead_letter_exchange.as_str().into(),
            "".into(),
            FieldTable::default(),
        )
        .await
        .expect("unbind the dead-letter queue");
    channel
        .basic_publish(
            busy.exchange.as_str().into(),
            busy.routing_key.as_str().into(),
            BasicPublishOptions::default(),
            b"{}",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("routed");
    let delivery = eventually(
        "the message is in the queue",
        Duration::from_secs(20),
        || {
            let channel = channel.clone();
            let queue = busy.queue.clone();
            async move {
                channel
                    .basic_get(queue.as_str().into(), BasicGetOptions::default())
                    .await
                    .expect("get")
            }
        },
    )
    .await;
    delivery
        .reject(BasicRejectOptions { requeue: false })
        .await
        .expect("reject");
    // What RabbitMQ reports of it: neither ready nor unacknowledged, but dead-lettered.
    let http = reqwest::Client::new();
    let queue_url = format!(
        "{}/api/queues/%2F/{}",
        management.replace("guest:guest@", ""),
        busy.queue
    );
    eventually(
        "the management API shows the dead letter in transit",
        Duration::from_secs(30),
        || async {
            let queue: Value = http
                .get(&queue_url)
                .basic_auth("guest", Some("guest"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let shows = |field: &str| queue[field].as_u64();
            (shows("messages_dlx") == Some(1)
                && shows("messages_ready") == Some(0)
                && shows("messages_unacknowledged") == Some(0))
            .then_some(())
        },
    )
    .await;

    // Both fences read the same broker with the same timing: the idle one concludes, the
    // busy one must not, neither then nor a stats interval later.
    let fence = |topology: &Topology| {
        let namespace = topology.exchange.trim_end_matches(".orders").to_string();
        Fence::new(&broker.amqp_url(), &management, &namespace).expect("fence")
    };
    let (busy_fence, idle_fence) = (fence(&busy), fence(&idle));
    // Checks, 500 ms apart, the busy fence must go on refusing after the idle one concluded.
    let after = 2 * (STATS_INTERVAL.as_millis() / 500) as usize;
    let mut idle_drained = None;
    for call in 0.. {
        let (busy_now, idle_now) = tokio::join!(busy_fence.drained(1, 0), idle_fence.drained(1, 0));
        assert!(
            !busy_now.expect("fence check"),
            "the fence said drained at call {call} with a dead letter in transit (the idle \
             namespace's said so at call {idle_drained:?})"
        );
        if idle_drained.is_none() && idle_now.expect("fence check") {
            idle_drained = Some(call);
        }
        match idle_drained {
            Some(at) if call >= at + after => break,
            None => assert!(
                call < 120,
                "the idle namespace's fence did not conclude in a minute"
            ),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = connection.close(200, "done".into()).await;
}

/// Publishes a purchase for `user_id` straight to the order queue, as anyone reaching the
/// broker could: unsigned, or signed with `key` (not the services' key).
async fn forge(
    app: &TestApp,
    channel: &lapin::Channel,
    product: i64,
    user_id: i64,
    key: Option<&str>,
) {
    let msg = OrderMessage {
        request_id: uuid::Uuid::now_v7(),
        user_id,
        product_id: product,
        price_cents: 0,
        created_at: chrono::Utc::now(),
        bucket: None,
    };
    let body = serde_json::to_vec(&msg).expect("json");
    let mut headers = FieldTable::default();
    if let Some(key) = key {
        let signature = OrderSigner::new(key).sign(&body);
        headers.insert(
            HEADER_SIGNATURE.into(),
            AMQPValue::LongString(signature.into()),
        );
    }
    let topology = app.ns.topology();
    let confirmation = channel
        .basic_publish(
            topology.exchange.as_str().into(),
            topology.routing_key.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &body,
            BasicProperties::default()
                .with_message_id(msg.request_id.to_string().into())
                .with_delivery_mode(2)
                .with_headers(headers),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(
        matches!(confirmation, Confirmation::Ack(None)),
        "not routed: {confirmation:?}"
    );
}

/// Live orders of `product` in Postgres.
async fn live_orders(db: &sqlx::PgPool, product: i64) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE product_id = $1 AND status <> 'cancelled'",
    )
    .bind(product)
    .fetch_one(db)
    .await
    .expect("orders")
}

#[tokio::test]
async fn a_rebuilt_ledger_holds_no_unit_and_no_buyer_for_a_forged_dead_letter() {
    let app = spawn_app().await;
    let product = app.create_product_in_buckets(5, 2).await;
    app.wait_ready().await;
    assert_eq!(app.purchase(product, 1).await.status(), 202);
    let orders = order_service::Application::build(order_service::Settings {
        backend: app.ns.backend_settings(),
        port: 0,
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    let stop_orders = orders.shutdown_token();
    let orders = tokio::spawn(orders.run_until_stopped());
    // A forger orders for users 20 (unsigned) and 21 (another key): refused and parked.
    let (_connection, channel) = app.ns.channel().await;
    forge(&app, &channel, product, 20, None).await;
    forge(&app, &channel, product, 21, Some("not-the-key")).await;
    let db = app.ns.db().await;
    let wait = Duration::from_secs(30);
    eventually(
        "the forgeries parked, user 1's order written",
        wait,
        || async {
            let parked: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM dead_letters WHERE product_id = $1 \
               AND error_code IN ('unsigned', 'bad_signature')",
            )
            .bind(product)
            .fetch_one(&db)
            .await
            .expect("parked");
            (parked == 2 && live_orders(&db, product).await == 1).then_some(())
        },
    )
    .await;

    // Redis loses the ledger; it is rebuilt from Postgres.
    wipe(&app, product).await;
    // Two quiet readings of the management API 6 s apart, after the fence stood 6 s: a
    // loaded broker may take a while.
    eventually("sales resume", Duration::from_secs(120), || async {
        (app.purchase(product, 2).await.status() == 202).then_some(())
    })
    .await;
    eventually("user 2's order written", wait, || async {
        (app.result(product, 2).await["status"] == "success").then_some(())
    })
    .await;
    // 5 units: user 1's order, user 2's, three on sale. None held for a forgery.
    let stock = ledger_state(&app, product).await;
    assert_eq!(stock["redis_remaining"], 3, "{stock}");
    assert_eq!(stock["in_flight"], 0, "{stock}");
    assert_eq!(stock["drift"], 0, "{stock}");
    // The users the forger named bought nothing: they may buy, like anyone.
    for user in [20, 21] {
        assert_eq!(
            app.result(product, user).await["status"],
            "none",
            "user {user}"
        );
        assert_eq!(
            app.purchase(product, user).await.status(),
            202,
            "user {user}"
        );
    }
    // The last unit goes to a later buyer, and every 202 becomes an order.
    assert_eq!(app.purchase(product, 30).await.status(), 202);
    assert_error(app.purchase(product, 31).await, 410, "sold_out").await;
    eventually("every order written", wait, || async {
        (live_orders(&db, product).await == 5).then_some(())
    })
    .await;
    let stock_remaining: i32 =
        sqlx::query_scalar("SELECT stock_remaining FROM products WHERE id = $1")
            .bind(product)
            .fetch_one(&db)
            .await
            .expect("stock");
    assert_eq!(stock_remaining, 0);
    stop_orders.cancel();
    let _ = orders.await;
    let parked: Vec<String> = sqlx::query_scalar("SELECT error_code FROM dead_letters")
        .fetch_all(&db)
        .await
        .expect("parked");
    assert_eq!(
        parked.len(),
        2,
        "no purchase refused for want of stock: {parked:?}"
    );
    db.close().await;
    app.shutdown().await;
}
