//! `spawn_app()`: seckill-api on port 0 in a private namespace.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use reqwest::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use seckill_api::{Application, Settings};
use seckill_testkit::{TestNamespace, identity_headers};

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
    let ns = TestNamespace::new();
    let app = Application::build(settings_for(&ns))
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

    pub async fn purchase(&self, product: impl std::fmt::Display, user_id: i64) -> Response {
        self.client
            .post(format!("{}/api/seckill/{product}", self.address))
            .headers(identity_headers(user_id, &[]))
            .send()
            .await
            .expect("purchase request")
    }

    pub async fn result(&self, product: i64, user_id: i64) -> Value {
        self.client
            .get(format!("{}/api/seckill/{product}/result", self.address))
            .headers(identity_headers(user_id, &[]))
            .send()
            .await
            .expect("result request")
            .json()
            .await
            .expect("json")
    }

    pub async fn redis_remaining(&self, product: i64) -> Option<i64> {
        let mut redis = self.ns.redis().await;
        redis::cmd("HGET")
            .arg(self.ns.keys().stock(product))
            .arg("remaining")
            .query_async(&mut redis)
            .await
            .expect("hget")
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
        .headers(identity_headers(1, &["admin"]))
        .json(&json!({
            "name": "test product",
            "price_cents": 1999,
            "stock": stock,
            "start_at": start,
            "end_at": end,
        }))
        .send()
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
