//! A request's tracing is planned before anything of it is made: with export on, the plan
//! decides as the exporter's sampler will, on the same trace id, so that the requests given
//! a span are exactly the ones exported, and the rest send on a trace their callees drop.
//! Its own test binary: it installs the global subscriber and marks export on.

use std::collections::HashSet;

use opentelemetry_sdk::trace::InMemorySpanExporter;
use seckill_telemetry::otel::{self, Sampling};
use seckill_telemetry::{TraceParent, plan};
use tracing_subscriber::layer::SubscriberExt as _;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratio_is_decided_once_and_the_planned_spans_are_the_exported_ones() {
    let sampling = Sampling::from_lookup(|name| match name {
        "OTEL_TRACES_SAMPLER" => Some("parentbased_traceidratio".into()),
        "OTEL_TRACES_SAMPLER_ARG" => Some("0.5".into()),
        _ => None,
    });
    otel::set_sampling(&sampling);
    let exporter = InMemorySpanExporter::default();
    let provider = otel::batched_with(exporter.clone(), "plan-test", &sampling).expect("provider");
    let subscriber = tracing_subscriber::registry()
        .with(seckill_telemetry::TraceIdLayer)
        .with(otel::layer(&provider, "plan-test"));
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    otel::installed(provider.clone());

    // New traces: about half are planned a span, and exactly those are exported, under the
    // trace id the plan decided on.
    let requests = 1000;
    let mut planned_ids = HashSet::new();
    for _ in 0..requests {
        let planned = plan(None);
        if planned.exported {
            let span = tracing::info_span!("http", trace_id = tracing::field::Empty);
            let onwards = planned.continue_in(&span, None, None);
            assert_eq!(onwards.trace_id, planned.onwards.trace_id);
            assert!(onwards.sampled());
            planned_ids.insert(onwards.trace_id);
            drop(span.enter());
        } else {
            assert!(!planned.onwards.sampled(), "its callees drop the trace too");
        }
    }
    assert!(
        (400..=600).contains(&planned_ids.len()),
        "about half of {requests}: {}",
        planned_ids.len()
    );

    // A caller's decision is followed: sampled, a span; not sampled, none.
    let sampled = TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .expect("valid");
    let unsampled = TraceParent {
        flags: 0,
        ..sampled
    };
    let followed = plan(Some(&sampled));
    assert!(followed.exported);
    let span = tracing::info_span!("http", trace_id = tracing::field::Empty);
    let onwards = followed.continue_in(&span, Some(&sampled), None);
    assert_eq!(onwards.trace_id, sampled.trace_id);
    drop(span.enter());
    drop(span);
    let dropped = plan(Some(&unsampled));
    assert!(!dropped.exported);
    assert_eq!(dropped.onwards.trace_id, unsampled.trace_id);
    assert!(!dropped.onwards.sampled());

    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .expect("joined")
        .expect("flushed");
    let exported: Vec<[u8; 16]> = exporter
        .get_finished_spans()
        .expect("spans")
        .iter()
        .map(|span| span.span_context.trace_id().to_bytes())
        .collect();
    let mut expected = planned_ids.clone();
    expected.insert(sampled.trace_id);
    assert_eq!(
        exported.iter().copied().collect::<HashSet<_>>(),
        expected,
        "the exported spans are the planned ones, under their planned trace ids"
    );
    assert_eq!(exported.len(), expected.len(), "each exported once");
}
