//! `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` decide which request spans reach the
//! exporter.

use std::collections::HashMap;

use opentelemetry_sdk::trace::InMemorySpanExporter;
use seckill_telemetry::TraceParent;
use seckill_telemetry::otel::{self, Sampling};
use tracing_subscriber::layer::SubscriberExt as _;

/// The sampling of these variables.
fn sampling(vars: &[(&str, &str)]) -> Sampling {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect();
    Sampling::from_lookup(|name| vars.get(name).cloned())
}

/// How many of `requests` request spans `sampling` exports; each continues `parent` when
/// given, else starts a trace of its own.
async fn exported(sampling: &Sampling, requests: usize, parent: Option<&TraceParent>) -> usize {
    let exporter = InMemorySpanExporter::default();
    let provider =
        otel::batched_with(exporter.clone(), "sampling-test", sampling).expect("a provider");
    let subscriber = tracing_subscriber::registry().with(otel::layer(&provider, "sampling-test"));
    tracing::subscriber::with_default(subscriber, || {
        for _ in 0..requests {
            let span = tracing::info_span!("http", trace_id = tracing::field::Empty);
            // The request span's own parent, as the services set it (export is not marked
            // on globally here, so the parent is set by hand).
            if let Some(parent) = parent {
                use opentelemetry::trace::TraceContextExt as _;
                use tracing_opentelemetry::OpenTelemetrySpanExt as _;
                let remote = opentelemetry::trace::SpanContext::new(
                    opentelemetry::trace::TraceId::from_bytes(parent.trace_id),
                    opentelemetry::trace::SpanId::from_bytes(parent.span_id),
                    opentelemetry::trace::TraceFlags::new(parent.flags),
                    true,
                    Default::default(),
                );
                let _ =
                    span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
            }
            let _entered = span.enter();
        }
    });
    // force_flush blocks until the batch task answered: off the runtime's threads. (Not
    // shutdown: the in-memory exporter forgets its spans then.)
    let flushing = provider.clone();
    tokio::task::spawn_blocking(move || flushing.force_flush())
        .await
        .expect("joined")
        .expect("flushed");
    let exported = exporter.get_finished_spans().expect("spans").len();
    let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    exported
}

#[test]
fn the_variables_name_the_sampler() {
    let unset = sampling(&[]);
    assert_eq!(unset.name, "parentbased_always_on");
    assert_eq!(unset.warning, None);
    for name in [
        "always_on",
        "always_off",
        "parentbased_always_on",
        "parentbased_always_off",
    ] {
        let got = sampling(&[
            ("OTEL_TRACES_SAMPLER", name),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ]);
        assert_eq!(
            (got.name, got.ratio, got.warning.as_deref()),
            (name, None, None)
        );
    }
    for name in ["traceidratio", "parentbased_traceidratio"] {
        let got = sampling(&[
            ("OTEL_TRACES_SAMPLER", name),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        ]);
        assert_eq!(
            (got.name, got.ratio, got.warning.as_deref()),
            (name, Some(0.25), None)
        );
        assert_eq!(got.to_string(), format!("{name} 0.25"));
        // No argument: all of them, as the specification says.
        let got = sampling(&[("OTEL_TRACES_SAMPLER", name)]);
        assert_eq!((got.ratio, got.warning.as_deref()), (Some(1.0), None));
        for bad in ["1.5", "-0.1", "half"] {
            let got = sampling(&[
                ("OTEL_TRACES_SAMPLER", name),
                ("OTEL_TRACES_SAMPLER_ARG", bad),
            ]);
            assert_eq!(got.ratio, Some(1.0), "{bad}");
            assert!(got.warning.expect("a warning").contains(bad));
        }
    }
    let unknown = sampling(&[("OTEL_TRACES_SAMPLER", "sometimes")]);
    assert_eq!(unknown.name, "parentbased_always_on");
    assert!(unknown.warning.expect("a warning").contains("sometimes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ratio_exports_about_that_share_of_the_traces() {
    let requests = 4000;
    let quarter = sampling(&[
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
    ]);
    let got = exported(&quarter, requests, None).await;
    // 1000 expected; the binomial's standard deviation is ~27.
    assert!((850..=1150).contains(&got), "{got} of {requests} exported");
    let all = sampling(&[]);
    assert_eq!(exported(&all, 100, None).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_off_exports_nothing_and_parent_based_follows_the_caller() {
    let off = sampling(&[("OTEL_TRACES_SAMPLER", "always_off")]);
    assert_eq!(exported(&off, 200, None).await, 0);

    let sampled = TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .expect("valid");
    let unsampled =
        TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
            .expect("valid");
    let parent_off = sampling(&[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]);
    // A root is not sampled; a sampled caller's trace is.
    assert_eq!(exported(&parent_off, 50, None).await, 0);
    assert_eq!(exported(&parent_off, 50, Some(&sampled)).await, 50);
    // The default follows a caller who did not sample, and samples a root.
    let default = sampling(&[]);
    assert_eq!(exported(&default, 50, Some(&unsampled)).await, 0);
    assert_eq!(exported(&default, 50, None).await, 50);
    // `always_on` ignores the caller.
    let on = sampling(&[("OTEL_TRACES_SAMPLER", "always_on")]);
    assert_eq!(exported(&on, 50, Some(&unsampled)).await, 50);
}
