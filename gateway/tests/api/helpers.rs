//! `spawn_platform()`: seckill-api, order-service and the gateway in-process, in a private
//! namespace, on port 0 each.

use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use reqwest::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use seckill_auth::mint_token;
use seckill_config::Secret;
use seckill_testkit::{INTERNAL_KEY, JWT_SECRET, TestNamespace, eventually};

pub struct Platform {
    pub gateway: String,
    /// The gateway's operator listener (`/metrics`, the detailed `/readyz`).
    pub gateway_admin: String,
    pub seckill_api: String,
    pub order_service: String,
    pub ns: TestNamespace,
    pub client: reqwest::Client,
    stops: Vec<CancellationToken>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn user_token(user_id: i64) -> String {
    mint_token(JWT_SECRET, user_id, &[], 600)
}

pub fn admin_token() -> String {
    mint_token(JWT_SECRET, 1, &["admin"], 600)
}

pub async fn spawn_platform() -> Platform {
    spawn_platform_with(|_| {}).await
}

/// The platform with order-service's settings adjusted by `configure`.
pub async fn spawn_platform_with(configure: impl FnOnce(&mut order_service::Settings)) -> Platform {
    spawn_platform_configured(configure, |_| {}).await
}

/// The platform with order-service's and the gateway's settings adjusted.
pub async fn spawn_platform_configured(
    configure_orders: impl FnOnce(&mut order_service::Settings),
    configure_gateway: impl FnOnce(&mut gateway::Settings),
) -> Platform {
    spawn_platform_tuned(|_| {}, configure_orders, configure_gateway).await
}

/// The platform with every service's settings adjusted.
pub async fn spawn_platform_tuned(
    configure_api: impl FnOnce(&mut seckill_api::Settings),
    configure_orders: impl FnOnce(&mut order_service::Settings),
    configure_gateway: impl FnOnce(&mut gateway::Settings),
) -> Platform {
    let ns = TestNamespace::new();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();

    let mut api_settings = seckill_api::Settings {
        backend: ns.backend_settings(),
        port: 0,
        ..seckill_api::Settings::default()
    };
    configure_api(&mut api_settings);
    let api = seckill_api::Application::build(api_settings)
        .await
        .expect("build seckill-api");
    let seckill_api = format!("http://127.0.0.1:{}", api.port());
    stops.push(api.shutdown_token());
    tasks.push(tokio::spawn(api.run_until_stopped()));

    let mut order_settings = order_service::Settings {
        backend: ns.backend_settings(),
        port: 0,
        ..order_service::Settings::default()
    };
    configure_orders(&mut order_settings);
    let orders = order_service::Application::build(order_settings)
        .await
        .expect("build order-service");
    let order_service = format!("http://127.0.0.1:{}", orders.port());
    stops.push(orders.shutdown_token());
    tasks.push(tokio::spawn(orders.run_until_stopped()));

    let mut gateway_settings = gateway_settings(&ns, &seckill_api, &order_service);
    configure_gateway(&mut gateway_settings);
    let gateway = gateway::Application::build(gateway_settings)
        .await
        .expect("build gateway");
    let gateway_url = format!("http://127.0.0.1:{}", gateway.port());
    let gateway_admin = format!("http://127.0.0.1:{}", gateway.admin_port());
    stops.push(gateway.shutdown_token());
    tasks.push(tokio::spawn(gateway.run_until_stopped()));

    Platform {
        gateway: gateway_url,
        gateway_admin,
        seckill_api,
        order_service,
        ns,
        client: reqwest::Client::new(),
        stops,
        tasks,
    }
}

/// A gateway in front of the services at `seckill_api` and `order_service`, on port 0.
fn gateway_settings(
    ns: &TestNamespace,
    seckill_api: &str,
    order_service: &str,
) -> gateway::Settings {
    let backend = ns.backend_settings();
    gateway::Settings {
        // The backends' Redis and namespace: the reopened announcements, the waiting
        // rooms, and the keys of the `redis` rate-limit backend when a test picks it.
        redis_url: backend.redis_url.clone(),
        redis_cluster: backend.redis_cluster,
        namespace: backend.namespace.clone(),
        host: "127.0.0.1".into(),
        port: 0,
        admin_port: 0,
        jwt_secret: Secret::new(JWT_SECRET),
        internal_key: Secret::new(INTERNAL_KEY),
        seckill_api_urls: vec![seckill_api.to_string()],
        order_service_urls: vec![order_service.to_string()],
        ..gateway::Settings::default()
    }
}

impl Platform {
    /// Starts another gateway replica in front of the same services; returns its URL.
    pub async fn add_gateway(&mut self) -> String {
        self.add_gateway_with(|_| {}).await
    }

    /// Starts another gateway replica with its settings adjusted by `configure`.
    pub async fn add_gateway_with(
        &mut self,
        configure: impl FnOnce(&mut gateway::Settings),
    ) -> String {
        let mut settings = gateway_settings(&self.ns, &self.seckill_api, &self.order_service);
        configure(&mut settings);
        let gateway = gateway::Application::build(settings)
            .await
            .expect("build gateway");
        let url = format!("http://127.0.0.1:{}", gateway.port());
        self.stops.push(gateway.shutdown_token());
        self.tasks.push(tokio::spawn(gateway.run_until_stopped()));
        url
    }

    /// Creates a product of `stock` units whose sale starts `start_in` from now and lasts an
    /// hour, its waiting room on (`fifo`); returns its id.
    pub async fn create_queued_product(&self, stock: i32, start_in: Duration) -> i64 {
        self.create_room_product(stock, start_in, "fifo").await
    }

    /// Creates a product whose waiting room is `mode` (`fifo`, `raffle`), starting in
    /// `start_in`; returns its id.
    pub async fn create_room_product(&self, stock: i32, start_in: Duration, mode: &str) -> i64 {
        let start = Utc::now() + ChronoDuration::from_std(start_in).expect("a short wait");
        let response = self
            .client
            .post(format!("{}/admin/products", self.gateway))
            .bearer_auth(admin_token())
            .json(&json!({
                "name": "Limited edition kettle",
                "price_cents": 4999,
                "stock": stock,
                "start_at": start,
                "end_at": start + ChronoDuration::hours(1),
                "waiting_room": mode,
            }))
            .send()
            .await
            .expect("create product");
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["waiting_room"], mode, "{body}");
        body["id"].as_i64().expect("id")
    }

    /// Creates a product through the gateway with an admin token; returns its id.
    pub async fn create_product(&self, stock: i32, start_offset_secs: i64) -> i64 {
        let start = Utc::now() + ChronoDuration::seconds(start_offset_secs);
        let response = self
            .client
            .post(format!("{}/admin/products", self.gateway))
            .bearer_auth(admin_token())
            .json(&json!({
                "name": "e2e product",
                "price_cents": 4999,
                "stock": stock,
                "start_at": start,
                "end_at": start + ChronoDuration::hours(1),
            }))
            .send()
            .await
            .expect("create product");
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.expect("json");
        body["id"].as_i64().expect("id")
    }

    /// Creates a product on sale for the next hour whose stock is split into `buckets`.
    pub async fn create_product_in_buckets(&self, stock: i32, buckets: i16) -> i64 {
        let start = Utc::now() - ChronoDuration::seconds(60);
        let response = self
            .client
            .post(format!("{}/admin/products", self.gateway))
            .bearer_auth(admin_token())
            .json(&json!({
                "name": "bucketed product",
                "price_cents": 2500,
                "stock": stock,
                "buckets": buckets,
                "start_at": start,
                "end_at": start + ChronoDuration::hours(1),
            }))
            .send()
            .await
            .expect("create product");
        assert_eq!(response.status(), 201);
        let body: Value = response.json().await.expect("json");
        body["id"].as_i64().expect("id")
    }

    /// The product's bucket count, from Postgres.
    pub async fn buckets(&self, product: i64) -> u16 {
        let db = self.ns.db().await;
        let buckets: i16 = sqlx::query_scalar("SELECT stock_buckets FROM products WHERE id = $1")
            .bind(product)
            .fetch_one(&db)
            .await
            .expect("stock_buckets");
        db.close().await;
        u16::try_from(buckets).expect("positive")
    }

    /// Removes what Redis holds of the product's sale (every key but the outbox streams),
    /// as an expiry would: the next purchase loads the stock again from Postgres.
    pub async fn forget_stock(&self, product: i64) {
        let keys = self.ns.keys();
        let mut redis = self.ns.redis().await;
        let mut doomed = vec![keys.product_state(product), keys.load_lock(product)];
        for bucket in 0..self.buckets(product).await {
            doomed.extend([
                keys.stock(product, bucket),
                keys.buyers(product, bucket),
                keys.takers(product, bucket),
                keys.results(product, bucket),
                keys.returns(product, bucket),
            ]);
        }
        // One key per command: on a Redis Cluster the keys live in different slots.
        for key in doomed {
            let _: i64 = redis::cmd("DEL")
                .arg(key)
                .query_async(&mut redis)
                .await
                .expect("del");
        }
    }

    /// Units left in Redis over all buckets.
    pub async fn redis_remaining(&self, product: i64) -> i64 {
        let mut redis = self.ns.redis().await;
        let mut total = 0;
        for bucket in 0..self.buckets(product).await {
            let units: Option<i64> = redis::cmd("HGET")
                .arg(self.ns.keys().stock(product, bucket))
                .arg("remaining")
                .query_async(&mut redis)
                .await
                .expect("hget");
            total += units.unwrap_or(0);
        }
        total
    }

    /// Relays every due compensation now, as order-service's relay would on its next round
    /// (tests that need to choose that moment give the platform a long poll interval).
    pub async fn relay_compensations(&self) -> usize {
        let settings = self.ns.backend_settings();
        let compensator = order_service::compensation::Compensator {
            db: self.ns.db().await,
            redis: seckill_store::Redis::new(
                settings.redis_url.expose(),
                settings.redis_cluster,
                1,
            )
            .expect("redis"),
            keys: self.ns.keys(),
            poll: Duration::from_millis(50),
            batch: 100,
        };
        let relayed = compensator.relay_due().await.expect("relay compensations");
        compensator.db.close().await;
        relayed
    }

    pub async fn buy(&self, product: impl std::fmt::Display, token: &str) -> Response {
        self.client
            .post(format!("{}/api/seckill/{product}", self.gateway))
            .bearer_auth(token)
            .send()
            .await
            .expect("purchase")
    }

    pub async fn get(&self, path: &str, token: &str) -> Response {
        self.client
            .get(format!("{}{path}", self.gateway))
            .bearer_auth(token)
            .send()
            .await
            .expect("get")
    }

    pub async fn post(&self, path: &str, token: &str) -> Response {
        self.client
            .post(format!("{}{path}", self.gateway))
            .bearer_auth(token)
            .send()
            .await
            .expect("post")
    }

    pub async fn shutdown(self) {
        for stop in &self.stops {
            stop.cancel();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        self.ns.cleanup().await;
    }
}

pub async fn assert_error(response: Response, status: u16, code: &str) {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.expect("error body is JSON");
    assert_eq!(body["code"], code, "body: {body}");
}

/// Polls the buyer's result until it is no longer `queued`.
pub async fn final_result(platform: &Platform, product: i64, token: &str) -> Value {
    eventually("a final result", Duration::from_secs(30), || async {
        let body: Value = platform
            .get(&format!("/api/seckill/{product}/result"), token)
            .await
            .json()
            .await
            .ok()?;
        (body["status"] != "queued").then_some(body)
    })
    .await
}

/// The platform with the gateway's settings adjusted by `configure` (e.g. limits a test
/// must not trip over). The same services as [`spawn_platform`].
pub async fn spawn_platform_with_gateway(
    configure: impl FnOnce(&mut gateway::Settings),
) -> Platform {
    spawn_platform_configured(|_| {}, configure).await
}

/// The platform as `scripts/up.sh` runs it for load tools: one address sends thousands of
/// fresh tokens, so the gateway's per-address pre-limit on unverified tokens is raised the
/// same way (`SECKILL_GATEWAY_RATE_UNVERIFIED_*`, 100 000).
pub async fn spawn_platform_for_load() -> Platform {
    spawn_platform_with_gateway(|settings| {
        settings.rate_unverified_per_sec = 100_000;
        settings.rate_unverified_burst = 100_000;
    })
    .await
}
