//! `spawn_platform()`: seckill-api, order-service and the gateway in-process, in a private
//! namespace, on port 0 each.

use chrono::{Duration as ChronoDuration, Utc};
use reqwest::Response;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use seckill_auth::mint_token;
use seckill_config::Secret;
use seckill_testkit::{INTERNAL_KEY, JWT_SECRET, TestNamespace};

pub struct Platform {
    pub gateway: String,
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
    let ns = TestNamespace::new();
    let mut stops = Vec::new();
    let mut tasks = Vec::new();

    let api = seckill_api::Application::build(seckill_api::Settings {
        backend: ns.backend_settings(),
        port: 0,
        ..seckill_api::Settings::default()
    })
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
    configure(&mut order_settings);
    let orders = order_service::Application::build(order_settings)
        .await
        .expect("build order-service");
    let order_service = format!("http://127.0.0.1:{}", orders.port());
    stops.push(orders.shutdown_token());
    tasks.push(tokio::spawn(orders.run_until_stopped()));

    let gateway = gateway::Application::build(gateway::Settings {
        host: "127.0.0.1".into(),
        port: 0,
        jwt_secret: Secret::new(JWT_SECRET),
        internal_key: Secret::new(INTERNAL_KEY),
        seckill_api_urls: seckill_api.clone(),
        order_service_urls: order_service.clone(),
        ..gateway::Settings::default()
    })
    .await
    .expect("build gateway");
    let gateway_url = format!("http://127.0.0.1:{}", gateway.port());
    stops.push(gateway.shutdown_token());
    tasks.push(tokio::spawn(gateway.run_until_stopped()));

    Platform {
        gateway: gateway_url,
        seckill_api,
        order_service,
        ns,
        client: reqwest::Client::new(),
        stops,
        tasks,
    }
}

impl Platform {
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
