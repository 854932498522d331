//! The span exporter, watched. OpenTelemetry's SDK reports a failed export only through its
//! own internal logs (not built here), so without this a wrong
//! `OTEL_EXPORTER_OTLP_ENDPOINT` would drop every span without a sign. Each failed batch is
//! counted ([`EXPORT_FAILURES`], its spans in [`SPANS_DROPPED`]); the first failure of a
//! streak is logged as a warning naming the endpoint, and the first success after one as
//! a recovery, so a collector that stays away costs one log line, not one per batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};

/// Batches of spans the exporter failed to send.
pub const EXPORT_FAILURES: &str = "otel_export_failures_total";
/// Spans in those batches: dropped, never exported.
pub const SPANS_DROPPED: &str = "otel_spans_dropped_total";

/// An exporter whose failures are counted and logged; see the module docs.
#[derive(Debug)]
pub struct Watched<E> {
    inner: E,
    /// Where the spans go, for the warning.
    endpoint: String,
    /// Whether the last export failed: only the first failure of a streak is logged.
    failing: AtomicBool,
    /// Failed batches so far, also readable without a metrics recorder.
    failures: Arc<AtomicU64>,
}

impl<E> Watched<E> {
    /// Watches `inner`, which sends to `endpoint`.
    pub fn new(inner: E, endpoint: &str) -> Self {
        Self {
            inner,
            endpoint: endpoint.to_string(),
            failing: AtomicBool::new(false),
            failures: Arc::default(),
        }
    }

    /// The count of failed batches, shared: it goes on counting once the exporter is
    /// handed to a span processor.
    pub fn failures(&self) -> Arc<AtomicU64> {
        self.failures.clone()
    }
}

impl<E: SpanExporter> SpanExporter for Watched<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(endpoint = %self.endpoint, "span export works again");
                }
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(EXPORT_FAILURES).increment(1);
                metrics::counter!(SPANS_DROPPED).increment(spans);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        error = %e,
                        "span export failed: spans are dropped until it works again \
                         (counted in {EXPORT_FAILURES})"
                    );
                }
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
