//! Tracing and metrics set-up shared by every service.
//!
//! Logs are JSON lines (one object per event, with the span fields — request id included —
//! flattened in, and `trace_id` first inside a traced span) unless `log_format` is `pretty`.
//! Spans are exported over OTLP only when `OTEL_EXPORTER_OTLP_ENDPOINT` is set ([`otel`]);
//! traces are continued from W3C `traceparent` values ([`trace_context`]) either way. Metrics go to one process-wide Prometheus
//! recorder, rendered by each service's `/metrics` route and kept in shape by a thread of its own
//! ([`UPKEEP_EVERY`]).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use seckill_config::LogFormat;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

pub mod json_fields;
pub mod logs;
pub mod otel;
pub mod request_scope;
pub mod trace_context;

pub use logs::{TRACE_ID_FIELD, TraceIdLayer, WithTraceId};
pub use otel::{
    Carried, Planned, carried, carried_or, continue_trace, exporting, link, plan, shutdown_tracing,
};
pub use request_scope::RequestScope;
pub use trace_context::{TRACEPARENT, TRACESTATE, TraceParent};

/// Installs the global tracing subscriber. `filter` is an `EnvFilter` directive used when
/// `RUST_LOG` is unset. Safe to call more than once (tests): later calls do nothing.
///
/// Spans are exported over OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see [`otel`]),
/// under `OTEL_SERVICE_NAME` or else `service`, sampled as `OTEL_TRACES_SAMPLER` says; call
/// [`shutdown_tracing`] before exiting so the last batch is sent. Must run inside a Tokio
/// runtime for the export to start.
pub fn init_tracing(service: &str, filter: &str, format: LogFormat) {
    let sampling = otel::Sampling::from_env();
    otel::set_sampling(&sampling);
    let provider = match otel::provider_from_env(service, &sampling) {
        Ok(provider) => provider,
        Err(e) => {
            // Logged once the subscriber is up; the service runs without export.
            eprintln!("OpenTelemetry export not started: {e:#}");
            None
        }
    };
    if install(service, filter, format, provider) && otel::exporting() {
        tracing::info!(sampler = %sampling, "spans exported, sampled");
        if let Some(warning) = &sampling.warning {
            tracing::warn!("{warning}");
        }
    }
}

/// Installs the global subscriber with `provider`'s OpenTelemetry layer, if any (a test
/// passes one with an in-memory exporter). Returns whether this call installed it.
pub fn install(
    service: &str,
    filter: &str,
    format: LogFormat,
    provider: Option<SdkTracerProvider>,
) -> bool {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(filter));
    let exporting = provider.is_some();
    let otel_layer = provider
        .as_ref()
        .map(|provider| otel::layer(provider, service));
    let fmt_layer = if format == LogFormat::Pretty {
        tracing_subscriber::fmt::layer()
            .with_span_events(FmtSpan::NONE)
            .boxed()
    } else {
        json_layer(std::io::stdout).boxed()
    };
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(TraceIdLayer)
        .with(otel_layer)
        .with(fmt_layer)
        .try_init();
    if result.is_err() {
        return false;
    }
    if let Some(provider) = provider {
        otel::installed(provider);
    }
    tracing::info!(service, exporting, "tracing initialised");
    debug_assert_eq!(exporting, otel::exporting());
    true
}

/// The JSON log lines: one object per event, span fields flattened in, `trace_id` first
/// inside a traced span ([`logs::WithTraceId`]). A span's fields are kept as the JSON object
/// the lines embed, written once ([`json_fields::SpanFields`]). Public so a test can capture
/// the lines.
pub fn json_layer<S, W>(writer: W) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let format = tracing_subscriber::fmt::format()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(true);
    tracing_subscriber::fmt::layer()
        .fmt_fields(json_fields::SpanFields)
        .with_span_events(FmtSpan::NONE)
        .event_format(WithTraceId(format))
        .with_writer(writer)
}

/// Installs tracing for tests only when `TEST_LOG` is set, so test output stays readable.
pub fn init_test_tracing() {
    if std::env::var_os("TEST_LOG").is_some() {
        init_tracing("test", "info,sqlx=warn", LogFormat::Pretty);
    }
}

/// How often the recorder's upkeep runs. A histogram keeps every sample it is given until an
/// upkeep (or a render of `/metrics`) folds them into its buckets: without one, a service no
/// Prometheus scrapes grows by every request's samples, about 46 bytes a purchase in
/// seckill-api. `install_recorder` leaves the upkeep to its caller.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(1);

static UPKEEPS: AtomicU64 = AtomicU64::new(0);

/// How many upkeeps the recorder's thread has run (for tests and diagnostics).
pub fn metrics_upkeeps() -> u64 {
    UPKEEPS.load(Ordering::Relaxed)
}

/// Runs `handle`'s upkeep every [`UPKEEP_EVERY`] for the life of the process, on a thread of
/// its own: it needs no runtime, and `metrics_handle` may be first called outside one.
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP_EVERY);
                handle.run_upkeep();
                UPKEEPS.fetch_add(1, Ordering::Relaxed);
            }
        });
    if let Err(e) = spawned {
        // Renders of /metrics still fold the samples in: only an unscraped process grows.
        tracing::error!(error = %e, "cannot start the metrics upkeep thread");
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
                Ok(handle) => {
                    spawn_upkeep(handle.clone());
                    handle
                }
                // Another recorder is installed (an embedding program's): still give a handle
                // so /metrics renders, even if empty.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}
