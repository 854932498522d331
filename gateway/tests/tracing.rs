//! One trace per purchase, across HTTP and AMQP: the gateway, seckill-api (its purchase
//! script, the outbox relay's publish) and order-service (consume, insert) all in-process,
//! with every span kept in memory. Its own test binary, so it can own the global subscriber.

use std::collections::BTreeSet;
use std::sync::OnceLock;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::layer::SubscriberExt as _;

use seckill_auth::mint_token;
use seckill_config::Secret;
use seckill_testkit::{INTERNAL_KEY, JWT_SECRET, OwnBroker, TestNamespace, eventually};

/// The spans every test of this binary records (a simple processor: exported as each ends).
fn spans() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        // The services' own log lines too, into the output libtest shows for a failed test:
        // its capture reaches the threads the test's thread spawned (the runtime's workers,
        // lapin's I/O threads), not a thread a global started for another test.
        let subscriber = tracing_subscriber::registry()
            .with(tracing_subscriber::EnvFilter::new("info"))
            .with(seckill_telemetry::TraceIdLayer)
            .with(seckill_telemetry::otel::layer(&provider, "test"))
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_test_writer(),
            );
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        seckill_telemetry::otel::installed(provider);
        exporter
    })
}

/// The three services on port 0 each, in `ns` (whose broker they use).
struct Platform {
    gateway: String,
    ns: TestNamespace,
    client: reqwest::Client,
    stops: Vec<CancellationToken>,
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Platform {
    async fn spawn(ns: TestNamespace, publish_on_accept: bool) -> Self {
        let mut stops = Vec::new();
        let mut tasks = Vec::new();
        let api = seckill_api::Application::build(seckill_api::Settings {
            backend: ns.backend_settings(),
            port: 0,
            publish_on_accept,
            // What the handler could not publish is the relay's after this long.
            relay_reclaim_idle: Duration::from_millis(500),
            ..seckill_api::Settings::default()
        })
        .await
        .expect("build seckill-api");
        let seckill_api = format!("http://127.0.0.1:{}", api.port());
        stops.push(api.shutdown_token());
        tasks.push(tokio::spawn(api.run_until_stopped()));
        let orders = order_service::Application::build(order_service::Settings {
            backend: ns.backend_settings(),
            port: 0,
            ..order_service::Settings::default()
        })
        .await
        .expect("build order-service");
        let order_service = format!("http://127.0.0.1:{}", orders.port());
        stops.push(orders.shutdown_token());
        tasks.push(tokio::spawn(orders.run_until_stopped()));
        let gateway = gateway::Application::build(gateway::Settings {
            host: "127.0.0.1".into(),
            port: 0,
            admin_port: 0,
            jwt_secret: Secret::new(JWT_SECRET),
            internal_key: Secret::new(INTERNAL_KEY),
            seckill_api_urls: vec![seckill_api],
            order_service_urls: vec![order_service],
            ..gateway::Settings::default()
        })
        .await
        .expect("build gateway");
        let gateway_url = format!("http://127.0.0.1:{}", gateway.port());
        stops.push(gateway.shutdown_token());
        tasks.push(tokio::spawn(gateway.run_until_stopped()));
        Self {
            gateway: gateway_url,
            ns,
            client: reqwest::Client::new(),
            stops,
            tasks,
        }
    }

    async fn create_product(&self, stock: i32) -> i64 {
        let start = Utc::now() - ChronoDuration::seconds(60);
        let response = self
            .client
            .post(format!("{}/admin/products", self.gateway))
            .bearer_auth(mint_token(JWT_SECRET, 1, &["admin"], 600))
            .json(&json!({
                "name": "traced product",
                "price_cents": 1500,
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

    /// Buys `product` as `user` with the client's `traceparent`; the purchase's request id.
    async fn buy(&self, product: i64, user: i64, traceparent: Option<&str>) -> String {
        let mut request = self
            .client
            .post(format!("{}/api/seckill/{product}", self.gateway))
            .bearer_auth(mint_token(JWT_SECRET, user, &[], 600));
        if let Some(traceparent) = traceparent {
            request = request
                .header("traceparent", traceparent)
                .header("tracestate", "client=1");
        }
        let response = request.send().await.expect("purchase");
        assert_eq!(response.status(), 202);
        let body: Value = response.json().await.expect("json");
        body["request_id"].as_str().expect("request id").to_string()
    }

    /// Waits until the order of purchase `request_id` is in Postgres.
    async fn wait_for_order(&self, request_id: &str) {
        let db = self.ns.db().await;
        let request_id: uuid::Uuid = request_id.parse().expect("uuid");
        eventually("the order", Duration::from_secs(60), || async {
            let found: Option<i64> =
                sqlx::query_scalar("SELECT id FROM orders WHERE request_id = $1")
                    .bind(request_id)
                    .fetch_optional(&db)
                    .await
                    .ok()?;
            found
        })
        .await;
        db.close().await;
    }

    async fn shutdown(self) {
        for stop in &self.stops {
            stop.cancel();
        }
        for task in self.tasks {
            let _ = task.await;
        }
        self.ns.cleanup().await;
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.as_str().into_owned())
}

/// The spans of the trace whose `order.insert` span is purchase `request_id`'s, once its
/// order's insert span has ended.
async fn trace_of_order(request_id: &str) -> (TraceId, Vec<SpanData>) {
    let trace_id = eventually("the insert span", Duration::from_secs(30), || async {
        spans()
            .get_finished_spans()
            .ok()?
            .into_iter()
            .find(|s| {
                s.name == "order.insert"
                    && attribute(s, "request_id").as_deref() == Some(request_id)
            })
            .map(|s| s.span_context.trace_id())
    })
    .await;
    // The consume span ends once the delivery is settled, a moment after the insert.
    let spans = eventually("the consume span", Duration::from_secs(30), || async {
        let spans: Vec<SpanData> = spans()
            .get_finished_spans()
            .ok()?
            .into_iter()
            .filter(|s| s.span_context.trace_id() == trace_id)
            .collect();
        spans
            .iter()
            .any(|s| s.name == "order.consume")
            .then_some(spans)
    })
    .await;
    (trace_id, spans)
}

/// The one span named `name` of `service` in `spans`.
fn one<'a>(spans: &'a [SpanData], name: &str, service: &str) -> &'a SpanData {
    let found: Vec<_> = spans
        .iter()
        .filter(|s| s.name == name && attribute(s, "service").as_deref() == Some(service))
        .collect();
    assert_eq!(found.len(), 1, "{name} of {service}: {spans:#?}");
    found[0]
}

/// Whether `ancestor` is above `span` in `spans`.
fn descends(spans: &[SpanData], span: &SpanData, ancestor: &SpanData) -> bool {
    let mut parent = span.parent_span_id;
    while parent != SpanId::INVALID {
        if parent == ancestor.span_context.span_id() {
            return true;
        }
        match spans.iter().find(|s| s.span_context.span_id() == parent) {
            Some(up) => parent = up.parent_span_id,
            None => return false,
        }
    }
    false
}

/// The names of the spans whose id is `id` (for a failure's message).
fn named(spans: &[SpanData], id: SpanId) -> Vec<&str> {
    spans
        .iter()
        .filter(|s| s.span_context.span_id() == id)
        .map(|s| s.name.as_ref())
        .collect()
}

/// The chain a purchase's trace must show: gateway → seckill-api (request → purchase
/// script) → relay publish → order-service consume → insert, each the parent of the next.
fn assert_one_trace_across_the_services(spans: &[SpanData]) {
    let services: BTreeSet<String> = spans
        .iter()
        .filter_map(|s| attribute(s, "service"))
        .collect();
    assert_eq!(
        services,
        ["gateway", "order-service", "seckill-api"]
            .into_iter()
            .map(String::from)
            .collect(),
        "{spans:#?}"
    );
    let gateway = one(spans, "http", "gateway");
    let api = one(spans, "http", "seckill-api");
    // At least once: a publish or a delivery may happen twice (a replayed round).
    let publishes: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "outbox.publish")
        .collect();
    assert!(!publishes.is_empty(), "{spans:#?}");
    let purchase: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "stock.purchase")
        .collect();
    assert_eq!(purchase.len(), 1, "{spans:#?}");
    let purchase = purchase[0];
    assert_eq!(api.parent_span_id, gateway.span_context.span_id());
    assert!(
        api.parent_span_is_remote,
        "seckill-api continues the header"
    );
    // Under the request span (the handler's own span between them).
    assert!(descends(spans, purchase, api), "{spans:#?}");
    for publish in &publishes {
        // The relay's publish continues the context stored in the outbox entry.
        assert_eq!(publish.parent_span_id, purchase.span_context.span_id());
        assert_eq!(
            attribute(publish, "service").as_deref(),
            Some("seckill-api")
        );
    }
    let inserts: Vec<_> = spans.iter().filter(|s| s.name == "order.insert").collect();
    assert!(!inserts.is_empty(), "{spans:#?}");
    for insert in inserts {
        let consume = spans
            .iter()
            .find(|s| s.span_context.span_id() == insert.parent_span_id)
            .expect("the insert's consume span");
        assert_eq!(consume.name, "order.consume");
        assert!(
            consume.parent_span_is_remote,
            "order-service continues the AMQP header"
        );
        assert!(
            publishes
                .iter()
                .any(|p| p.span_context.span_id() == consume.parent_span_id),
            "{:?}",
            named(spans, consume.parent_span_id)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_is_one_trace_from_the_gateway_to_the_order_insert() {
    spans();
    // The relay publishes every purchase (no publish from the handler).
    let platform = Platform::spawn(TestNamespace::new(), false).await;
    let product = platform.create_product(5).await;
    let client_trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let request_id = platform.buy(product, 11, Some(client_trace)).await;
    platform.wait_for_order(&request_id).await;
    let (trace_id, spans) = trace_of_order(&request_id).await;
    // The client's trace is continued, its span the gateway's parent.
    assert_eq!(
        trace_id,
        TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").expect("hex")
    );
    let gateway = one(&spans, "http", "gateway");
    assert_eq!(
        gateway.parent_span_id,
        SpanId::from_hex("00f067aa0ba902b7").expect("hex")
    );
    assert_eq!(
        gateway.span_context.trace_state().get("client"),
        Some("1"),
        "tracestate goes along"
    );
    assert_one_trace_across_the_services(&spans);

    // Without a traceparent (or with a broken one) the gateway starts the trace.
    let request_id = platform.buy(product, 12, Some("00-not-a-trace-01")).await;
    platform.wait_for_order(&request_id).await;
    let (new_trace, spans) = trace_of_order(&request_id).await;
    assert_ne!(new_trace, trace_id);
    let gateway = one(&spans, "http", "gateway");
    assert_eq!(gateway.parent_span_id, SpanId::INVALID, "a root span");
    assert_one_trace_across_the_services(&spans);
    platform.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_order_joins_the_clicks_trace_when_the_broker_was_down_at_the_click() {
    spans();
    let broker = OwnBroker::start().await;
    let mut ns = TestNamespace::new();
    ns.amqp_url = broker.amqp_url();
    // The handlers publish their own purchases, so this one reaches the broker only through
    // the relay's reclaim, long after its request ended.
    let platform = Platform::spawn(ns, true).await;
    let product = platform.create_product(5).await;
    broker.stop().await;
    let request_id = platform.buy(product, 21, None).await;
    // The request is over; its trace is in the outbox entry only.
    broker.restart().await;
    platform.wait_for_order(&request_id).await;
    let (_, spans) = trace_of_order(&request_id).await;
    assert_one_trace_across_the_services(&spans);
    let publish = spans
        .iter()
        .find(|s| s.name == "outbox.publish")
        .expect("a publish");
    let gateway = one(&spans, "http", "gateway");
    assert!(
        publish.start_time > gateway.end_time,
        "published after the click's request ended"
    );
    platform.shutdown().await;
}
