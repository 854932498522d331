//! Failures that must not lose or duplicate an accepted purchase: a replica killed with
//! `kill -9` while its relay holds unconfirmed entries, and a broker outage mid-sale. Each
//! test runs its own RabbitMQ node (the shared one is never stopped).

use std::collections::HashSet;
use std::process::Stdio;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use seckill_testkit::{OwnBroker, SendAs, TestNamespace, eventually, free_port};

use crate::helpers::{create_product_at, settings_for};

/// A running service of the test: where it listens and how to stop it.
struct Running {
    address: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn spawn_api(ns: &TestNamespace, amqp_url: &str) -> Running {
    let mut settings = settings_for(ns);
    settings.backend.amqp_url = seckill_config::Secret::new(amqp_url);
    // Take over a dead replica's pending entries quickly.
    settings.relay_reclaim_idle = Duration::from_millis(500);
    let app = seckill_api::Application::build(settings)
        .await
        .expect("build seckill-api");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    Running {
        address,
        stop,
        task,
    }
}

async fn spawn_orders(ns: &TestNamespace, amqp_url: &str) -> Running {
    let mut backend = ns.backend_settings();
    backend.amqp_url = seckill_config::Secret::new(amqp_url);
    let app = order_service::Application::build(order_service::Settings {
        backend,
        port: 0,
        requeue_delay: Duration::from_millis(100),
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    Running {
        address,
        stop,
        task,
    }
}

/// Buys for each of `users`, returning the request ids of the 202s.
async fn buy(
    client: &reqwest::Client,
    address: &str,
    product: i64,
    users: std::ops::RangeInclusive<i64>,
) -> Vec<Uuid> {
    let mut accepted = Vec::new();
    for user in users {
        let response = client
            .post(format!("{address}/api/seckill/{product}"))
            .send_as("seckill-api", user, &[])
            .await
            .expect("purchase");
        let status = response.status().as_u16();
        assert!(matches!(status, 202 | 410), "user {user}: {status}");
        if status == 202 {
            let body: Value = response.json().await.expect("json");
            let id = body["request_id"].as_str().expect("request_id");
            accepted.push(id.parse().expect("uuid"));
        }
    }
    accepted
}

fn on_sale_now() -> (chrono::DateTime<Utc>, chrono::DateTime<Utc>) {
    let now = Utc::now();
    (
        now - ChronoDuration::minutes(1),
        now + ChronoDuration::hours(1),
    )
}

/// Waits until each accepted request id is exactly one order and nothing else is.
async fn assert_exactly_one_order_each(ns: &TestNamespace, product: i64, accepted: &[Uuid]) {
    let db = ns.db().await;
    let expected = accepted.len() as i64;
    eventually(
        "every accepted purchase is an order",
        Duration::from_secs(60),
        || async {
            let (orders, distinct): (i64, i64) = sqlx::query_as(
                "SELECT count(*), count(DISTINCT request_id) FROM orders WHERE product_id = $1",
            )
            .bind(product)
            .fetch_one(&db)
            .await
            .expect("count orders");
            assert!(
                orders <= expected,
                "more orders ({orders}) than acceptances ({expected})"
            );
            assert_eq!(orders, distinct, "a purchase was written twice");
            (orders == expected).then_some(())
        },
    )
    .await;
    let missing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM unnest($1::uuid[]) AS a(id) \
         WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.request_id = a.id)",
    )
    .bind(accepted)
    .fetch_one(&db)
    .await
    .expect("missing");
    assert_eq!(missing, 0, "an accepted purchase has no order");
    db.close().await;
}

/// Entries read by a relay but not yet confirmed, over the product's outbox streams.
async fn pending_entries(ns: &TestNamespace, product: i64, buckets: u16) -> i64 {
    let mut redis = ns.redis().await;
    let mut total = 0;
    for bucket in 0..buckets {
        let summary: redis::RedisResult<Vec<redis::Value>> = redis::cmd("XPENDING")
            .arg(ns.keys().outbox(product, bucket))
            .arg(seckill_api::relay::GROUP)
            .query_async(&mut redis)
            .await;
        if let Ok(summary) = summary
            && let Some(redis::Value::Int(count)) = summary.first()
        {
            total += count;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_while_the_relay_holds_unconfirmed_entries_loses_and_duplicates_nothing() {
    let broker = OwnBroker::start().await;
    let ns = TestNamespace::new();
    let client = reqwest::Client::new();

    // seckill-api as a real process, so it can be killed with SIGKILL.
    let port = free_port();
    let address = format!("http://127.0.0.1:{port}");
    let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckill-api"))
        .env("SECKILL_HOST", "127.0.0.1")
        .env("SECKILL_API_PORT", port.to_string())
        .env("SECKILL_DATABASE_URL", &ns.database_url)
        .env("SECKILL_REDIS_URL", &ns.redis_url)
        .env("SECKILL_REDIS_CLUSTER", ns.redis_cluster.to_string())
        .env("SECKILL_AMQP_URL", broker.amqp_url())
        .env("SECKILL_NAMESPACE", &ns.namespace)
        .env("SECKILL_INTERNAL_KEY", seckill_testkit::INTERNAL_KEY)
        // The order signing key stays the public default the in-process services use.
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .env("SECKILL_LOG_FILTER", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the seckill-api binary");
    eventually(
        "seckill-api process ready",
        Duration::from_secs(30),
        || async {
            let ready = client.get(format!("{address}/readyz")).send().await;
            ready.ok().filter(|r| r.status() == 200).map(|_| ())
        },
    )
    .await;
    let (start, end) = on_sale_now();
    let product = create_product_at(&client, &address, 20, start, end).await;

    // The broker stops reading from publishers: the relay publishes, and waits for confirms
    // that do not come. Its entries sit unconfirmed in its pending list.
    broker.block_publishers().await;
    let accepted = buy(&client, &address, product, 1..=30).await;
    assert_eq!(accepted.len(), 20);
    // The relay read what it could before its publishes stalled: those entries are pending
    // on the replica about to die; the rest were never read.
    eventually(
        "the relay holds entries unconfirmed",
        Duration::from_secs(20),
        || async { (pending_entries(&ns, product, 16).await > 0).then_some(()) },
    )
    .await;

    process.start_kill().expect("SIGKILL");
    let status = process.wait().await.expect("wait");
    assert!(!status.success(), "killed, not exited: {status}");
    broker.unblock_publishers().await;

    // A second replica reclaims the dead one's entries; order-service writes them.
    let api = spawn_api(&ns, &broker.amqp_url()).await;
    let orders = spawn_orders(&ns, &broker.amqp_url()).await;
    assert_exactly_one_order_each(&ns, product, &accepted).await;
    eventually("outbox drained", Duration::from_secs(20), || async {
        (pending_entries(&ns, product, 16).await == 0).then_some(())
    })
    .await;
    api.stop().await;
    orders.stop().await;
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_outage_mid_sale_delays_orders_but_loses_and_duplicates_none() {
    let broker = OwnBroker::start().await;
    let ns = TestNamespace::new();
    let client = reqwest::Client::new();
    let api = spawn_api(&ns, &broker.amqp_url()).await;
    let orders = spawn_orders(&ns, &broker.amqp_url()).await;
    let (start, end) = on_sale_now();
    let product = create_product_at(&client, &api.address, 150, start, end).await;

    // Before the outage: purchases flow into orders.
    let mut accepted = buy(&client, &api.address, product, 1..=60).await;
    assert_exactly_one_order_each(&ns, product, &accepted).await;

    // During the outage: Redis still decides, the outbox keeps what RabbitMQ cannot take.
    broker.stop().await;
    let during = buy(&client, &api.address, product, 61..=120).await;
    assert_eq!(
        during.len(),
        60,
        "purchases are accepted while the broker is down"
    );
    accepted.extend(during);

    // After: everything accepted during the outage flows, and the sale goes on.
    broker.restart().await;
    accepted.extend(buy(&client, &api.address, product, 121..=200).await);
    assert_eq!(accepted.len(), 150);
    let distinct: HashSet<Uuid> = accepted.iter().copied().collect();
    assert_eq!(distinct.len(), accepted.len());
    assert_exactly_one_order_each(&ns, product, &accepted).await;
    api.stop().await;
    orders.stop().await;
    ns.cleanup().await;
}
