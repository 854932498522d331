//! Tracing and metrics set-up shared by every service.
//!
//! Logs are JSON lines (one object per event, with the span fields — request id included —
//! flattened in) unless `log_format` is `pretty`. Metrics go to one process-wide Prometheus
//! recorder, rendered by each service's `/metrics` route.

use std::sync::OnceLock;

pub use seckill_config::LogFormat;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::FmtSpan;

/// Installs the global tracing subscriber. `filter` is an `EnvFilter` directive used when
/// `RUST_LOG` is unset. Safe to call more than once (tests):
/// later calls do nothing.
pub fn init_tracing(service: &str, filter: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::NONE);
    let result = if format == LogFormat::Pretty {
        builder.try_init()
    } else {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .try_init()
    };
    if result.is_ok() {
        tracing::info!(service, "tracing initialised");
    }
}

/// Installs tracing for tests only when `TEST_LOG` is set, so test output stays readable.
pub fn init_test_tracing() {
    if std::env::var_os("TEST_LOG").is_some() {
        init_tracing("test", "info,sqlx=warn", LogFormat::Pretty);
    }
}

/// The process-wide Prometheus recorder, installed on first use.
///
/// One per process because `metrics` has one global recorder; tests that run several
/// services in one process share it, which is harmless (metric names are per service).
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ])
                .expect("static bucket list is not empty")
                // A retry waits out its tier (seconds to a minute): the request buckets above
                // would put every one of them in +Inf.
                .set_buckets_for_metric(
                    Matcher::Full("orders_retry_latency_seconds".into()),
                    &[
                        0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0,
                    ],
                )
                .expect("static bucket list is not empty");
            match builder.install_recorder() {
                Ok(handle) => handle,
                // Another recorder is installed (an embedding program's): still give a handle
                // so /metrics renders, even if empty.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}
