//! The gateway's request path, written out as one function.
//!
//! Every request that is not an operator endpoint goes, in this order:
//!
//! 1. **in-flight bound** — past `max_in_flight`, an immediate 503 (`Retry-After: 1`), never a
//!    queue;
//! 2. **request id** — the caller's if short and plain, a new UUID otherwise; forwarded and
//!    echoed on the answer, and in the request's log span;
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
//! Every answer, shed ones included, is counted in `http_requests_total` and timed in
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
use axum::body::Body;
use axum::http::StatusCode;
use futures_util::FutureExt;
use tokio::time::Sleep;
use tower::ServiceExt;
use tracing::Instrument;

use seckill_http::layers::{is_usable_request_id, new_request_id_text};
use seckill_http::request_metrics::{self, method_label};

use crate::auth::{self, Authenticator, Caller};
use crate::client_ip::TrustedProxies;
use crate::http1::{Answer, BodyState, HeadError, Incoming, Kind};
use crate::proxy::{self, ProxyState, Route};
use crate::ratelimit::{RateKey, RateLimits, is_purchase};

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
    /// Answers one request; `deadline` is the connection's request timer, set here.
    pub async fn answer(&self, incoming: &mut Incoming<'_>, deadline: Pin<&mut Sleep>) -> Answer {
        let head = incoming.head;
        if is_ops(head.path()) {
            return self.ops(incoming).await;
        }
        let started = Instant::now();
        let method = method_label(head.method());
        let route = proxy::route(head.path());
        let label = route.map_or("unmatched", |r| r.service.name());
        let Some(slot) = self.in_flight.enter() else {
            metrics::counter!("gateway_shed_total").increment(1);
            let answer = proxy::unavailable("overloaded, retry shortly").await;
            record(label, method, answer.status, started);
            return answer;
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
        let mut answer = match outcome {
            Some(Ok(answer)) => answer,
            Some(Err(_panic)) => {
                tracing::error!("request handler panicked");
                Answer::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
                .await
            }
            None if incoming.body_state() == BodyState::Reading => {
                Answer::error(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    "the request body came too slowly",
                )
                .await
            }
            None => {
                metrics::counter!("gateway_timeouts_total").increment(1);
                Answer::error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the request took too long",
                )
                .await
            }
        };
        drop(slot);
        answer.push_header(b"x-request-id", request_id);
        record(label, method, answer.status, started);
        answer
    }

    /// Steps 4 to 7: who, rate limit, route, forward.
    async fn admit(
        &self,
        incoming: &mut Incoming<'_>,
        route: Option<Route>,
        request_id: &[u8],
    ) -> Answer {
        let head = incoming.head;
        let client = self
            .trusted_proxies
            .client_ip(incoming.peer.ip(), head.values(Kind::ForwardedFor));
        let caller = self.auth.authenticate(head.value(Kind::Authorization));
        let key = match &caller {
            Ok(caller) => RateKey::User(caller.user_id),
            Err(_) => RateKey::Client(client),
        };
        let purchase = is_purchase(head.method(), head.path());
        let verdict = self.rate_limits.check(purchase, key).await;
        if let Some(refusal) = verdict.refusal().await {
            return refusal;
        }
        let mut answer = self.route(incoming, route, caller, request_id).await;
        verdict.annotate(&mut answer);
        answer
    }

    async fn route(
        &self,
        incoming: &mut Incoming<'_>,
        route: Option<Route>,
        caller: Result<Arc<Caller>, &'static str>,
        request_id: &[u8],
    ) -> Answer {
        if proxy::has_dot_segment(incoming.head.path()) {
            return Answer::error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "paths with . or .. segments are refused",
            )
            .await;
        }
        let Some(route) = route else {
            return Answer::error(StatusCode::NOT_FOUND, "not_found", "no such route").await;
        };
        let caller = match caller {
            Ok(caller) => caller,
            Err(reason) => return auth::unauthorized(reason).await,
        };
        tracing::Span::current().record("user_id", caller.user_id);
        if route.admin_only && !caller.is_admin() {
            return auth::forbidden().await;
        }
        proxy::forward(&self.proxy, route.service, &caller, incoming, request_id).await
    }

    /// An operator endpoint, through the ops router.
    async fn ops(&self, incoming: &mut Incoming<'_>) -> Answer {
        let head = incoming.head;
        let mut request = axum::http::Request::builder()
            .method(head.method().clone())
            .uri(head.target());
        for (name, value, _) in head.fields() {
            request = request.header(name, value);
        }
        let body = match incoming.body().await {
            Ok(body) => body,
            Err(_) => {
                return Answer::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "unreadable body",
                )
                .await;
            }
        };
        let request = request
            .extension(axum::extract::ConnectInfo(incoming.peer))
            .body(Body::from(body));
        match request {
            Ok(request) => match self.ops.clone().oneshot(request).await {
                Ok(response) => Answer::from_response(response).await,
                Err(never) => match never {},
            },
            Err(_) => {
                Answer::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    "malformed request",
                )
                .await
            }
        }
    }

    /// The answer to a head refused before it reached the door (the connection closes).
    pub async fn refuse_head(&self, refused: HeadError, peer: SocketAddr) -> Answer {
        let code = match refused.status {
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "headers_too_large",
            StatusCode::NOT_IMPLEMENTED => "not_implemented",
            StatusCode::EXPECTATION_FAILED => "expectation_failed",
            _ => "invalid_request",
        };
        tracing::debug!(%peer, status = %refused.status, reason = refused.message, "request head refused");
        let answer = Answer::error(refused.status, code, refused.message).await;
        record("unmatched", "other", answer.status, Instant::now());
        answer
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
