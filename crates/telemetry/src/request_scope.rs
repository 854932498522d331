//! A request's log context without a span: what a request that is not exported carries.
//!
//! A `tracing` span costs a request its registry slot, each layer's extensions, its fields
//! written out and a thread-local push and pop at every poll, whether or not a line is ever
//! emitted inside it; under a flood that was a tenth of the gateway's CPU at the default
//! `info` filter. A request whose span would not be exported (no exporter, or its trace not
//! sampled: [`crate::otel::plan`]) needs only what its log lines carry: a [`RequestScope`],
//! its fields kept as the JSON object a span's would be (written once, a later field
//! appended), set for the request's future by a task-local. A line emitted while it is set,
//! in no span of its own, reads as if emitted inside a span named [`RequestScope::new`]'s
//! name with those fields: `trace_id` first, the fields under `"span"` and in `"spans"`
//! ([`crate::logs::WithTraceId`]).

use std::cell::RefCell;
use std::future::Future;

use crate::json_fields;
use crate::trace_context::{SpanTraceId, TraceParent};

tokio::task_local! {
    static REQUEST: RequestScope;
}

/// The log context of one request; see the module docs.
#[derive(Debug)]
pub struct RequestScope {
    /// The span name it stands for.
    name: &'static str,
    /// The fields as a JSON object, `"{...}"`.
    fields: RefCell<String>,
    /// The trace id, written first on every line.
    trace_id: Option<SpanTraceId>,
    /// The request's own trace context ([`crate::otel::Planned::onwards`]): what a step of
    /// the request sends on ([`crate::carried`]) when it has no span.
    trace: Option<TraceParent>,
}

impl RequestScope {
    /// A scope standing for a span named `name`, with no fields yet.
    pub fn new(name: &'static str) -> Self {
        let mut fields = String::with_capacity(160);
        fields.push_str("{}");
        Self {
            name,
            fields: RefCell::new(fields),
            trace_id: None,
            trace: None,
        }
    }

    /// With the field `key` = `value`.
    pub fn with_str(self, key: &str, value: &str) -> Self {
        json_fields::push_str(&mut self.fields.borrow_mut(), key, value);
        self
    }

    /// With the request's own trace context: its trace id as the `trace_id` field and first
    /// on every line.
    pub fn with_trace(mut self, trace: TraceParent) -> Self {
        let hex = trace.trace_id_hex();
        self.trace_id = SpanTraceId::new(hex.as_str());
        self.trace = Some(trace);
        self.with_str(crate::TRACE_ID_FIELD, hex.as_str())
    }

    /// Runs `future` with this scope as its requests' log context.
    pub fn run<F: Future>(self, future: F) -> impl Future<Output = F::Output> {
        REQUEST.scope(self, future)
    }

    /// The span name and the fields' object, for a line.
    pub(crate) fn with_fields<R>(&self, f: impl FnOnce(&'static str, &str) -> R) -> R {
        f(self.name, &self.fields.borrow())
    }

    pub(crate) fn trace_id(&self) -> Option<SpanTraceId> {
        self.trace_id
    }

    pub(crate) fn trace(&self) -> Option<TraceParent> {
        self.trace
    }
}

/// Calls `f` with the scope of the request being handled, if any.
pub(crate) fn current<R>(f: impl FnOnce(&RequestScope) -> R) -> Option<R> {
    REQUEST.try_with(f).ok()
}

/// Whether the request being handled has a scope (and so no span of its own).
pub fn active() -> bool {
    REQUEST.try_with(|_| ()).is_ok()
}

/// Records `key` = `value` on the request being handled: on its scope when it has one, else
/// on the current span (a request that is exported has a span instead).
pub fn record_i64(key: &'static str, value: i64) {
    let recorded = REQUEST
        .try_with(|scope| json_fields::push_number(&mut scope.fields.borrow_mut(), key, value))
        .is_ok();
    if !recorded {
        tracing::Span::current().record(key, value);
    }
}

/// The span of a step of the request being handled: none when the request is traced by a
/// scope (the step's `fields` are recorded on the scope instead, so its lines still carry
/// them), else what `make` makes.
pub fn step_span(
    fields: &[(&'static str, i64)],
    make: impl FnOnce() -> tracing::Span,
) -> tracing::Span {
    let recorded = REQUEST
        .try_with(|scope| {
            let mut text = scope.fields.borrow_mut();
            for &(key, value) in fields {
                json_fields::push_number(&mut text, key, value);
            }
        })
        .is_ok();
    if recorded {
        tracing::Span::none()
    } else {
        make()
    }
}

/// [`record_i64`] for a text value.
pub fn record_str(key: &'static str, value: &str) {
    let recorded = REQUEST
        .try_with(|scope| json_fields::push_str(&mut scope.fields.borrow_mut(), key, value))
        .is_ok();
    if !recorded {
        tracing::Span::current().record(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fields_are_the_object_a_span_would_hold() {
        let trace =
            TraceParent::parse_str("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
                .expect("valid");
        let scope = RequestScope::new("http")
            .with_str("path", "/a\"b")
            .with_trace(trace);
        let fields = scope
            .run(async {
                record_i64("user_id", 7);
                current(|scope| scope.with_fields(|name, fields| (name, fields.to_string())))
            })
            .await
            .expect("inside the scope");
        assert_eq!(fields.0, "http");
        let object: serde_json::Value = serde_json::from_str(&fields.1).expect("JSON");
        assert_eq!(
            object,
            serde_json::json!({
                "path": "/a\"b",
                "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                "user_id": 7
            })
        );
        assert!(current(|_| ()).is_none(), "no scope outside its future");
    }
}
