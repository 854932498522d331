//! The gateway's request path, written out as one function.
//!
//! Every request that is not an operator endpoint goes, in this order:
//!
//! 1. **in-flight bound** — past `max_in_flight`, an immediate 503 (`Retry-After: 1`), never a
//!    queue;
//! 2. **request id** — the caller's if short and plain, a new UUID otherwise; forwarded and
//!    echoed on the answer, and in the request's log span;
//! 3. **deadline** — the rest must finish within `request_timeout_ms` (504), and a panic in
//!    it becomes a JSON 500 instead of a dropped connection;
//! 4. **who** — the client address (through trusted proxies only) and the bearer token's
//!    verdict, which refuses nothing yet;
//! 5. **rate limit** — charged to the verified user, or to the client address when there is
//!    none (garbage tokens included), against the purchase quota or the default one (429);
//! 6. **route** — 404 for a path no service owns, 401 without a valid token, 403 for a
//!    non-admin on an admin route;
//! 7. **forward** to a replica ([`crate::proxy::forward`]).
//!
//! Every answer, shed ones included, is counted in `http_requests_total` and timed in
//! `http_request_duration_seconds` under the owning service's name (`unmatched` when none).
//!
//! The same steps were once a tower stack around an axum router (a dozen layers, each
//! boxing, cloning or allocating on every request); as one function, the gateway spends
//! about 28 % less CPU per proxied request (docs/benchmarks.md). The operator endpoints
//! (`/healthz`, `/readyz`, `/metrics`) still go to the shared axum router, exempt from the
//! in-flight bound and the rate limits: probes and scrapers must get through a flood.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use futures_util::FutureExt;
use hyper::body::Incoming;
use tower::ServiceExt;
use tracing::Instrument;

use seckill_http::error_response;
use seckill_http::layers::{REQUEST_ID, is_usable_request_id, new_request_id};
use seckill_http::request_metrics::{self, method_label};

use crate::auth::{self, Authenticator, Caller};
use crate::client_ip::TrustedProxies;
use crate::proxy::{self, ProxyState, Route};
use crate::ratelimit::{RateKey, RateLimits, Verdict, is_purchase};

/// Everything a request needs on its way through the gateway.
pub struct Door {
    /// `/healthz`, `/readyz`, `/metrics`.
    pub ops: Router,
    /// Verifies bearer tokens.
    pub auth: Authenticator,
    /// Whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Arc<TrustedProxies>,
    /// The two quotas.
    pub rate_limits: RateLimits,
    /// Upstreams and forwarding settings.
    pub proxy: ProxyState,
    /// Requests past the operator endpoints still being answered.
    pub in_flight: InFlight,
    /// Deadline for a whole request (504 beyond).
    pub request_timeout: Duration,
}

impl std::fmt::Debug for Door {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Door")
            .field("in_flight", &self.in_flight)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

/// Operator endpoints, served by the ops router.
fn is_ops(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

impl Door {
    /// Answers one request that arrived from `peer`.
    pub async fn answer(
        self: Arc<Self>,
        request: hyper::Request<Incoming>,
        peer: SocketAddr,
    ) -> Result<Response, Infallible> {
        if is_ops(request.uri().path()) {
            let mut request = request.map(Body::new);
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            return self.ops.clone().oneshot(request).await;
        }
        let started = Instant::now();
        let method = method_label(request.method());
        let route = proxy::route(request.uri().path());
        let label = route.map_or("unmatched", |r| r.service.name());
        let Some(slot) = self.in_flight.enter() else {
            metrics::counter!("gateway_shed_total").increment(1);
            let response = proxy::unavailable("overloaded, retry shortly");
            record(label, method, response.status(), started);
            return Ok(response);
        };
        let (request, request_id) = with_request_id(request);
        let span = tracing::info_span!(
            "http",
            method = %request.method(),
            path = %request.uri().path(),
            request_id = request_id.to_str().unwrap_or("-"),
            user_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        let admitted = AssertUnwindSafe(self.admit(request, route, peer)).catch_unwind();
        let mut response = match tokio::time::timeout(self.request_timeout, admitted)
            .instrument(span)
            .await
        {
            Ok(Ok(response)) => response,
            Ok(Err(_panic)) => {
                tracing::error!("request handler panicked");
                error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
            Err(_elapsed) => {
                metrics::counter!("gateway_timeouts_total").increment(1);
                error_response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the request took too long",
                )
            }
        };
        drop(slot);
        response.headers_mut().insert(REQUEST_ID, request_id);
        record(label, method, response.status(), started);
        Ok(response)
    }

    /// Steps 4 to 7: who, rate limit, route, forward.
    async fn admit(
        &self,
        request: hyper::Request<Incoming>,
        route: Option<Route>,
        peer: SocketAddr,
    ) -> Response {
        let client = self.trusted_proxies.client_ip(peer.ip(), request.headers());
        let caller = self.auth.authenticate(request.headers());
        let key = match &caller {
            Ok(caller) => RateKey::User(caller.user_id),
            Err(_) => RateKey::Client(client),
        };
        let purchase = is_purchase(request.method(), request.uri().path());
        let verdict = self.rate_limits.check(purchase, key).await;
        if let Verdict::Limited(refusal) = verdict {
            return refusal;
        }
        let mut response = self.route(request, route, caller, peer).await;
        verdict.annotate(&mut response);
        response
    }

    async fn route(
        &self,
        request: hyper::Request<Incoming>,
        route: Option<Route>,
        caller: Result<Arc<Caller>, &'static str>,
        peer: SocketAddr,
    ) -> Response {
        let Some(route) = route else {
            return error_response(StatusCode::NOT_FOUND, "not_found", "no such route");
        };
        let caller = match caller {
            Ok(caller) => caller,
            Err(reason) => return auth::unauthorized(reason),
        };
        tracing::Span::current().record("user_id", caller.user_id);
        if route.admin_only && !caller.is_admin() {
            return auth::forbidden();
        }
        proxy::forward(&self.proxy, route.service, &caller, peer, request).await
    }
}

/// The in-flight bound: a counter shared by every worker thread.
#[derive(Debug)]
pub struct InFlight {
    now: AtomicUsize,
    max: usize,
}

impl InFlight {
    /// At most `max` at once.
    pub fn new(max: usize) -> Self {
        Self {
            now: AtomicUsize::new(0),
            max,
        }
    }

    /// A slot until the guard is dropped, or none when all `max` are taken.
    fn enter(&self) -> Option<Slot<'_>> {
        let before = self.now.fetch_add(1, Ordering::AcqRel);
        // Taken either way, so that dropping it gives the count back either way.
        let slot = Slot(&self.now);
        (before < self.max).then_some(slot)
    }
}

/// One taken in-flight slot.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Keeps the caller's request id if it is short and plain, else sets a new one; returns
/// the id for the answer.
fn with_request_id(
    mut request: hyper::Request<Incoming>,
) -> (hyper::Request<Incoming>, HeaderValue) {
    let headers = request.headers_mut();
    let id = match headers.get(&REQUEST_ID) {
        Some(id) if is_usable_request_id(id.as_bytes()) => id.clone(),
        _ => {
            let id = new_request_id();
            headers.insert(REQUEST_ID, id.clone());
            id
        }
    };
    (request, id)
}

/// Counts and times one answer.
fn record(route: &'static str, method: &'static str, status: StatusCode, started: Instant) {
    request_metrics::record("gateway", route, method, status, started.elapsed());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_flight_bound_sheds_past_max_and_frees_on_drop() {
        let bound = InFlight::new(2);
        let first = bound.enter().expect("first");
        let second = bound.enter().expect("second");
        assert!(bound.enter().is_none(), "a third is shed");
        drop(first);
        let third = bound.enter().expect("a freed slot is taken again");
        drop((second, third));
        assert_eq!(
            bound.now.load(Ordering::Relaxed),
            0,
            "shed attempts leave no count"
        );
    }
}
