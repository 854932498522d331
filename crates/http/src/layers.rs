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
/// set a request id if there is none → a tracing
/// span carrying it, so every log line of the request has it → echo it on the response →
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
                .layer(
                    TraceLayer::new_for_http().make_span_with(move |req: &Request| {
                        let request_id = req
                            .headers()
                            .get(REQUEST_ID)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-");
                        // Plain strings: cheaper for the JSON log layer than `%` values.
                        let span = tracing::info_span!(
                            "http",
                            method = req.method().as_str(),
                            path = req.uri().path(),
                            request_id,
                            service,
                            trace_id = tracing::field::Empty,
                        );
                        continue_trace(&span, req);
                        span
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

/// Makes a request's span continue the caller's trace (its `traceparent`, when well formed)
/// or begin one, so every log line of the request carries the trace id.
fn continue_trace(span: &tracing::Span, req: &Request) {
    let headers = req.headers();
    let parent = headers
        .get(seckill_telemetry::TRACEPARENT)
        .and_then(|v| seckill_telemetry::TraceParent::parse(v.as_bytes()));
    let state = parent
        .and(headers.get(seckill_telemetry::TRACESTATE))
        .and_then(|v| v.to_str().ok());
    seckill_telemetry::continue_trace(span, parent.as_ref(), state);
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
