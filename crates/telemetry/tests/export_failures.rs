//! A span exporter pointed at a collector that is not there says so: once in the log, and
//! in a count for every batch it dropped.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use opentelemetry::trace::{Tracer as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use seckill_telemetry::otel::{batched, watched::Watched};

use common::Captured;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_collector_is_warned_of_once_and_every_lost_batch_counted() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let endpoint = format!("http://127.0.0.1:{port}/v1/traces");
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(&endpoint)
        .with_timeout(Duration::from_secs(2))
        .build()
        .expect("an OTLP exporter");
    let watched = Watched::new(exporter, &endpoint);
    let failures = watched.failures();
    let provider = batched(watched, "export-failures-test").expect("a provider");
    let tracer = provider.tracer("test");

    for batch in 1..=2 {
        tracer.in_span(format!("span {batch}"), |_| {});
        let flushing = provider.clone();
        // force_flush blocks until the batch task answered: off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || flushing.force_flush()).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while failures.load(Ordering::Relaxed) < batch {
            assert!(
                Instant::now() < deadline,
                "batch {batch}: the failed export was not counted"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    let log = captured.text();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("span export failed"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "two failed batches, one warning expected:\n{log}"
    );
    assert!(warnings[0].contains("WARN"), "{}", warnings[0]);
    assert!(warnings[0].contains(&endpoint), "{}", warnings[0]);
    let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
}
