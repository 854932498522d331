//! The layer stack every service puts around its router, in one place.

use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use tower::ServiceBuilder;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use tower_http::trace::TraceLayer;

use crate::request_metrics;

/// A route label a handler can put in its response extensions when it serves a path that
/// matched no route template (the gateway's proxy fallback), to keep metric series few.
#[derive(Debug, Clone, Copy)]
pub struct RouteLabel(pub &'static str);

/// The request id header, created when absent and echoed on the response.
pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Whether a caller-sent request id is safe to keep: it travels into logs, Redis and AMQP
/// headers, so it must be short and plain (an oversize one could exceed an AMQP frame).
pub fn is_usable_request_id(id: &[u8]) -> bool {
    id.len() <= 128 && crate::is_plain_token(id)
}

/// New request ids: random (version 4) UUIDs from the thread's RNG. `MakeRequestUuid` asks
/// the kernel (`getrandom`) for every id, a system call per request on the hot path.
#[derive(Debug, Clone, Copy, Default)]
pub struct FastRequestUuid;

impl MakeRequestId for FastRequestUuid {
    fn make_request_id<B>(&mut self, _request: &axum::http::Request<B>) -> Option<RequestId> {
        Some(RequestId::new(new_request_id()))
    }
}

/// A new request id: a random (version 4) UUID from the thread's RNG, hyphenated.
pub fn new_request_id() -> HeaderValue {
    HeaderValue::from_bytes(&new_request_id_text())
        .expect("a hyphenated uuid is a valid header value")
}

/// [`new_request_id`] as text on the stack, for a caller that writes it out itself.
pub fn new_request_id_text() -> [u8; uuid::fmt::Hyphenated::LENGTH] {
    let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    id.hyphenated().encode_lower(&mut text);
    text
}

async fn drop_unusable_request_id(mut req: Request, next: Next) -> Response {
    if let Some(id) = req.headers().get(&REQUEST_ID)
        && !is_usable_request_id(id.as_bytes())
    {
        req.headers_mut().remove(&REQUEST_ID);
    }
    next.run(req).await
}

/// Wraps `router` (outermost first): drop a caller's request id that is not short and plain →
/// set a request id if there is none → the request's tracing planned
/// ([`seckill_telemetry::plan`]): a span when it is exported, else a request scope, so every
/// log line of the request has its id and trace either way → echo it on the response →
/// a panic becomes a JSON 500 instead of a dropped connection → per-route metrics.
pub fn instrument(router: Router, service: &'static str) -> Router {
    router
        .layer(middleware::from_fn(move |req, next| {
            record_metrics(service, req, next)
        }))
        .layer(
            ServiceBuilder::new()
                .layer(middleware::from_fn(drop_unusable_request_id))
                .layer(SetRequestIdLayer::new(REQUEST_ID, FastRequestUuid))
                .layer(middleware::from_fn(move |req, next| {
                    plan_trace(service, req, next)
                }))
                .layer(
                    TraceLayer::new_for_http().make_span_with(move |req: &Request| {
                        match req.extensions().get::<Traced>() {
                            Some(Traced(planned)) if planned.exported => {
                                // Plain strings: cheaper for the JSON log layer than `%` values.
                                let span = tracing::info_span!(
                                    "http",
                                    method = req.method().as_str(),
                                    path = req.uri().path(),
                                    request_id = request_id(req),
                                    service,
                                    trace_id = tracing::field::Empty,
                                );
                                let (parent, state) = received(req);
                                planned.continue_in(&span, parent.as_ref(), state);
                                span
                            }
                            // Traced by its scope.
                            _ => tracing::Span::none(),
                        }
                    }),
                )
                .layer(PropagateRequestIdLayer::new(REQUEST_ID))
                .layer(CatchPanicLayer::custom(|_| {
                    crate::error_response(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "internal error",
                    )
                })),
        )
}

/// How a request is traced, planned once by [`plan_trace`] for the layers inside it.
#[derive(Debug, Clone, Copy)]
struct Traced(seckill_telemetry::Planned);

fn request_id(req: &Request) -> &str {
    req.headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
}

/// The caller's trace context (its `traceparent`, when well formed, and `tracestate`).
fn received(req: &Request) -> (Option<seckill_telemetry::TraceParent>, Option<&str>) {
    let headers = req.headers();
    let parent = headers
        .get(seckill_telemetry::TRACEPARENT)
        .and_then(|v| seckill_telemetry::TraceParent::parse(v.as_bytes()));
    let state = parent
        .and(headers.get(seckill_telemetry::TRACESTATE))
        .and_then(|v| v.to_str().ok());
    (parent, state)
}

/// Plans the request's tracing: continues the caller's trace or begins one, and when the
/// request is not exported runs it in a request scope carrying its method, path, id,
/// service and trace (the span the trace layer makes otherwise).
async fn plan_trace(service: &'static str, mut req: Request, next: Next) -> Response {
    let (parent, _) = received(&req);
    let planned = seckill_telemetry::plan(parent.as_ref());
    req.extensions_mut().insert(Traced(planned));
    if planned.exported || !tracing::span_enabled!(tracing::Level::INFO) {
        return next.run(req).await;
    }
    let scope = seckill_telemetry::RequestScope::new("http")
        .with_str("method", req.method().as_str())
        .with_str("path", req.uri().path())
        .with_str("request_id", request_id(&req))
        .with_str("service", service)
        .with_trace(planned.onwards);
    scope.run(next.run(req)).await
}

async fn record_metrics(service: &'static str, req: Request, next: Next) -> Response {
    let started = Instant::now();
    // The route template, not the raw path: one series per route, not per product id.
    let matched = req.extensions().get::<MatchedPath>().cloned();
    let method = request_metrics::method_label(req.method());
    let response = next.run(req).await;
    let route = match &matched {
        Some(matched) => matched.as_str(),
        None => response
            .extensions()
            .get::<RouteLabel>()
            .map_or("unmatched", |label| label.0),
    };
    request_metrics::record(service, route, method, response.status(), started.elapsed());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_request_ids_are_distinct_version_4_uuids() {
        let request = axum::http::Request::new(());
        let mut make = FastRequestUuid;
        let ids: std::collections::HashSet<String> = (0..1000)
            .map(|_| {
                let id = make.make_request_id(&request).expect("an id");
                id.header_value().to_str().expect("ascii").to_string()
            })
            .collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let parsed = uuid::Uuid::parse_str(id).expect("a uuid");
            assert_eq!(parsed.get_version_num(), 4);
        }
    }

    #[test]
    fn only_short_plain_request_ids_are_kept() {
        assert!(is_usable_request_id(
            b"0193c2a4-7d1e-7f00-9c1a-1b2c3d4e5f60"
        ));
        assert!(!is_usable_request_id(b""));
        assert!(!is_usable_request_id(&[b'a'; 129]));
        assert!(!is_usable_request_id(b"has space"));
        assert!(!is_usable_request_id(b"new\nline"));
    }
}
