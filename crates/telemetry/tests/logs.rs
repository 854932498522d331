//! The JSON log lines carry the trace id of the span they are emitted in.

mod common;

use common::Captured;
use seckill_telemetry::{
    RequestScope, TraceIdLayer, TraceParent, continue_trace, json_layer, request_scope,
};
use tracing_subscriber::layer::SubscriberExt as _;

/// The JSON objects `captured` holds, one per line.
fn json_lines(captured: &Captured) -> Vec<serde_json::Value> {
    captured
        .text()
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect()
}

fn with_logs(f: impl FnOnce()) -> Vec<serde_json::Value> {
    json_lines(&captured(f))
}

/// What the JSON log layer wrote while `f` ran.
fn captured(f: impl FnOnce()) -> Captured {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::registry()
        .with(TraceIdLayer)
        .with(json_layer(move || writer.clone()));
    tracing::subscriber::with_default(subscriber, f);
    captured
}

#[test]
fn a_line_inside_a_traced_span_carries_its_trace_id() {
    let parent = TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .expect("valid");
    let lines = with_logs(|| {
        tracing::info!("before any span");
        let span =
            tracing::info_span!("http", request_id = "r-1", trace_id = tracing::field::Empty);
        let onwards = continue_trace(&span, Some(&parent), None);
        assert_eq!(onwards.trace_id, parent.trace_id);
        assert_ne!(
            onwards.span_id, parent.span_id,
            "this span is the next parent"
        );
        let _entered = span.enter();
        tracing::info!(answer = 42, "inside");
        let inner = tracing::info_span!("order.insert", order = 7);
        let _inner = inner.enter();
        tracing::warn!("nested");
    });
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].get("trace_id").is_none(), "{}", lines[0]);
    for line in &lines[1..] {
        assert_eq!(
            line["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
            "{line}"
        );
    }
    // The rest of the format is unchanged: fields flattened, the span and span list.
    assert_eq!(lines[1]["answer"], 42);
    assert_eq!(lines[1]["message"], "inside");
    assert_eq!(lines[1]["span"]["request_id"], "r-1");
    assert_eq!(lines[2]["spans"].as_array().expect("span list").len(), 2);
    assert_eq!(lines[2]["level"], "WARN");
}

#[test]
fn a_span_without_a_received_trace_starts_one() {
    let lines = with_logs(|| {
        let span = tracing::info_span!("delivery", trace_id = tracing::field::Empty);
        let started = continue_trace(&span, None, None);
        let _entered = span.enter();
        tracing::info!(expected = %started.trace_id_hex(), "inside");
    });
    assert_eq!(lines.len(), 1);
    let trace_id = lines[0]["trace_id"].as_str().expect("a trace id");
    assert_eq!(trace_id.len(), 32);
    assert_eq!(lines[0]["expected"], trace_id);
}

#[test]
fn a_line_carries_the_request_id_and_the_fields_recorded_after_the_span_was_made() {
    let lines = with_logs(|| {
        let span = tracing::info_span!(
            "http",
            method = "POST",
            path = "/api/seckill/7",
            request_id = "r-\"quoted\"\n",
            user_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        continue_trace(&span, None, None);
        span.record("user_id", 42_u64);
        let _entered = span.enter();
        tracing::info!("inside");
        let inner = tracing::info_span!("stock.purchase", request_id = "r-inner");
        let _inner = inner.enter();
        tracing::info!("nested");
    });
    assert_eq!(lines.len(), 2, "{lines:?}");
    let outer = &lines[0]["span"];
    assert_eq!(outer["request_id"], "r-\"quoted\"\n", "{}", lines[0]);
    assert_eq!(outer["user_id"], 42);
    assert_eq!(outer["method"], "POST");
    assert_eq!(outer["path"], "/api/seckill/7");
    assert_eq!(outer["trace_id"], lines[0]["trace_id"]);
    let spans = lines[1]["spans"].as_array().expect("span list");
    assert_eq!(spans[0]["request_id"], "r-\"quoted\"\n", "{}", lines[1]);
    assert_eq!(spans[0]["user_id"], 42);
    assert_eq!(spans[1]["request_id"], "r-inner");
    assert_eq!(lines[1]["span"]["request_id"], "r-inner");
    assert_eq!(lines[1]["trace_id"], lines[0]["trace_id"]);
}

/// A request traced by a scope instead of a span logs the same line, once parsed, as one
/// inside the span the scope stands for: trace id first, the fields under `span` and in
/// `spans`, the event's own fields flattened.
#[test]
fn a_line_in_a_request_scope_reads_as_one_inside_its_span() {
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let runtime = runtime();
    let captured = captured(|| {
        let span = tracing::info_span!(
            "http",
            method = "POST",
            path = "/api/seckill/7",
            request_id = "r-\"quoted\"\n",
            user_id = tracing::field::Empty,
            trace_id = trace,
            service = "gateway",
        );
        span.record("user_id", -42_i64);
        span.in_scope(|| tracing::warn!(answer = 42, reason = "x\"y", "upstream refused"));
        let scope = RequestScope::new("http")
            .with_str("method", "POST")
            .with_str("path", "/api/seckill/7")
            .with_str("request_id", "r-\"quoted\"\n")
            .with_trace(
                TraceParent::parse_str(&format!("00-{trace}-00f067aa0ba902b7-01")).expect("valid"),
            )
            .with_str("service", "gateway");
        runtime.block_on(scope.run(async {
            request_scope::record_i64("user_id", -42);
            tracing::warn!(answer = 42, reason = "x\"y", "upstream refused");
        }));
        // Outside the scope again: a line of no request.
        tracing::warn!("after");
    });
    let lines = json_lines(&captured);
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert_eq!(without_time(&lines[1]), without_time(&lines[0]));
    assert_eq!(lines[1]["trace_id"], trace);
    assert_eq!(lines[1]["span"]["user_id"], -42, "{}", lines[1]);
    assert_eq!(lines[1]["spans"][0]["request_id"], "r-\"quoted\"\n");
    // The trace id is the line's first key, as inside a span.
    let text = captured.text();
    let scoped = text.lines().nth(1).expect("the second line");
    assert!(
        scoped.starts_with(&format!("{{\"trace_id\":\"{trace}\",")),
        "{scoped}"
    );
    assert!(lines[2].get("span").is_none(), "{}", lines[2]);
    assert!(lines[2].get("trace_id").is_none(), "{}", lines[2]);
}

/// A step of a scoped request with a span of its own: the scope stands for the outermost
/// span, as the request's span would.
#[test]
fn a_span_inside_a_request_scope_is_listed_under_it() {
    let trace = TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .expect("valid");
    let runtime = runtime();
    let lines = with_logs(|| {
        let outer = tracing::info_span!(
            "http",
            request_id = "r-1",
            trace_id = trace.trace_id_hex().as_str()
        );
        outer.in_scope(|| {
            tracing::info_span!("stock.purchase", request_id = "p-1")
                .in_scope(|| tracing::info!(step = 2, "inside"));
        });
        let scope = RequestScope::new("http")
            .with_str("request_id", "r-1")
            .with_trace(trace);
        runtime.block_on(scope.run(async {
            tracing::info_span!("stock.purchase", request_id = "p-1")
                .in_scope(|| tracing::info!(step = 2, "inside"));
        }));
    });
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(without_time(&lines[1]), without_time(&lines[0]));
    assert_eq!(lines[1]["span"]["request_id"], "p-1");
    assert_eq!(lines[1]["spans"][0]["request_id"], "r-1");
    assert_eq!(lines[1]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
}

/// What a step of a scoped request sends on, with no span of its own: the request's trace,
/// a new span id.
#[test]
fn a_step_without_a_span_carries_the_scoped_requests_trace() {
    let trace = TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
        .expect("valid");
    let runtime = runtime();
    let scope = RequestScope::new("http").with_trace(trace);
    let carried = runtime
        .block_on(scope.run(async { seckill_telemetry::carried(&tracing::Span::none()) }))
        .expect("the request's trace");
    assert_eq!(carried.traceparent.trace_id, trace.trace_id);
    assert_ne!(carried.traceparent.span_id, trace.span_id);
    assert_eq!(carried.traceparent.flags, 0, "the sampling decision kept");
    assert!(seckill_telemetry::carried(&tracing::Span::none()).is_none());
}

/// A runtime for a request scope's future (a task-local is set while a future is polled).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
}

/// `line` without its timestamp: two lines of the same event, compared.
fn without_time(line: &serde_json::Value) -> serde_json::Value {
    let mut line = line.clone();
    line.as_object_mut().expect("an object").remove("timestamp");
    line
}
