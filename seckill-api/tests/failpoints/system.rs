//! Both services in one namespace, in this process, and the invariants of `docs/DESIGN.md`
//! §6 checked from outside: through the buyers' and the operator's routes and the stores.
//! Shared by the failpoint tests of seckill-api and of order-service (`#[path]`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{Duration as ChronoDuration, Utc};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use seckill_testkit::{SendAs, TestNamespace, eventually};

/// How long recovery may take: a relay reclaim, a retry tier, a compensation backoff, on a
/// loaded machine.
pub const RECOVERY: Duration = Duration::from_secs(90);

/// A service running in this process.
pub struct Service {
    pub address: String,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Service {
    /// Stops it (in-flight work finishes or stays where a restart finds it).
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// seckill-api as the failpoint tests run it: a relay that reclaims a handler's entry soon.
pub fn api_settings(ns: &TestNamespace) -> seckill_api::Settings {
    seckill_api::Settings {
        backend: ns.backend_settings(),
        port: 0,
        relay_reclaim_idle: Duration::from_millis(500),
        ..seckill_api::Settings::default()
    }
}

/// order-service as the failpoint tests run it: compensations relayed within 50 ms.
pub fn orders_settings(ns: &TestNamespace) -> order_service::Settings {
    order_service::Settings {
        backend: ns.backend_settings(),
        port: 0,
        requeue_delay: Duration::from_millis(100),
        compensation_poll: Duration::from_millis(50),
        ..order_service::Settings::default()
    }
}

pub async fn spawn_api(settings: seckill_api::Settings) -> Service {
    let app = seckill_api::Application::build(settings)
        .await
        .expect("build seckill-api");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    Service {
        address,
        stop,
        task,
    }
}

pub async fn spawn_orders(settings: order_service::Settings) -> Service {
    let app = order_service::Application::build(settings)
        .await
        .expect("build order-service");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    Service {
        address,
        stop,
        task,
    }
}

/// One purchase's answer.
#[derive(Debug, Clone)]
pub struct Bought {
    pub status: u16,
    pub request_id: Option<Uuid>,
}

/// seckill-api and order-service sharing a namespace.
pub struct System {
    pub ns: TestNamespace,
    pub api: Service,
    /// `None` while order-service is stopped (or runs as a process of the test's own).
    pub orders: Option<Service>,
    pub client: reqwest::Client,
    pub db: sqlx::PgPool,
    /// Every 202: (buyer, the purchase's request id), in order.
    pub accepted: Vec<(i64, Uuid)>,
    /// Buyers answered a 5xx or nothing: they may have bought.
    pub indefinite: Vec<i64>,
}

impl System {
    pub async fn start() -> Self {
        Self::start_with(|_| {}, |_| {}).await
    }

    /// Both services, each with its settings adjusted.
    pub async fn start_with(
        api: impl FnOnce(&mut seckill_api::Settings),
        orders: impl FnOnce(&mut order_service::Settings),
    ) -> Self {
        let ns = TestNamespace::new();
        let mut api_settings = api_settings(&ns);
        api(&mut api_settings);
        let api = spawn_api(api_settings).await;
        let mut orders_settings = orders_settings(&ns);
        orders(&mut orders_settings);
        let orders = spawn_orders(orders_settings).await;
        let db = ns.db().await;
        let system = Self {
            ns,
            api,
            orders: Some(orders),
            client: reqwest::Client::new(),
            db,
            accepted: Vec::new(),
            indefinite: Vec::new(),
        };
        system.wait_ready().await;
        system
    }

    /// Waits until seckill-api's `/readyz` answers 200 (its publishers connected).
    pub async fn wait_ready(&self) {
        eventually("seckill-api ready", Duration::from_secs(30), || async {
            let ready = self
                .client
                .get(format!("{}/readyz", self.api.address))
                .send()
                .await;
            ready.ok().filter(|r| r.status() == 200).map(|_| ())
        })
        .await;
    }

    /// Replaces seckill-api by a new instance in the same namespace (a restart).
    pub async fn restart_api(&mut self, settings: seckill_api::Settings) {
        let old = std::mem::replace(&mut self.api, spawn_api(settings).await);
        old.stop().await;
        self.wait_ready().await;
    }

    /// Stops order-service, if it runs here.
    pub async fn stop_orders(&mut self) {
        if let Some(orders) = self.orders.take() {
            orders.stop().await;
        }
    }

    /// Starts order-service (again) in this process.
    pub async fn start_orders(&mut self) {
        self.stop_orders().await;
        self.orders = Some(spawn_orders(orders_settings(&self.ns)).await);
    }

    /// A product on sale now with `stock` units in `buckets` buckets.
    pub async fn product(&self, stock: i32, buckets: i16) -> i64 {
        let now = Utc::now();
        let response = self
            .client
            .post(format!("{}/admin/products", self.api.address))
            .json(&json!({
                "name": "failpoint product",
                "price_cents": 500,
                "stock": stock,
                "buckets": buckets,
                "start_at": now - ChronoDuration::seconds(60),
                "end_at": now + ChronoDuration::hours(1),
            }))
            .send_as("seckill-api", 1, &["admin"])
            .await
            .expect("create product");
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.expect("json");
        body["id"].as_i64().expect("id")
    }

    /// `user` buys one unit, with `key` as its `Idempotency-Key` if given; the answer is
    /// remembered for [`Self::check`].
    pub async fn buy_keyed(&mut self, product: i64, user: i64, key: Option<&str>) -> Bought {
        let mut request = self
            .client
            .post(format!("{}/api/seckill/{product}", self.api.address));
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        let bought = match request.send_as("seckill-api", user, &[]).await {
            Ok(response) => {
                let status = response.status().as_u16();
                let body: Value = response.json().await.unwrap_or_default();
                let request_id = body["request_id"].as_str().and_then(|id| id.parse().ok());
                Bought { status, request_id }
            }
            Err(_) => Bought {
                status: 0,
                request_id: None,
            },
        };
        match bought.status {
            202 => {
                let id = bought.request_id.expect("a 202 names its purchase");
                if !self.accepted.contains(&(user, id)) {
                    self.accepted.push((user, id));
                }
            }
            0 | 500.. => self.indefinite.push(user),
            _ => {}
        }
        bought
    }

    pub async fn buy(&mut self, product: i64, user: i64) -> Bought {
        self.buy_keyed(product, user, None).await
    }

    /// The sum of a Prometheus metric's samples (every label set), as seckill-api exports
    /// it; both services of this process record into the same registry.
    pub async fn metric(&self, name: &str) -> f64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.api.address))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text");
        text.lines()
            .filter(|line| {
                line.strip_prefix(name).is_some_and(|rest| {
                    rest.starts_with(' ') || (rest.starts_with('{') && !name.contains('{'))
                })
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    }

    /// How often `failpoint` returned early in this process (`failpoints_fired_total`).
    pub async fn fired(&self, failpoint: &str) -> f64 {
        let sample = format!("failpoints_fired_total{{failpoint=\"{failpoint}\"}}");
        self.metric(&sample).await
    }

    /// Waits until `failpoint` has returned early more than `before` times.
    pub async fn wait_fired(&self, failpoint: &str, before: f64) {
        eventually(&format!("{failpoint} fired"), RECOVERY, || async {
            (self.fired(failpoint).await > before).then_some(())
        })
        .await;
    }

    /// The buyer's result: `none`, `queued`, `success` or `failed`.
    pub async fn result(&self, product: i64, user: i64) -> Value {
        self.client
            .get(format!("{}/api/seckill/{product}/result", self.api.address))
            .send_as("seckill-api", user, &[])
            .await
            .expect("result")
            .json()
            .await
            .expect("json")
    }

    /// seckill-api's reconciliation view of the product.
    pub async fn stock(&self, product: i64) -> Value {
        let response = self
            .client
            .get(format!(
                "{}/admin/products/{product}/stock",
                self.api.address
            ))
            .send_as("seckill-api", 1, &["admin"])
            .await
            .expect("stock report");
        assert_eq!(response.status(), 200);
        response.json().await.expect("json")
    }

    /// The buyer's order of the product: (id, request id, status).
    pub async fn order_of(&self, product: i64, user: i64) -> Option<(i64, Uuid, String)> {
        sqlx::query_as(
            "SELECT id, request_id, status FROM orders WHERE product_id = $1 AND user_id = $2 \
             ORDER BY id DESC LIMIT 1",
        )
        .bind(product)
        .bind(user)
        .fetch_optional(&self.db)
        .await
        .expect("order")
    }

    /// Waits until the buyer has an order of the product; its id.
    pub async fn wait_order(&self, product: i64, user: i64) -> i64 {
        eventually("the buyer's order", RECOVERY, || async {
            self.order_of(product, user).await.map(|(id, _, _)| id)
        })
        .await
    }

    /// `POST /api/orders/{id}/{action}` on order-service as `user`; the status.
    pub async fn order_action(&self, user: i64, order: i64, action: &str) -> u16 {
        let address = &self.orders.as_ref().expect("order-service runs").address;
        self.client
            .post(format!("{address}/api/orders/{order}/{action}"))
            .send_as("order-service", user, &[])
            .await
            .expect("order action")
            .status()
            .as_u16()
    }

    /// Waits until the system is quiet — nothing in flight, in an outbox or waiting to be
    /// given back — and every unit is accounted for (`drift` 0); returns the report.
    pub async fn quiet(&self, product: i64) -> Value {
        let deadline = Instant::now() + RECOVERY;
        loop {
            let report = self.stock(product).await;
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM compensations WHERE done_at IS NULL AND product_id = $1",
            )
            .bind(product)
            .fetch_one(&self.db)
            .await
            .expect("compensations");
            let quiet = report["in_flight"] == 0 && report["outbox"] == 0 && pending == 0;
            if quiet && report["drift"] == 0 {
                return report;
            }
            assert!(
                Instant::now() < deadline,
                "not quiet with drift 0 after {RECOVERY:?}: {report} ({pending} compensations pending)"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The invariants, once the system has recovered:
    /// - quiet with drift 0 (every unit on sale, in flight, or an order);
    /// - every 202 is an order (its buyer's result `success`) or a cancelled one (result
    ///   `failed`, its unit back); no purchase is written twice, no buyer holds two live
    ///   orders, nothing is oversold; nothing sits in the parking lot;
    /// - a buyer answered a 4xx bought nothing;
    /// - no buyer is locked out: one whose purchase failed, or who never bought, buys what
    ///   is left, each within the sold-out bound (a `410` only while a replica's memory of
    ///   a flag may still hold: 500 ms, plus a margin for a loaded machine), and then the
    ///   product is sold out, exactly at its stock.
    pub async fn check(&mut self, product: i64, stock: i64) {
        self.quiet(product).await;
        self.check_orders(product, stock).await;
        // Everyone who holds nothing now may buy; first those whose purchase failed.
        let mut buyers: Vec<i64> = Vec::new();
        let users = self.accepted.iter().map(|(user, _)| *user);
        for user in users
            .chain(self.indefinite.iter().copied())
            .collect::<Vec<_>>()
        {
            match self.order_of(product, user).await {
                Some((_, _, status)) if status != "cancelled" => {}
                _ => buyers.push(user),
            }
        }
        buyers.sort_unstable();
        buyers.dedup();
        let live = self.live_orders(product).await;
        let left = stock - live;
        let mut fresh = 1_000_000;
        while (buyers.len() as i64) < left {
            buyers.push(fresh);
            fresh += 1;
        }
        for &user in buyers.iter().take(usize::try_from(left).unwrap_or(0)) {
            let started = Instant::now();
            loop {
                let bought = self.buy(product, user).await;
                if bought.status == 202 {
                    break;
                }
                assert!(
                    bought.status == 410
                        && started.elapsed() < Duration::from_millis(500) + Duration::from_secs(3),
                    "user {user} could not buy one of the {left} units left: {}",
                    bought.status
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let after = self.buy(product, 999_999).await;
        assert_eq!(after.status, 410, "sold out once every unit is sold");
        self.quiet(product).await;
        self.check_orders(product, stock).await;
        assert_eq!(self.live_orders(product).await, stock, "every unit sold");
    }

    async fn live_orders(&self, product: i64) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM orders WHERE product_id = $1 AND status <> 'cancelled'",
        )
        .bind(product)
        .fetch_one(&self.db)
        .await
        .expect("orders")
    }

    /// Orders against the answers: see [`Self::check`].
    async fn check_orders(&self, product: i64, stock: i64) {
        let orders: Vec<(Uuid, i64, String)> =
            sqlx::query_as("SELECT request_id, user_id, status FROM orders WHERE product_id = $1")
                .bind(product)
                .fetch_all(&self.db)
                .await
                .expect("orders");
        let live = orders.iter().filter(|o| o.2 != "cancelled").count() as i64;
        assert!(live <= stock, "oversold: {live} live orders of {stock}");
        let mut by_request: HashMap<Uuid, usize> = HashMap::new();
        let mut live_by_user: HashMap<i64, usize> = HashMap::new();
        for (request_id, user, status) in &orders {
            *by_request.entry(*request_id).or_default() += 1;
            if status != "cancelled" {
                *live_by_user.entry(*user).or_default() += 1;
            }
        }
        assert!(
            by_request.values().all(|&n| n == 1),
            "a purchase written twice"
        );
        assert!(
            live_by_user.values().all(|&n| n == 1),
            "a buyer holds two live orders"
        );
        // The buyer's result is their latest purchase's.
        let mut latest: HashMap<i64, Uuid> = HashMap::new();
        for &(user, request_id) in &self.accepted {
            latest.insert(user, request_id);
            let order = orders.iter().find(|o| o.0 == request_id);
            assert!(
                order.is_some(),
                "user {user}'s 202 ({request_id}) is no order"
            );
        }
        for (user, request_id) in latest {
            let result = self.result(product, user).await;
            match orders.iter().find(|o| o.0 == request_id) {
                Some((_, _, status)) if status != "cancelled" => {
                    assert_eq!(result["status"], "success", "user {user}: {result}")
                }
                _ => assert_eq!(result["status"], "failed", "user {user}: {result}"),
            }
        }
        for (request_id, user, _) in &orders {
            let answered = self.accepted.contains(&(*user, *request_id));
            assert!(
                answered || self.indefinite.contains(user),
                "user {user} has an order ({request_id}) although answered a 4xx"
            );
        }
        let parked: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
            .fetch_one(&self.db)
            .await
            .expect("dead letters");
        assert_eq!(parked, 0, "a purchase was dead-lettered");
    }

    pub async fn shutdown(mut self) {
        self.stop_orders().await;
        self.api.stop().await;
        self.db.close().await;
        self.ns.cleanup().await;
    }
}
