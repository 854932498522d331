//! The JSON log line's `trace_id`: a layer remembers each span's `trace_id` field, and the
//! JSON format writes the innermost one first on every line emitted inside such a span.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use crate::trace_context::SpanTraceId;

/// The span field naming the trace a span belongs to.
pub const TRACE_ID_FIELD: &str = "trace_id";

/// Keeps each span's `trace_id` field in the span's extensions, for [`WithTraceId`].
#[derive(Debug, Default, Clone, Copy)]
pub struct TraceIdLayer;

struct Find(Option<SpanTraceId>);

impl Visit for Find {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == TRACE_ID_FIELD
            && let Some(trace_id) = SpanTraceId::new(value)
        {
            self.0 = Some(trace_id);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == TRACE_ID_FIELD {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

impl<S> tracing_subscriber::Layer<S> for TraceIdLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().fields().field(TRACE_ID_FIELD).is_none() {
            return;
        }
        let mut find = Find(None);
        attrs.record(&mut find);
        if let (Some(trace_id), Some(span)) = (find.0, ctx.span(id)) {
            span.extensions_mut().insert(trace_id);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut find = Find(None);
        values.record(&mut find);
        if let (Some(trace_id), Some(span)) = (find.0, ctx.span(id)) {
            span.extensions_mut().replace(trace_id);
        }
    }
}

/// A JSON event format that writes `"trace_id"` first on a line emitted inside a span with
/// a trace id (the innermost one), and the line exactly as `F` writes it otherwise.
#[derive(Debug, Clone)]
pub struct WithTraceId<F>(pub F);

impl<S, N, F> FormatEvent<S, N> for WithTraceId<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let spans = ctx.event_scope();
        let in_span = spans.is_some();
        let trace_id = spans.and_then(|scope| {
            scope
                .into_iter()
                .find_map(|span| span.extensions().get::<SpanTraceId>().copied())
        });
        // A request traced by a scope: its fields stand for its span, the outermost.
        if let Some(written) = crate::request_scope::current(|request| {
            self.format_in_request(ctx, &mut writer, event, request, in_span, trace_id)
        }) {
            return written;
        }
        let Some(trace_id) = trace_id else {
            return self.0.format_event(ctx, writer, event);
        };
        let mut line = String::with_capacity(256);
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        write_with_trace_id(&mut writer, &line, Some(trace_id))
    }
}

impl<F> WithTraceId<F> {
    /// The line of `event`, emitted while `request` is set, as it would read were `request`
    /// the span it stands for, the outermost: in no span (`in_span` false), its fields
    /// under `"span"` and as the one entry of `"spans"` (the last keys of the JSON format,
    /// after `"target"`); in spans of the request's own steps, its fields first in
    /// `"spans"`. The trace id first: the innermost span's (`trace_id`), else the request's.
    fn format_in_request<S, N>(
        &self,
        ctx: &FmtContext<'_, S, N>,
        writer: &mut Writer<'_>,
        event: &Event<'_>,
        request: &crate::request_scope::RequestScope,
        in_span: bool,
        trace_id: Option<SpanTraceId>,
    ) -> fmt::Result
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
        N: for<'a> FormatFields<'a> + 'static,
        F: FormatEvent<S, N>,
    {
        let trace_id = trace_id.or(request.trace_id());
        let mut line = String::with_capacity(384);
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let end = line.trim_end().len();
        if !line[..end].ends_with('}') {
            return write_with_trace_id(writer, &line, trace_id);
        }
        let mut span = String::with_capacity(192);
        request.with_fields(|name, fields| {
            let inner = fields
                .strip_prefix('{')
                .and_then(|f| f.strip_suffix('}'))
                .unwrap_or_default();
            span.push('{');
            span.push_str(inner);
            if !inner.is_empty() {
                span.push(',');
            }
            span.push_str("\"name\":\"");
            span.push_str(name);
            span.push_str("\"}");
        });
        const SPANS: &str = "\"spans\":[";
        let with_span = match line.rfind(SPANS) {
            // The list is written after the event's fields, whose keys and text are
            // escaped: its last occurrence is the list.
            Some(at) if in_span => {
                let (head, tail) = line.split_at(at + SPANS.len());
                let comma = if tail.starts_with(']') { "" } else { "," };
                format!("{head}{span}{comma}{tail}")
            }
            _ if in_span => line,
            _ => {
                let (head, tail) = line.split_at(end - 1);
                format!("{head},\"span\":{span},\"spans\":[{span}]{tail}")
            }
        };
        write_with_trace_id(writer, &with_span, trace_id)
    }
}

/// Writes `line` (a JSON object) with `"trace_id"` as its first key when there is one.
fn write_with_trace_id(
    writer: &mut Writer<'_>,
    line: &str,
    trace_id: Option<SpanTraceId>,
) -> fmt::Result {
    match (trace_id, line.strip_prefix('{')) {
        (Some(trace_id), Some(rest)) => {
            write!(writer, "{{\"trace_id\":\"{}\",{rest}", trace_id.as_str())
        }
        _ => writer.write_str(line),
    }
}

/// The trace id recorded on `span` or the nearest of its ancestors (with export off, the
/// only place a span's trace is known).
pub(crate) fn trace_id_in_scope(span: &tracing::Span) -> Option<[u8; 16]> {
    let hex = span
        .with_subscriber(|(id, dispatch)| {
            let registry = dispatch.downcast_ref::<tracing_subscriber::Registry>()?;
            let span = registry.span(id)?;
            span.scope()
                .find_map(|s| s.extensions().get::<SpanTraceId>().copied())
        })
        .flatten()?;
    let hex = hex.as_str().as_bytes();
    if hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (i, byte) in id.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&hex[2 * i..2 * i + 2]).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    (id != [0; 16]).then_some(id)
}
