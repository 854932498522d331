//! `spawn_app()`: seckill-api on port 0 in a private namespace.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use reqwest::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use seckill_api::{Application, Settings};
use seckill_testkit::{SendAs, TestNamespace};

pub struct TestApp {
    pub address: String,
    pub ns: TestNamespace,
    pub client: reqwest::Client,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

pub fn settings_for(ns: &TestNamespace) -> Settings {
    Settings {
        backend: ns.backend_settings(),
        port: 0,
        ..Settings::default()
    }
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// An app whose settings `configure` adjusts first.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_in(TestNamespace::new(), configure).await
}

/// An app (a further replica, say) in an existing namespace.
pub async fn spawn_app_in(ns: TestNamespace, configure: impl FnOnce(&mut Settings)) -> TestApp {
    let mut settings = settings_for(&ns);
    configure(&mut settings);
    let app = Application::build(settings)
        .await
        .expect("build seckill-api");
    let address = format!("http://127.0.0.1:{}", app.port());
    let stop = app.shutdown_token();
    let task = tokio::spawn(app.run_until_stopped());
    TestApp {
        address,
        ns,
        client: reqwest::Client::new(),
        stop,
        task,
    }
}

impl TestApp {
    /// Creates a product whose sale window is `[start, end)`; returns its id.
    pub async fn create_product_window(
        &self,
        stock: i32,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> i64 {
        create_product_at(&self.client, &self.address, stock, start, end).await
    }

    /// A product on sale now.
    pub async fn create_product(&self, stock: i32) -> i64 {
        let now = Utc::now();
        self.create_product_window(
            stock,
            now - ChronoDuration::seconds(60),
            now + ChronoDuration::hours(1),
        )
        .await
    }

    /// A product on sale now whose stock is split into `buckets` buckets.
    pub async fn create_product_in_buckets(&self, stock: i32, buckets: i16) -> i64 {
        let now = Utc::now();
        let response = self
            .client
            .post(format!("{}/admin/products", self.address))
            .json(&json!({
                "name": "bucketed product",
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
        assert_eq!(body["stock_buckets"], buckets, "{body}");
        body["id"].as_i64().expect("id")
    }

    /// The value of one Prometheus sample (`name{labels}` exactly as exported), 0 if absent.
    pub async fn metric(&self, sample: &str) -> f64 {
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

    /// Waits until `/readyz` answers 200 (every dependency connected, the handlers'
    /// publisher included).
    pub async fn wait_ready(&self) {
        seckill_testkit::eventually("ready", std::time::Duration::from_secs(10), || async {
            let ready = self
                .client
                .get(format!("{}/readyz", self.address))
                .send()
                .await;
            ready.ok().filter(|r| r.status() == 200).map(|_| ())
        })
        .await;
    }

    pub async fn purchase(&self, product: impl std::fmt::Display, user_id: i64) -> Response {
        self.client
            .post(format!("{}/api/seckill/{product}", self.address))
            .send_as("seckill-api", user_id, &[])
            .await
            .expect("purchase request")
    }

    pub async fn result(&self, product: i64, user_id: i64) -> Value {
        self.client
            .get(format!("{}/api/seckill/{product}/result", self.address))
            .send_as("seckill-api", user_id, &[])
            .await
            .expect("result request")
            .json()
            .await
            .expect("json")
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

    /// Units left in Redis over all buckets; `None` while no bucket is loaded.
    pub async fn redis_remaining(&self, product: i64) -> Option<i64> {
        let mut redis = self.ns.redis().await;
        let mut total = None;
        for bucket in 0..self.buckets(product).await {
            let remaining: Option<i64> = redis::cmd("HGET")
                .arg(self.ns.keys().stock(product, bucket))
                .arg("remaining")
                .query_async(&mut redis)
                .await
                .expect("hget");
            if let Some(units) = remaining {
                total = Some(total.unwrap_or(0) + units);
            }
        }
        total
    }

    /// Entries waiting in the product's outbox streams.
    pub async fn outbox_len(&self, product: i64) -> i64 {
        let mut redis = self.ns.redis().await;
        let mut total = 0;
        for bucket in 0..self.buckets(product).await {
            let len: i64 = redis::cmd("XLEN")
                .arg(self.ns.keys().outbox(product, bucket))
                .query_async(&mut redis)
                .await
                .expect("xlen");
            total += len;
        }
        total
    }

    /// Stops the app (letting the relay finish), leaving the namespace to its other users.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }

    /// Stops the app (letting the relay finish) and removes the namespace.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
        self.ns.cleanup().await;
    }
}

/// Creates a product through the admin route of the app at `address`; returns its id.
pub async fn create_product_at(
    client: &reqwest::Client,
    address: &str,
    stock: i32,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> i64 {
    let response = client
        .post(format!("{address}/admin/products"))
        .json(&json!({
            "name": "test product",
            "price_cents": 1999,
            "stock": stock,
            "start_at": start,
            "end_at": end,
        }))
        .send_as("seckill-api", 1, &["admin"])
        .await
        .expect("create product");
    assert_eq!(response.status(), 201);
    let body: Value = response.json().await.expect("json");
    body["id"].as_i64().expect("id")
}

/// Asserts the JSON error contract: status and code.
pub async fn assert_error(response: Response, status: u16, code: &str) {
    assert_eq!(response.status(), status);
    let body: Value = response.json().await.expect("error body is JSON");
    assert_eq!(body["code"], code, "body: {body}");
    assert!(body["message"].is_string(), "body: {body}");
}
