//! `spawn_app()`: order-service on port 0 in a private namespace, plus a publisher.

use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, PublisherConfirm};
use tokio_util::sync::CancellationToken;

use order_service::{Application, Settings};
use seckill_messaging::{
    HEADER_ERROR_CODE, HEADER_ERROR_MESSAGE, HEADER_SIGNATURE, OrderMessage, OrderSigner,
};
use seckill_testkit::{SendAs, TestNamespace};

pub struct TestApp {
    pub address: String,
    pub ns: TestNamespace,
    pub db: sqlx::PgPool,
    pub channel: Channel,
    /// Signs what the tests publish, with the key the app was given.
    pub signer: OrderSigner,
    _connection: Connection,
    /// The queues of this app's retry tiers, where a message waits out a retry.
    retry_queues: Vec<String>,
    /// Longer than a batch holds a delivery before failing it to a retry tier.
    settle: std::time::Duration,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_in(TestNamespace::new()).await
}

/// order-service in an existing namespace (another replica, or a restart).
pub async fn spawn_app_in(ns: TestNamespace) -> TestApp {
    spawn_app_with(ns, |_| {}).await
}

/// order-service in `ns` with settings adjusted by `configure`.
pub async fn spawn_app_with(ns: TestNamespace, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = Settings {
        backend: ns.backend_settings(),
        port: 0,
        requeue_delay: Duration::from_millis(100),
        ..Settings::default()
    };
    configure(&mut settings);
    let signer = OrderSigner::new(settings.backend.order_signing_key.expose());
    let topology = ns.topology();
    let retry_queues = settings
        .retry_tiers
        .iter()
        .map(|tier| topology.retry_queue(u64::try_from(tier.as_millis()).expect("a short tier")))
        .collect();
    let settle = settings.lock_timeout + std::time::Duration::from_secs(1);
    let app = Application::build(settings)
        .await
        .expect("build order-service");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    let db = ns.db().await;
    let (connection, channel) = ns.channel().await;
    TestApp {
        address,
        ns,
        db,
        channel,
        signer,
        _connection: connection,
        retry_queues,
        settle,
        stop,
        task: Some(task),
    }
}

impl TestApp {
    /// Inserts a product on sale with `stock` units; returns its id.
    pub async fn product(&self, stock: i32) -> i64 {
        let now = Utc::now();
        sqlx::query_scalar(
            "INSERT INTO products (name, price_cents, stock_total, stock_remaining, start_at, end_at) \
             VALUES ('p', 500, $1, $1, $2, $3) RETURNING id",
        )
        .bind(stock)
        .bind(now - ChronoDuration::minutes(1))
        .bind(now + ChronoDuration::hours(1))
        .fetch_one(&self.db)
        .await
        .expect("insert product")
    }

    pub fn message(&self, product_id: i64, user_id: i64) -> OrderMessage {
        OrderMessage {
            request_id: uuid::Uuid::now_v7(),
            user_id,
            product_id,
            price_cents: 500,
            created_at: Utc::now(),
            bucket: None,
        }
    }

    /// Sends raw bytes the way the relay does (persistent, mandatory, signed); the returned
    /// confirm is checked by [`routed`].
    async fn send(&self, body: &[u8], message_id: &str) -> PublisherConfirm {
        let signature = self.signer.sign(body);
        self.send_with(body, message_id, Some(&signature)).await
    }

    /// Sends raw bytes with `signature` as their order signature header (none if `None`).
    async fn send_with(
        &self,
        body: &[u8],
        message_id: &str,
        signature: Option<&str>,
    ) -> PublisherConfirm {
        let topology = self.ns.topology();
        let headers = signed(FieldTable::default(), signature);
        self.send_to(
            &topology.exchange,
            &topology.routing_key,
            body,
            message_id,
            headers,
        )
        .await
    }

    /// Sends raw bytes to `exchange` with `headers` (persistent, mandatory).
    async fn send_to(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        message_id: &str,
        headers: FieldTable,
    ) -> PublisherConfirm {
        self.channel
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body,
                BasicProperties::default()
                    .with_message_id(message_id.into())
                    .with_delivery_mode(2)
                    .with_headers(headers),
            )
            .await
            .expect("publish")
    }

    /// Publishes raw bytes the way the relay does, waiting for the broker's confirm.
    pub async fn publish_raw(&self, body: &[u8], message_id: &str) {
        routed(self.send(body, message_id).await).await;
    }

    /// Publishes `msg` with `signature` (or none) instead of its own, as an attacker who
    /// reaches the queue would.
    pub async fn publish_signed_as(&self, msg: &OrderMessage, signature: Option<&str>) {
        let body = serde_json::to_vec(msg).expect("serialize");
        let message_id = msg.request_id.to_string();
        routed(self.send_with(&body, &message_id, signature).await).await;
    }

    /// Publishes `msg` straight to the dead-letter exchange with `signature` (or none) and
    /// the reason `error_code`, as anyone who reaches the broker could: a dead letter that
    /// order-service never gave up, claiming whatever reason its publisher chose.
    pub async fn publish_dead_letter(
        &self,
        msg: &OrderMessage,
        signature: Option<&str>,
        error_code: &str,
    ) {
        let body = serde_json::to_vec(msg).expect("serialize");
        let mut headers = FieldTable::default();
        headers.insert(
            HEADER_ERROR_CODE.into(),
            AMQPValue::LongString(error_code.into()),
        );
        headers.insert(
            HEADER_ERROR_MESSAGE.into(),
            AMQPValue::LongString(format!("claimed: {error_code}").into()),
        );
        let headers = signed(headers, signature);
        let dlx = self.ns.topology().dead_letter_exchange;
        let message_id = msg.request_id.to_string();
        routed(self.send_to(&dlx, "", &body, &message_id, headers).await).await;
    }

    /// Publishes every message with all confirms in flight at once (a storm, not a trickle).
    pub async fn publish_many(&self, msgs: &[OrderMessage]) {
        let mut confirms = Vec::with_capacity(msgs.len());
        for msg in msgs {
            let body = serde_json::to_vec(msg).expect("serialize");
            confirms.push(self.send(&body, &msg.request_id.to_string()).await);
        }
        for confirm in confirms {
            routed(confirm).await;
        }
    }

    /// Publishes `parts` as one batch message (group commit, `seckill_messaging::batch`) to
    /// `exchange` (the order exchange unless given), each part's body signed with the
    /// signature given beside it (the service's own when `None`), with `headers` on the
    /// batch. Waits for the confirm.
    pub async fn publish_batch_to(
        &self,
        exchange: Option<&str>,
        parts: &[(OrderMessage, Option<String>)],
        headers: &[(&str, AMQPValue)],
    ) {
        let entries: Vec<String> = parts
            .iter()
            .map(|(msg, signature)| {
                let body = serde_json::to_string(msg).expect("serialize");
                let signature = signature
                    .clone()
                    .unwrap_or_else(|| self.signer.sign(body.as_bytes()));
                format!(
                    r#"{{"signature":{},"http_request_id":"batch-test","order":{body}}}"#,
                    serde_json::to_string(&signature).expect("string")
                )
            })
            .collect();
        let body = format!(r#"{{"orders":[{}]}}"#, entries.join(","));
        let mut properties = seckill_messaging::batch::properties(parts.len());
        let mut table = properties.headers().clone().unwrap_or_default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        properties = properties.with_headers(table);
        let topology = self.ns.topology();
        let (exchange, routing_key) = match exchange {
            Some(exchange) => (exchange.to_string(), String::new()),
            None => (topology.exchange, topology.routing_key),
        };
        let confirm = self
            .channel
            .basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                body.as_bytes(),
                properties,
            )
            .await
            .expect("publish");
        routed(confirm).await;
    }

    pub async fn publish(&self, msg: &OrderMessage) {
        let body = serde_json::to_vec(msg).expect("serialize");
        self.publish_raw(&body, &msg.request_id.to_string()).await;
    }

    /// `GET path` on order-service as `user_id` (with the gateway's identity headers).
    pub async fn get_as(&self, user_id: i64, path: &str) -> reqwest::Response {
        reqwest::Client::new()
            .get(format!("{}{path}", self.address))
            .send_as("order-service", user_id, &[])
            .await
            .expect("request")
    }

    /// Waits until each part of the service that declares the topology has declared it: the
    /// queue watch has read the dead-letter queue (it declares everything before reading),
    /// and the consumer and the dead-letter recorder consume their queues (each declares
    /// before consuming). A test that unbinds or deletes part of the topology does it after
    /// this, or a part still starting puts back what the test took away.
    pub async fn topology_declared(&self) {
        let topology = self.ns.topology();
        let watched = format!("queue=\"{}\"", topology.dead_letter_queue);
        seckill_testkit::eventually(
            "the topology declared by every part",
            Duration::from_secs(20),
            || async {
                let text = self.get_as(1, "/metrics").await.text().await.ok()?;
                text.lines()
                    .any(|l| l.starts_with("amqp_queue_messages{") && l.contains(&watched))
                    .then_some(())?;
                for queue in [&topology.queue, &topology.dead_letter_queue] {
                    (self.ns.queue_consumers(&self.channel, queue).await > 0).then_some(())?;
                }
                Some(())
            },
        )
        .await;
    }

    /// Dead letters anywhere: still in the dead-letter queue, or already parked in Postgres.
    pub async fn dead_letters(&self) -> i64 {
        let dlq = self.ns.topology().dead_letter_queue;
        let depth = i64::from(self.ns.queue_depth(&self.channel, &dlq).await);
        depth + self.parked().await.len() as i64
    }

    /// The parking lot: (event id, error code, status, attempts), oldest first.
    pub async fn parked(&self) -> Vec<(String, String, String, i32)> {
        sqlx::query_as(
            "SELECT event_id, error_code, status, attempts FROM dead_letters \
             ORDER BY first_seen, event_id",
        )
        .fetch_all(&self.db)
        .await
        .expect("parked")
    }

    /// Waits until exactly `count` entries are parked, and returns them.
    pub async fn wait_parked(&self, count: usize) -> Vec<(String, String, String, i32)> {
        let wait = std::time::Duration::from_secs(20);
        seckill_testkit::eventually("dead letters parked", wait, || async {
            let parked = self.parked().await;
            (parked.len() == count).then_some(parked)
        })
        .await
    }

    pub async fn order_count(&self, product_id: i64) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE product_id = $1")
            .bind(product_id)
            .fetch_one(&self.db)
            .await
            .expect("count")
    }

    pub async fn stock_remaining(&self, product_id: i64) -> i32 {
        sqlx::query_scalar("SELECT stock_remaining FROM products WHERE id = $1")
            .bind(product_id)
            .fetch_one(&self.db)
            .await
            .expect("stock")
    }

    pub async fn stored_result(&self, product_id: i64, user_id: i64) -> Option<String> {
        let mut redis = self.ns.redis().await;
        redis::cmd("HGET")
            .arg(self.ns.keys().result_of(product_id, 1, user_id)) // products made here have one bucket
            .arg(user_id)
            .query_async(&mut redis)
            .await
            .expect("hget")
    }

    /// Waits until the consumer has taken every message, stops the service (which finishes
    /// and settles what it holds), then checks that nothing went back to the queue: after
    /// this, the database shows the final effect of everything published.
    ///
    /// A message that failed for a moment (a lock held by a killed writer, a slow Redis) is
    /// not in the queue while it waits out its retry tier, and comes back after: the queue
    /// counts as drained only when the retry tiers' queues are empty too.
    pub async fn stop_when_drained(&mut self) {
        // Tiers first: a message moving from a tier to the main queue between two reads is
        // then seen in the second.
        let mut queues = self.retry_queues.clone();
        queues.push(self.ns.topology().queue);
        let waiting = || async {
            let mut waiting = 0;
            for queue in &queues {
                waiting += self.ns.queue_depth(&self.channel, queue).await;
            }
            waiting
        };
        // The consumer's unacked deliveries show nowhere: one whose write fails (a lock held
        // past `lock_timeout`) reaches a tier only later. So the backlog must stay empty for
        // longer than that. The longest default tier is 30 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut empty_since = None;
        loop {
            let backlog = waiting().await;
            if backlog > 0 {
                empty_since = None;
            } else if empty_since
                .get_or_insert_with(std::time::Instant::now)
                .elapsed()
                >= self.settle
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{backlog} message(s) still queued or waiting out a retry after 60 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        assert_eq!(waiting().await, 0, "a message was requeued or retried");
    }

    /// Stops this app's consumer (its unacked deliveries go back to the queue) and keeps
    /// the namespace, the database handle and the publishing channel.
    pub async fn stop_consuming(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        if let Some(task) = self.task {
            let _ = task.await;
        }
        self.db.close().await;
        self.ns.cleanup().await;
    }
}

/// `headers` with `signature` as the order signature header (none if `None`).
fn signed(mut headers: FieldTable, signature: Option<&str>) -> FieldTable {
    if let Some(signature) = signature {
        headers.insert(
            HEADER_SIGNATURE.into(),
            AMQPValue::LongString(signature.into()),
        );
    }
    headers
}

/// Waits for `confirm` and asserts the broker took the message and routed it to a queue.
async fn routed(confirm: PublisherConfirm) {
    let confirmation = confirm.await.expect("confirm");
    assert!(
        matches!(confirmation, Confirmation::Ack(None)),
        "not published and routed: {confirmation:?}"
    );
}
