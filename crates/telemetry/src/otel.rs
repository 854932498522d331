//! OpenTelemetry: the OTLP exporter the standard variables ask for, and how a span joins a
//! trace it received as a `traceparent`.
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` unset or empty: no exporter and no OpenTelemetry layer,
//!   so spans cost what they cost without it. Traces are still continued: the trace id of a
//!   received (or new) `traceparent` is recorded on the span (`trace_id`) and sent onwards.
//! - `OTEL_EXPORTER_OTLP_PROTOCOL`: `http/protobuf` (default) or `grpc`.
//! - `OTEL_SERVICE_NAME`: the service name, else the service's own.
//! - `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`: which traces are exported
//!   ([`Sampling`]): `parentbased_always_on` (default), `always_on`, `always_off`,
//!   `traceidratio`, `parentbased_always_off`, `parentbased_traceidratio`, the ratio (0 to 1,
//!   default 1) in the argument. A value not understood is logged as a warning and the
//!   default (or a ratio of 1) used, as the OpenTelemetry specification says.
//!
//! Spans are batched (a Tokio task sends them) and flushed by [`shutdown_tracing`]; a
//! failed export is counted and logged ([`watched`]). The global propagator is W3C
//! TraceContext.

pub mod watched;

use std::cell::Cell;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use opentelemetry::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, SdkTracerProvider, ShouldSample,
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::trace_context::TraceParent;

static EXPORTING: AtomicBool = AtomicBool::new(false);
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
/// The sampler [`plan`] decides with ([`set_sampling`]).
static PLAN_SAMPLER: OnceLock<Sampler> = OnceLock::new();

thread_local! {
    /// The trace id [`PlannedIds`] gives the next root span made on this thread: the one
    /// [`plan`] decided on.
    static PLANNED_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
}

/// Whether spans are exported (an OpenTelemetry layer is installed).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The provider the standard variables ask for, sampled as `sampling` says, `None` when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is unset or empty.
pub fn provider_from_env(
    service: &str,
    sampling: &Sampling,
) -> anyhow::Result<Option<SdkTracerProvider>> {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
    if endpoint.trim().is_empty() {
        return Ok(None);
    }
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").unwrap_or_default();
    let exporter = match protocol.trim() {
        "" | "http/protobuf" => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .build()?,
        "grpc" => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?,
        other => anyhow::bail!(
            "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported (http/protobuf or grpc)"
        ),
    };
    Ok(Some(batched_with(
        watched::Watched::new(exporter, endpoint.trim()),
        service,
        sampling,
    )?))
}

/// The sampling `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` ask for: what the
/// exported spans are a sample of.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    /// The sampler's name, as the variable spells it (`parentbased_always_on` when unset).
    pub name: &'static str,
    /// The ratio of `traceidratio` and `parentbased_traceidratio`.
    pub ratio: Option<f64>,
    /// Why a value was not used, for a warning.
    pub warning: Option<String>,
}

/// The samplers of the standard variable, with whether they take a ratio.
const SAMPLERS: [(&str, bool); 6] = [
    ("always_on", false),
    ("always_off", false),
    ("traceidratio", true),
    ("parentbased_always_on", false),
    ("parentbased_always_off", false),
    ("parentbased_traceidratio", true),
];

impl Sampling {
    /// From the process's environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// From the variables `lookup` gives (`None`: unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let default = Self {
            name: "parentbased_always_on",
            ratio: None,
            warning: None,
        };
        let Some(asked) = lookup("OTEL_TRACES_SAMPLER").filter(|s| !s.trim().is_empty()) else {
            return default;
        };
        let asked = asked.trim().to_ascii_lowercase();
        let Some(&(name, takes_ratio)) = SAMPLERS.iter().find(|(name, _)| *name == asked) else {
            return Self {
                warning: Some(format!(
                    "OTEL_TRACES_SAMPLER={asked:?} is not one of {}: {} is used",
                    SAMPLERS.map(|(name, _)| name).join(", "),
                    default.name
                )),
                ..default
            };
        };
        if !takes_ratio {
            return Self {
                name,
                ratio: None,
                warning: None,
            };
        }
        let arg = lookup("OTEL_TRACES_SAMPLER_ARG").filter(|s| !s.trim().is_empty());
        let Some(arg) = arg else {
            return Self {
                name,
                ratio: Some(1.0),
                warning: None,
            };
        };
        match arg.trim().parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => Self {
                name,
                ratio: Some(ratio),
                warning: None,
            },
            _ => Self {
                name,
                ratio: Some(1.0),
                warning: Some(format!(
                    "OTEL_TRACES_SAMPLER_ARG={arg:?} is not a ratio from 0 to 1: 1 is used"
                )),
            },
        }
    }

    /// The sampler itself.
    pub fn sampler(&self) -> Sampler {
        let ratio = self.ratio.unwrap_or(1.0);
        match self.name {
            "always_on" => Sampler::AlwaysOn,
            "always_off" => Sampler::AlwaysOff,
            "traceidratio" => Sampler::TraceIdRatioBased(ratio),
            "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            "parentbased_traceidratio" => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio)))
            }
            _ => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        }
    }
}

impl std::fmt::Display for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ratio {
            Some(ratio) => write!(f, "{} {ratio}", self.name),
            None => f.write_str(self.name),
        }
    }
}

/// A provider that batches spans into `exporter` on the current Tokio runtime, sampled as
/// the standard variables say ([`Sampling::from_env`]).
pub fn batched(
    exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static,
    service: &str,
) -> anyhow::Result<SdkTracerProvider> {
    batched_with(exporter, service, &Sampling::from_env())
}

/// [`batched`] with the sampling given.
pub fn batched_with(
    exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static,
    service: &str,
    sampling: &Sampling,
) -> anyhow::Result<SdkTracerProvider> {
    tokio::runtime::Handle::try_current().context("the batch exporter runs on a Tokio runtime")?;
    let processor =
        opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor::builder(
            exporter,
            opentelemetry_sdk::runtime::Tokio,
        )
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_id_generator(PlannedIds::default())
        .with_sampler(sampling.sampler())
        .with_resource(resource(service))
        .build())
}

/// The resource naming the service: `OTEL_SERVICE_NAME`, else `service`.
pub fn resource(service: &str) -> Resource {
    let name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| service.to_string());
    Resource::builder().with_service_name(name).build()
}

/// The layer that hands spans to `provider`, for a subscriber built by hand (a test with an
/// in-memory exporter); [`crate::init_tracing`] builds its own.
pub fn layer<S>(provider: &SdkTracerProvider, service: &str) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(service.to_string()))
        .with_tracked_inactivity(false)
}

/// Marks spans as exported through `provider`: call once the subscriber with
/// [`layer`]`(provider)` is the global one (the W3C propagator is installed too).
pub fn installed(provider: SdkTracerProvider) {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = PROVIDER.set(provider);
    EXPORTING.store(true, Ordering::Relaxed);
}

/// Sends the spans still batched and stops the exporter; call once before exiting. Does
/// nothing when spans are not exported.
pub async fn shutdown_tracing() {
    let Some(provider) = PROVIDER.get().cloned() else {
        return;
    };
    // The batch task runs on this runtime while a blocking thread waits for it.
    let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    if let Ok(Err(e)) = flushed {
        eprintln!("OpenTelemetry shutdown: {e}");
    }
}

/// Makes `span` continue the trace of `parent` (a received `traceparent`, with its
/// `tracestate`), or begin a new trace when there is none, and records the trace id in its
/// `trace_id` field (declare it `trace_id = tracing::field::Empty`). Returns the context to
/// send onwards: the same trace, with `span` as the parent.
///
/// With export on, `span` must not have been entered yet (its parent is fixed then); with
/// export off this costs a random span id and nothing else.
pub fn continue_trace(
    span: &tracing::Span,
    parent: Option<&TraceParent>,
    tracestate: Option<&str>,
) -> TraceParent {
    continue_with(span, parent, tracestate, None)
}

/// [`continue_trace`], a new trace taking the id `root` when given (a planned one).
fn continue_with(
    span: &tracing::Span,
    parent: Option<&TraceParent>,
    tracestate: Option<&str>,
    root: Option<TraceId>,
) -> TraceParent {
    if exporting() && !span.is_disabled() {
        let cx = match parent {
            Some(parent) => Context::new().with_remote_span_context(remote(parent, tracestate)),
            None => Context::new(),
        };
        // The span is made (its ids drawn, its sampling decided) by the first of these.
        PLANNED_TRACE_ID.set(root);
        let _ = span.set_parent(cx);
        let own = span.context().span().span_context().clone();
        PLANNED_TRACE_ID.set(None);
        if own.is_valid() {
            let onwards = TraceParent {
                trace_id: own.trace_id().to_bytes(),
                span_id: own.span_id().to_bytes(),
                flags: own.trace_flags().to_u8(),
            };
            span.record(crate::TRACE_ID_FIELD, onwards.trace_id_hex().as_str());
            return onwards;
        }
    }
    let onwards = parent.map_or_else(TraceParent::new_root, TraceParent::child);
    span.record(crate::TRACE_ID_FIELD, onwards.trace_id_hex().as_str());
    onwards
}

/// How a request is traced, decided before anything of it is made ([`plan`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Whether the request gets a span that is exported: export is on and its trace is
    /// sampled. Otherwise its log lines need only a [`crate::RequestScope`].
    pub exported: bool,
    /// The request's own context: the trace it continues (or a new one), a new span id
    /// standing for it, the flags its caller sent (a new trace: sampled) — with the sampled
    /// flag cleared when export is on and the sampler said no, so that the services after it
    /// drop the trace too.
    pub onwards: TraceParent,
}

impl Planned {
    /// The context sent onwards once the request's `span` (when [`Planned::exported`]) is
    /// made: `span`'s own, whose parent it sets ([`continue_trace`], a new trace under the
    /// planned id), else the plan's own, recorded on `span` if it is enabled.
    pub fn continue_in(
        &self,
        span: &tracing::Span,
        received: Option<&TraceParent>,
        tracestate: Option<&str>,
    ) -> TraceParent {
        if !self.exported {
            span.record(crate::TRACE_ID_FIELD, self.onwards.trace_id_hex().as_str());
            return self.onwards;
        }
        let root = received
            .is_none()
            .then(|| TraceId::from_bytes(self.onwards.trace_id));
        continue_with(span, received, tracestate, root)
    }
}

/// Decides how a request continuing `received` (or starting a trace) is traced: with export
/// off, never by a span of its own; with export on, as the sampler of the standard
/// variables ([`set_sampling`]) decides for its trace id, the same decision the exporter's
/// provider makes ([`batched_with`] gives a new trace the planned id).
pub fn plan(received: Option<&TraceParent>) -> Planned {
    let onwards = received.map_or_else(TraceParent::new_root, TraceParent::child);
    if !exporting() {
        return Planned {
            exported: false,
            onwards,
        };
    }
    let parent = match received {
        Some(received) => Context::new().with_remote_span_context(remote(received, None)),
        None => Context::new(),
    };
    let sampler = PLAN_SAMPLER.get_or_init(|| Sampling::from_env().sampler());
    let decision = sampler
        .should_sample(
            Some(&parent),
            TraceId::from_bytes(onwards.trace_id),
            "http",
            &SpanKind::Internal,
            &[],
            &[],
        )
        .decision;
    let exported = decision == SamplingDecision::RecordAndSample;
    Planned {
        exported,
        onwards: TraceParent {
            flags: if exported {
                onwards.flags
            } else {
                onwards.flags & !0x01
            },
            ..onwards
        },
    }
}

/// The sampling [`plan`] decides with: the one the exporter's provider was built with.
/// [`crate::init_tracing`] sets it from the standard variables; the first call wins (a
/// plan made before any call uses the variables).
pub fn set_sampling(sampling: &Sampling) {
    let _ = PLAN_SAMPLER.set(sampling.sampler());
}

/// The ids of the spans [`batched_with`]'s provider makes: random, except that a new trace
/// made by [`Planned::continue_in`] takes the trace id its plan was decided on, so a ratio
/// sampler decides the same twice.
#[derive(Debug, Default)]
pub struct PlannedIds(RandomIdGenerator);

impl IdGenerator for PlannedIds {
    fn new_trace_id(&self) -> TraceId {
        PLANNED_TRACE_ID
            .take()
            .unwrap_or_else(|| self.0.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.0.new_span_id()
    }
}

/// A trace context to carry onwards, in an outbox entry or in message headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    /// The `traceparent`: `span`'s own context (with export off: its trace, and a new span
    /// id standing for it).
    pub traceparent: TraceParent,
    /// The `tracestate`, empty when there is none.
    pub tracestate: String,
}

/// The context that names `span` as the parent of what it sends on, `None` when `span`
/// belongs to no trace (no traced ancestor and no export).
pub fn carried(span: &tracing::Span) -> Option<Carried> {
    if exporting() && !span.is_disabled() {
        let cx = span.context();
        let own = cx.span().span_context().clone();
        if own.is_valid() {
            return Some(Carried {
                traceparent: TraceParent {
                    trace_id: own.trace_id().to_bytes(),
                    span_id: own.span_id().to_bytes(),
                    flags: own.trace_flags().to_u8(),
                },
                tracestate: own.trace_state().header(),
            });
        }
    }
    let trace_id = crate::logs::trace_id_in_scope(span)
        .or_else(|| crate::logs::trace_id_in_scope(&tracing::Span::current()));
    let Some(trace_id) = trace_id else {
        // A step of a request traced by a scope, not a span: the request's own context.
        let trace = crate::request_scope::current(|scope| scope.trace()).flatten()?;
        return Some(Carried {
            traceparent: trace.child(),
            tracestate: String::new(),
        });
    };
    let traceparent = TraceParent {
        trace_id,
        span_id: [0; 8],
        flags: 0x01,
    }
    .child();
    Some(Carried {
        traceparent,
        tracestate: String::new(),
    })
}

/// [`carried`] of `span`, or else the context received (`received`, with its
/// `tracestate`) continued by a new span id: what a service sends on even when its spans are
/// disabled (no subscriber, or filtered out) and so cannot say which trace they are in.
pub fn carried_or(
    span: &tracing::Span,
    received: Option<&TraceParent>,
    tracestate: Option<&str>,
) -> Option<Carried> {
    carried(span).or_else(|| {
        received.map(|received| Carried {
            traceparent: received.child(),
            tracestate: tracestate.unwrap_or_default().to_string(),
        })
    })
}

/// Links `span` to the span `other` names (a batch span to each message's trace); nothing
/// when spans are not exported.
pub fn link(span: &tracing::Span, other: &TraceParent) {
    if exporting() {
        span.add_link(remote(other, None));
    }
}

/// The remote span context a `traceparent` names.
fn remote(parent: &TraceParent, tracestate: Option<&str>) -> SpanContext {
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    SpanContext::new(
        TraceId::from_bytes(parent.trace_id),
        SpanId::from_bytes(parent.span_id),
        TraceFlags::new(parent.flags),
        true,
        state,
    )
}
