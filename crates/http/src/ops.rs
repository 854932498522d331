//! Operator endpoints present on every service.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

/// One dependency check: a name for the report and a probe that fails with a reason.
pub type Probe = Arc<
    dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync + 'static,
>;

/// Routes `/healthz` (the process answers), `/readyz` (every dependency answers, and which
/// service this is) and `/metrics` (Prometheus text).
pub fn router<S: Clone + Send + Sync + 'static>(
    service: &'static str,
    probes: Vec<(&'static str, Probe)>,
) -> Router<S> {
    // Taking the handle here installs the recorder at build time: metrics recorded before
    // it exists are dropped.
    let metrics = seckill_telemetry::metrics_handle();
    let probes = Arc::new(probes);
    Router::new()
        .route("/healthz", get(|| async { (StatusCode::OK, "ok") }))
        .route(
            "/readyz",
            get(move || {
                let probes = probes.clone();
                async move { readiness(service, &probes).await }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { render_metrics(&metrics) }
            }),
        )
}

/// A probe that passes while `flag` is set (e.g. "the consumer holds a channel").
pub fn flag_probe(flag: Arc<std::sync::atomic::AtomicBool>, failure: &'static str) -> Probe {
    Arc::new(move || {
        let up = flag.load(std::sync::atomic::Ordering::Relaxed);
        Box::pin(async move { if up { Ok(()) } else { Err(failure.to_string()) } })
    })
}

/// The report names the service: whoever holds a port, a prober (a load balancer, a test
/// harness waiting for the process it started) can tell its service from another's.
async fn readiness(service: &'static str, probes: &[(&'static str, Probe)]) -> Response {
    let mut report = serde_json::Map::new();
    let mut ready = true;
    for (name, probe) in probes {
        let outcome = match tokio::time::timeout(std::time::Duration::from_secs(2), probe()).await {
            Ok(Ok(())) => "ok".to_string(),
            Ok(Err(reason)) => reason,
            Err(_) => "timed out".to_string(),
        };
        ready &= outcome == "ok";
        report.insert((*name).to_string(), json!(outcome));
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        axum::Json(json!({ "service": service, "ready": ready, "checks": report })),
    )
        .into_response()
}

fn render_metrics(handle: &PrometheusHandle) -> impl IntoResponse + use<> {
    handle.run_upkeep();
    (
        [("content-type", "text/plain; version=0.0.4")],
        handle.render(),
    )
}
