//! Redis losing a product's ledger mid-sale: sales pause until every accepted purchase has
//! landed, then the ledger is rebuilt from Postgres and sales resume by themselves.

use std::time::Duration;

use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Confirmation};
use serde_json::Value;

use seckill_api::stock::fence::Fence;
use seckill_messaging::{HEADER_SIGNATURE, OrderMessage, OrderSigner};
use seckill_testkit::{SendAs, eventually};

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
    // Past the fence's grace and a reading: the three still wait in the queue, so it stands.
    let wiped = std::time::Instant::now();
    while wiped.elapsed() < Duration::from_secs(5) {
        assert_error(app.purchase(product, 1).await, 503, "ledger_rebuilding").await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

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

/// order-service, running in this test with a long lock wait and one slow retry tier.
async fn start_order_service(
    app: &TestApp,
) -> (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let orders = order_service::Application::build(order_service::Settings {
        backend: app.ns.backend_settings(),
        port: 0,
        lock_timeout: Duration::from_secs(3),
        retry_tiers: vec![Duration::from_secs(4)],
        max_attempts: 50,
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    let stop = orders.shutdown_token();
    let running = tokio::spawn(async move {
        let _ = orders.run_until_stopped().await;
    });
    (stop, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_product_sells_again_while_another_products_purchase_is_still_on_its_way() {
    let app = spawn_app().await;
    let (held, free) = (
        app.create_product_in_buckets(4, 2).await,
        app.create_product_in_buckets(4, 2).await,
    );
    app.wait_ready().await;
    let (stop_orders, orders) = start_order_service(&app).await;
    let db = app.ns.db().await;
    let wait = Duration::from_secs(30);
    for product in [held, free] {
        assert_eq!(app.purchase(product, 1).await.status(), 202);
    }
    eventually("both first orders written", wait, || async {
        (live_orders(&db, held).await == 1 && live_orders(&db, free).await == 1).then_some(())
    })
    .await;
    // `held`'s next purchase cannot be written while this transaction locks its row: it
    // waits in order-service's hands (3 s), goes to the retry tier (4 s), comes back, and so
    // on: on its way all along.
    let mut lock = db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM products WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *lock)
        .await
        .expect("lock the product");
    assert_eq!(app.purchase(held, 2).await.status(), 202);
    // Redis forgets both sales.
    wipe(&app, held).await;
    wipe(&app, free).await;
    let wiped = std::time::Instant::now();
    // `free` has nothing on its way: it sells again, although `held`'s purchase is still in
    // flight (a namespace-wide fence would wait for that one too).
    eventually("the free product sells again", wait, || async {
        (app.purchase(free, 3).await.status() == 202).then_some(())
    })
    .await;
    let resumed = wiped.elapsed();
    assert_eq!(
        live_orders(&db, held).await,
        1,
        "the held purchase was written"
    );
    assert_error(app.purchase(held, 3).await, 503, "ledger_rebuilding").await;
    // Through the retry tier and back, at least once: still refused.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_error(app.purchase(held, 3).await, 503, "ledger_rebuilding").await;
    let noted = transit_notes(&db, held).await;
    assert_eq!(noted, 1, "the retried purchase was not noted in transit");
    // The lock goes: the purchase lands, and only then does `held` sell again.
    lock.rollback().await.expect("unlock");
    eventually(
        "the held product sells again",
        Duration::from_secs(60),
        || async { (app.purchase(held, 3).await.status() == 202).then_some(()) },
    )
    .await;
    eventually("the three orders of the held product", wait, || async {
        (live_orders(&db, held).await == 3).then_some(())
    })
    .await;
    for user in [1, 2] {
        assert_error(app.purchase(held, user).await, 409, "already_purchased").await;
    }
    eprintln!("the free product sold again {resumed:?} after the wipe");
    stop_orders.cancel();
    let _ = orders.await;
    db.close().await;
    app.shutdown().await;
}

/// The fence reading the reports of order-service's consuming connections: a report older
/// than the quiet reading counts as holding while its connection lives (it may be a slow
/// one), and is deleted once the broker closed that connection (which returned whatever it
/// held to the queue).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_report_holds_the_fence_until_its_connection_is_closed() {
    let app = spawn_app().await;
    app.wait_ready().await;
    // A real consumer, reporting as it should: the queue's consumer count must match.
    let (stop_orders, orders) = start_order_service(&app).await;
    let db = app.ns.db().await;
    let queue = app.ns.topology().queue;
    // A consuming connection that stopped reporting (its report is a minute old), alive.
    let (connection, channel) = app.ns.channel().await;
    let alive = format!("{queue}.holder.test");
    channel
        .queue_declare(
            alive.as_str().into(),
            QueueDeclareOptions {
                exclusive: true,
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare the holder's queue");
    // And one whose connection is long gone.
    for (alive_queue, products) in [
        (alive.clone(), vec![]),
        (format!("{queue}.holder.gone"), vec![7_i64]),
    ] {
        sqlx::query(
            "INSERT INTO order_holders (id, alive_queue, as_of, consuming, products) \
             VALUES ($1, $2, now() - interval '1 minute', false, $3)",
        )
        .bind(uuid::Uuid::new_v4())
        .bind(alive_queue)
        .bind(products)
        .execute(&db)
        .await
        .expect("report");
    }
    let fence = Fence::new(
        &app.ns.amqp_url,
        &app.ns.namespace,
        db.clone(),
        Duration::ZERO,
        Duration::ZERO,
    );
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(6) {
        assert!(
            !fence.drained(1, 0).await.expect("fence check"),
            "drained with a live connection's report stale"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reports: Vec<String> =
        sqlx::query_scalar("SELECT alive_queue FROM order_holders WHERE NOT consuming")
            .fetch_all(&db)
            .await
            .expect("reports");
    assert_eq!(
        reports,
        [alive],
        "the closed connection's report was not deleted"
    );
    // The connection closes: its queue goes, and so does the fence.
    let _ = connection.close(200, "done".into()).await;
    eventually("the fence concludes", Duration::from_secs(20), || async {
        fence
            .drained(1, 0)
            .await
            .expect("fence check")
            .then_some(())
    })
    .await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM order_holders WHERE NOT consuming")
        .fetch_one(&db)
        .await
        .expect("reports");
    assert_eq!(left, 0);
    stop_orders.cancel();
    let _ = orders.await;
    db.close().await;
    app.shutdown().await;
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

/// A publish the broker holds unconfirmed (a memory alarm: the node stops reading from
/// publishing connections) may reach the queue long after its handler gave up and answered
/// `202` on the outbox. Once Redis lost that outbox, the stuck publish is the purchase's
/// only copy: the fence must wait for it, however late, and not rebuild without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_the_broker_holds_keeps_the_fence_up_until_it_lands() {
    let broker = seckill_testkit::OwnBroker::start().await;
    let mut ns = seckill_testkit::TestNamespace::new();
    ns.amqp_url = broker.amqp_url();
    let app = crate::helpers::spawn_app_in(ns, |settings| {
        settings.publish_timeout = Duration::from_millis(500);
        // The relay stays out of it: the entry is gone before it would take it over.
        settings.relay_reclaim_idle = Duration::from_secs(60);
    })
    .await;
    let product = app.create_product_in_buckets(4, 2).await;
    app.wait_ready().await;
    let (stop_orders, orders) = start_order_service(&app).await;
    let db = app.ns.db().await;
    let wait = Duration::from_secs(30);
    assert_eq!(app.purchase(product, 1).await.status(), 202);
    eventually("the first order written", wait, || async {
        (live_orders(&db, product).await == 1).then_some(())
    })
    .await;

    // The broker stops reading from publishers: user 2's publish hangs unconfirmed, and its
    // handler answers 202 on the outbox. Then Redis forgets the sale, outbox and all.
    broker.block_publishers().await;
    assert_eq!(app.purchase(product, 2).await.status(), 202);
    wipe(&app, product).await;
    let wiped = std::time::Instant::now();
    // Far past the fence's grace and its readings: the queue is empty and no consumer holds
    // anything, but user 2's purchase is still on its way.
    while wiped.elapsed() < Duration::from_secs(8) {
        let answer = app.purchase(product, 3).await;
        assert_eq!(
            answer.status(),
            503,
            "the product sold again {:?} after the wipe while a purchase was still on its way",
            wiped.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let noted = transit_notes(&db, product).await;
    assert_eq!(noted, 1, "the unconfirmed publish was not noted in transit");

    // The alarm clears: the held publish lands, and only then is the ledger rebuilt.
    broker.unblock_publishers().await;
    eventually(
        "the product sells again",
        Duration::from_secs(60),
        || async { (app.purchase(product, 3).await.status() == 202).then_some(()) },
    )
    .await;
    eventually("the three orders", wait, || async {
        (live_orders(&db, product).await == 3).then_some(())
    })
    .await;
    for user in [1, 2] {
        assert_error(app.purchase(product, user).await, 409, "already_purchased").await;
    }
    stop_orders.cancel();
    let _ = orders.await;
    db.close().await;
    app.shutdown().await;
}

/// Purchases of `product` noted in transit.
async fn transit_notes(db: &sqlx::PgPool, product: i64) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM order_transit WHERE product_id = $1")
        .bind(product)
        .fetch_one(db)
        .await
        .expect("transit notes")
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
    // The fence stands 2.5 s at least; a loaded machine may take a while more.
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
