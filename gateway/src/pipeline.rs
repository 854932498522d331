//! The gateway's request path, written out as one function: [`Pipeline`], the
//! application's [`Handler`] for the HTTP/1.1 server ([`crate::http1::server`]).
//!
//! Every request that is not an operator endpoint goes, in this order:
//!
//! 1. **in-flight bound** — past `max_in_flight`, an immediate 503 (`Retry-After: 1`), never a
//!    queue;
//! 2. **request id** — the caller's if short and plain, a new UUID otherwise; forwarded and
//!    echoed on the response, and in the request's log span;
//! 3. **deadline** — the rest must finish within `request_timeout_ms` (504; 408 when it was
//!    the client's body that was late), and a panic in it becomes a JSON 500 instead of a
//!    dropped connection;
//! 4. **who** — the client address (through trusted proxies only) and the bearer token's
//!    verdict, which refuses nothing yet;
//! 5. **rate limit** — charged to the verified user, or to the client address when there is
//!    none (garbage tokens included), against the purchase quota or the default one (429);
//! 6. **route** — 404 for a path no service owns (400 for one with dot segments, which a
//!    backend could read differently), 401 without a valid token, 403 for a non-admin on an
//!    admin route;
//! 7. **forward** to a replica ([`crate::proxy::forward`]), the body read only now.
//!
//! Every response, shed ones included, is counted in `http_requests_total` and timed in
//! `http_request_duration_seconds` under the owning service's name (`unmatched` when none).
//! The operator endpoints (`/healthz`, `/readyz`, `/metrics`) go to the shared axum router,
//! exempt from the in-flight bound and the rate limits: probes and scrapers must get through
//! a flood.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use futures_util::FutureExt;
use tokio::time::Sleep;
use tracing::Instrument;

use seckill_http::layers::{is_usable_request_id, new_request_id_text};
use seckill_http::request_metrics::{self, method_label};

use crate::auth::{self, Authenticator, Caller};
use crate::client_ip::TrustedProxies;
use crate::http1::{BodyState, Handler, HeadError, Incoming, Kind, Response};
use crate::proxy::{self, ProxyState, Route};
use crate::ratelimit::{RateKey, RateLimits, is_purchase};
use crate::{ops, refusal};

/// Everything a request needs on its way through the gateway: the application's
/// [`Handler`] for the HTTP/1.1 server.
pub struct Pipeline {
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

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("in_flight", &self.in_flight)
            .field("request_timeout", &self.request_timeout)
            .finish_non_exhaustive()
    }
}

impl Handler for Pipeline {
    /// Responds to one request; `deadline` is the connection's request timer, set here.
    async fn respond(&self, incoming: &mut Incoming<'_>, deadline: Pin<&mut Sleep>) -> Response {
        let head = incoming.head;
        if ops::is_ops(head.path()) {
            return ops::respond(&self.ops, incoming).await;
        }
        let started = Instant::now();
        let method = method_label(head.method());
        let route = proxy::route(head.path());
        let label = route.map_or("unmatched", |r| r.service.name());
        let Some(slot) = self.in_flight.enter() else {
            metrics::counter!("gateway_shed_total").increment(1);
            let response = refusal::unavailable("overloaded, retry shortly");
            record(label, method, response.status, started);
            return response;
        };
        let generated;
        let request_id = match head.value(Kind::RequestId) {
            Some(id) if is_usable_request_id(id) => id,
            _ => {
                generated = new_request_id_text();
                &generated
            }
        };
        let span = tracing::info_span!(
            "http",
            method = %head.method(),
            path = %head.path(),
            request_id = std::str::from_utf8(request_id).unwrap_or("-"),
            user_id = tracing::field::Empty,
            trace_id = tracing::field::Empty,
        );
        let mut deadline = deadline;
        deadline
            .as_mut()
            .reset((started + self.request_timeout).into());
        let admitted = AssertUnwindSafe(self.admit(incoming, route, request_id))
            .catch_unwind()
            .instrument(span);
        let outcome = tokio::select! {
            biased;
            outcome = admitted => Some(outcome),
            () = deadline => None,
        };
        let mut response = match outcome {
            Some(Ok(response)) => response,
            Some(Err(_panic)) => {
                tracing::error!("request handler panicked");
                refusal::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
            None if incoming.body_state() == BodyState::Reading => refusal::error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body came too slowly",
            ),
            None => {
                metrics::counter!("gateway_timeouts_total").increment(1);
                refusal::error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the request took too long",
                )
            }
        };
        drop(slot);
        response.push_header(b"x-request-id", request_id);
        record(label, method, response.status, started);
        response
    }

    /// The response to a head refused before a request was made of it (the connection
    /// closes).
    fn refuse_head(&self, refused: HeadError, peer: SocketAddr) -> Response {
        let code = match refused.status {
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "headers_too_large",
            StatusCode::NOT_IMPLEMENTED => "not_implemented",
            StatusCode::EXPECTATION_FAILED => "expectation_failed",
            _ => "invalid_request",
        };
        tracing::debug!(%peer, status = %refused.status, reason = refused.message, "request head refused");
        let response = refusal::error(refused.status, code, refused.message);
        record("unmatched", "other", response.status, Instant::now());
        response
    }
}

impl Pipeline {
    /// Steps 4 to 7: who, rate limit, route, forward.
    async fn admit(
        &self,
        incoming: &mut Incoming<'_>,
        route: Option<Route>,
        request_id: &[u8],
    ) -> Response {
        let head = incoming.head;
        let client = self
            .trusted_proxies
            .client_ip(incoming.peer.ip(), head.values(Kind::ForwardedFor));
        let client = self.rate_limits.client_key(client);
        let authorization = head.value(Kind::Authorization);
        // A token this worker verified before costs nothing; any other token is charged to
        // its client's pre-limit first, so a garbage-token flood pays for few signature checks.
        let caller = match self.auth.known(authorization) {
            Some(caller) => Ok(caller),
            None => {
                if authorization.is_some()
                    && let Some(refusal) = self.rate_limits.check_unverified(&client).refusal()
                {
                    return refusal;
                }
                self.auth.authenticate(authorization)
            }
        };
        let key = match &caller {
            Ok(caller) => RateKey::User(caller.user_id),
            Err(_) => client,
        };
        let purchase = is_purchase(head.method(), head.path());
        let verdict = self.rate_limits.check(purchase, key).await;
        if let Some(refusal) = verdict.refusal() {
            return refusal;
        }
        let mut response = self.route(incoming, route, caller, request_id).await;
        verdict.annotate(&mut response);
        response
    }

    async fn route(
        &self,
        incoming: &mut Incoming<'_>,
        route: Option<Route>,
        caller: Result<Arc<Caller>, &'static str>,
        request_id: &[u8],
    ) -> Response {
        if proxy::has_dot_segment(incoming.head.path()) {
            return refusal::error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "paths with . or .. segments are refused",
            );
        }
        let Some(route) = route else {
            return refusal::error(StatusCode::NOT_FOUND, "not_found", "no such route");
        };
        let caller = match caller {
            Ok(caller) => caller,
            Err(reason) => return auth::unauthorized(reason),
        };
        tracing::Span::current().record("user_id", caller.user_id);
        if route.admin_only && !caller.is_admin() {
            return auth::forbidden();
        }
        proxy::forward(&self.proxy, route.service, &caller, incoming, request_id).await
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

/// Counts and times one response.
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
