//! The gateway alone, in front of a stand-in backend that answers with what it received:
//! fast, no database, and it shows exactly what a backend would see.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use seckill_config::Secret;
use seckill_testkit::{INTERNAL_KEY, JWT_SECRET};

/// A backend that answers every request `200 {"method","path","headers"}` (a path ending in
/// `/slow` after a second) and counts what reached it.
pub struct Echo {
    pub url: String,
    hits: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Echo {
    /// Requests that reached this backend.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn echo(State(hits): State<Arc<AtomicUsize>>, request: Request) -> axum::Json<Value> {
    hits.fetch_add(1, Ordering::SeqCst);
    if request.uri().path().ends_with("/slow") {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in request.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        headers
            .entry(name.as_str().to_string())
            .and_modify(|v| *v = format!("{v}, {value}"))
            .or_insert(value);
    }
    axum::Json(json!({
        "method": request.method().as_str(),
        "path": request.uri().path(),
        "headers": headers,
    }))
}

pub async fn spawn_echo() -> Echo {
    let hits = Arc::new(AtomicUsize::new(0));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let stop = CancellationToken::new();
    let app = Router::new().fallback(echo).with_state(hits.clone());
    let until = stop.clone().cancelled_owned();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(until)
            .await
    });
    Echo { url, hits, stop }
}

/// A URL on which nothing listens: a port that was bound and released.
pub async fn closed_port_url() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    url
}

/// Test settings: the test JWT secret and internal key, both services at `upstream`.
pub fn settings(upstream: &str) -> gateway::Settings {
    gateway::Settings {
        host: "127.0.0.1".into(),
        port: 0,
        admin_port: 0,
        jwt_secret: Secret::new(JWT_SECRET),
        internal_key: Secret::new(INTERNAL_KEY),
        seckill_api_urls: vec![upstream.into()],
        order_service_urls: vec![upstream.into()],
        ..gateway::Settings::default()
    }
}

/// A running gateway; stopped when dropped.
pub struct Gateway {
    pub url: String,
    /// The operator listener (`/metrics`, the detailed `/readyz`).
    pub admin: String,
    pub client: reqwest::Client,
    stop: CancellationToken,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn spawn_gateway(settings: gateway::Settings) -> Gateway {
    let app = gateway::Application::build(settings)
        .await
        .expect("build gateway");
    let url = format!("http://127.0.0.1:{}", app.port());
    let admin = format!("http://127.0.0.1:{}", app.admin_port());
    let stop = app.shutdown_token();
    tokio::spawn(app.run_until_stopped());
    Gateway {
        url,
        admin,
        client: reqwest::Client::new(),
        stop,
    }
}

impl Gateway {
    /// Stops the gateway as SIGTERM would: no new connections, requests under way answered.
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.get(format!("{}{path}", self.url))
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.client.post(format!("{}{path}", self.url))
    }

    /// The sum of the series of `name` whose labels include every `labels` pair, read on
    /// the operator listener.
    pub async fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let text = self
            .client
            .get(format!("{}/metrics", self.admin))
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        metric_sum(&text, name, labels)
    }
}

/// The sum of the Prometheus series `name{...}` whose labels include every `labels` pair.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|line| {
            labels
                .iter()
                .all(|(k, v)| line.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The headers a backend saw, from the echo's answer.
pub async fn seen_headers(response: reqwest::Response) -> BTreeMap<String, String> {
    assert_eq!(response.status(), 200, "the echo answers 200");
    let body: Value = response.json().await.expect("echo json");
    serde_json::from_value(body["headers"].clone()).expect("headers map")
}
