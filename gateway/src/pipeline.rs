//! The gateway's request path, written out as one function: [`Pipeline`], the
//! application's [`Handler`] for the HTTP/1.1 server ([`seckill_http1::server`]).
//!
//! Every request that is not an operator endpoint goes, in this order:
//!
//! 1. **request id** — the caller's if short and plain, a new UUID otherwise; forwarded and
//!    echoed on the response, and in the request's log span;
//! 2. **deadline** — the rest must finish within `request_timeout_ms` (504; 408 when it was
//!    the client's body that was late), and a panic in it becomes a JSON 500 instead of a
//!    dropped connection;
//! 3. **who** — the client address (through trusted proxies only) and the bearer token's
//!    verdict, which refuses nothing yet;
//! 4. **rate limit** — charged to the verified user, or to the client address when there is
//!    none (garbage tokens included), against the purchase quota or the default one (429);
//! 5. **route** — 404 for a path no service owns (400 for one with dot segments, which a
//!    backend could read differently), 401 without a valid token, 403 for a non-admin on an
//!    admin route; the gateway's own routes are answered here: the waiting rooms'
//!    ([`crate::room`], a token needed; a join's body, its optional proof-of-work, read
//!    under step 6's limits) and the buyer's page ([`crate::sale_page`], none);
//! 6. **body** — read whole, under the deadline (413, 400, 408), only now: a refused
//!    request's body is never waited for;
//! 7. **sold out** — a purchase of a product a replica just answered `410 sold_out` for is
//!    answered the same here, until units of it go back on sale ([`crate::sold_out`]);
//! 8. **bounds** — only once the body is in, so that clients trickling bodies hold no
//!    place: past `max_purchases_per_user` purchases of this user under way, 429; past
//!    `max_in_flight` requests, an immediate 503 (`Retry-After: 1`); never a queue
//!    ([`crate::in_flight`]);
//! 9. **forward** to a replica ([`crate::proxy::forward`]); a purchase's `410` teaches step 7.
//!
//! Every response, shed ones included, is counted in `http_requests_total` and timed in
//! `http_request_duration_seconds` under the owning service's name (`unmatched` when none).
//! The public `/healthz` goes to [`ops::public_router`], exempt from the bounds and the rate
//! limits: probes must get through a flood. It takes no body: one announced (a length or
//! chunked) is refused with 413 and the connection closed, unread, so such a request cannot
//! hold a connection open. `/metrics` and `/readyz` are served on the operator listener only
//! (see [`crate::ops`]); here they are unknown paths.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use futures_util::FutureExt;
use futures_util::future::Either;
use tokio::time::Sleep;
use tracing::Instrument;

use seckill_http::layers::{is_usable_request_id, new_request_id_text};
use seckill_http::request_metrics::{self, method_label};
use seckill_http1::{BodyState, Framing, Handler, HeadError, Incoming, Kind, Response, Wait};
use seckill_telemetry::{RequestScope, TraceParent};

use crate::auth::{self, Authenticator, Caller};
use crate::client_ip::TrustedProxies;
use crate::in_flight::{InFlight, Purchases};
use crate::proxy::{self, ProxyState, Route};
use crate::ratelimit::{RateKey, RateLimits, is_purchase};
use crate::room::{self, Admission, PurchasePath, Rooms};
use crate::sold_out::SoldOutEdge;
use crate::{error, ops, sale_page};

/// Everything a request needs on its way through the gateway: the application's
/// [`Handler`] for the HTTP/1.1 server.
pub struct Pipeline {
    /// The public `/healthz`.
    pub ops: Router,
    /// Verifies bearer tokens.
    pub auth: Authenticator,
    /// Whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Arc<TrustedProxies>,
    /// The two quotas.
    pub rate_limits: RateLimits,
    /// Upstreams and forwarding settings.
    pub proxy: ProxyState,
    /// Requests being forwarded (their bodies in).
    pub in_flight: InFlight,
    /// Purchases under way per user.
    pub purchases: Purchases,
    /// Deadline for a whole request (504 beyond).
    pub request_timeout: Duration,
    /// Products whose purchases are answered `410` here.
    pub sold_out: Arc<SoldOutEdge>,
    /// The waiting rooms: their own routes, and the passes of their purchases.
    pub rooms: Arc<Rooms>,
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
            if head.framing() != Framing::None {
                // Refused unread: no read of it can hold the connection.
                incoming.refuse_body();
                return error::response(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "operator endpoints take no request body",
                );
            }
            return ops::respond(&self.ops, incoming).await;
        }
        let started = Instant::now();
        let method = method_label(head.method());
        let route = proxy::route(head.path());
        let label = match route {
            Some(route) => route.service.name(),
            None if room::is_room_path(head.path()) => "waiting-room",
            None if sale_page::is_page_path(head.path()) => "sale-page",
            None => "unmatched",
        };
        let generated;
        let request_id = match head.value(Kind::RequestId) {
            Some(id) if is_usable_request_id(id) => id,
            _ => {
                generated = new_request_id_text();
                &generated
            }
        };
        // Traced by a span only when it is exported; else its log lines take their fields
        // from a request scope, which costs next to nothing (crates/telemetry's
        // request_scope).
        let received = head.value(Kind::Traceparent).and_then(TraceParent::parse);
        let planned = seckill_telemetry::plan(received.as_ref());
        let request_id_text = std::str::from_utf8(request_id).unwrap_or("-");
        // Plain strings, not `%` values: the JSON log layer copies a string as it is, where a
        // `Display` value goes through the formatting machinery (crates/telemetry's
        // json_fields).
        let span = planned.exported.then(|| {
            tracing::info_span!(
                "http",
                method = head.method().as_str(),
                path = head.path(),
                request_id = request_id_text,
                user_id = tracing::field::Empty,
                trace_id = tracing::field::Empty,
                service = "gateway",
            )
        });
        // Before the span is entered: its parent is the client's span.
        let trace = proxy::TraceContext::start(head, received.as_ref(), &planned, span.as_ref());
        let mut deadline = deadline;
        deadline
            .as_mut()
            .reset((started + self.request_timeout).into());
        let admitted =
            AssertUnwindSafe(self.admit(incoming, route, request_id, &trace)).catch_unwind();
        let admitted = match span {
            Some(span) => Either::Left(admitted.instrument(span)),
            None if tracing::span_enabled!(tracing::Level::INFO) => Either::Right(Either::Left(
                RequestScope::new("http")
                    .with_str("method", head.method().as_str())
                    .with_str("path", head.path())
                    .with_str("request_id", request_id_text)
                    .with_str("service", "gateway")
                    .with_trace(planned.onwards)
                    .run(admitted),
            )),
            // Logs below `info`: the span would have been off too.
            None => Either::Right(Either::Right(admitted)),
        };
        let outcome = tokio::select! {
            biased;
            outcome = admitted => Some(outcome),
            () = deadline => None,
        };
        let mut response = match outcome {
            Some(Ok(response)) => response,
            Some(Err(_panic)) => {
                tracing::error!("request handler panicked");
                error::response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
            None if incoming.body_state() == BodyState::Reading => error::response(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the request body came too slowly",
            ),
            None => {
                metrics::counter!(crate::metrics::TIMEOUTS).increment(1);
                error::response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the request took too long",
                )
            }
        };
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
        let response = error::response(refused.status, code, refused.message);
        record("unmatched", "other", response.status, Instant::now());
        response
    }

    /// Counts a connection closed because its client kept the gateway waiting.
    fn timed_out(&self, wait: Wait) {
        metrics::counter!(crate::metrics::CONNECTIONS_CLOSED, "reason" => wait.label())
            .increment(1);
    }
}

impl Pipeline {
    /// Steps 3 to 9: who, rate limit, route, body, sold out, bounds, forward.
    async fn admit(
        &self,
        incoming: &mut Incoming<'_>,
        route: Option<Route>,
        request_id: &[u8],
        trace: &proxy::TraceContext,
    ) -> Response {
        let head = incoming.head;
        let client = self
            .trusted_proxies
            .client_ip(incoming.peer.ip(), head.values(Kind::ForwardedFor));
        let client = self.rate_limits.client_key(client);
        let authorization = head.value(Kind::Authorization);
        let bearer = self.auth.bearer(authorization);
        // A token this worker verified before costs nothing; any other token is charged to
        // its client's pre-limit first, so a garbage-token flood pays for few signature checks.
        let caller = match self.auth.known(bearer.as_ref()) {
            Some(caller) => Ok(caller),
            None => {
                if authorization.is_some()
                    && let Some(refusal) = self.rate_limits.check_unverified(&client).refusal()
                {
                    return refusal;
                }
                self.auth.check(bearer)
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
        let mut response = self.route(incoming, route, caller, request_id, trace).await;
        verdict.annotate(&mut response);
        response
    }

    async fn route(
        &self,
        incoming: &mut Incoming<'_>,
        route: Option<Route>,
        caller: Result<Arc<Caller>, &'static str>,
        request_id: &[u8],
        trace: &proxy::TraceContext,
    ) -> Response {
        if proxy::has_dot_segment(incoming.head.path()) {
            return error::response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "paths with . or .. segments are refused",
            );
        }
        let Some(route) = route else {
            let head = incoming.head;
            if sale_page::is_page_path(head.path()) {
                // The buyer's page: no token needed, no body read.
                return sale_page::respond(head.method(), head.path());
            }
            return match room::room_request(head.method(), head.path()) {
                Some(request) => match caller {
                    Ok(caller) => {
                        seckill_telemetry::request_scope::record_i64("user_id", caller.user_id);
                        // A join's body may carry its proof-of-work: read under the usual
                        // limits; the other room routes take none.
                        let body = if matches!(request, room::RoomRequest::Join { .. }) {
                            match incoming.body().await {
                                Ok(body) => body,
                                Err(e) => return proxy::refuse_body(e),
                            }
                        } else {
                            bytes::Bytes::new()
                        };
                        self.rooms.respond(request, caller.user_id, &body).await
                    }
                    Err(reason) => auth::unauthorized(reason),
                },
                None => error::response(StatusCode::NOT_FOUND, "not_found", "no such route"),
            };
        };
        let caller = match caller {
            Ok(caller) => caller,
            Err(reason) => return auth::unauthorized(reason),
        };
        seckill_telemetry::request_scope::record_i64("user_id", caller.user_id);
        if route.admin_only && !caller.is_admin() {
            return auth::forbidden();
        }
        // Read (and kept by `incoming` for the forward) before any bound is entered.
        if let Err(e) = incoming.body().await {
            return proxy::refuse_body(e);
        }
        let purchase_path = PurchasePath::parse(incoming.head.method(), incoming.head.path());
        let purchase = purchase_path.is_some();
        // The purchase's target: its room's pass checked, the client's query dropped (the
        // gateway's own `admitted` goes under the identity signature).
        let query = incoming.head.target().len() != incoming.head.path().len();
        let (target, admitted) = match purchase_path {
            Some(path) => match self.rooms.purchase(path, caller.user_id, query).await {
                Admission::Refused(response) => return response,
                Admission::Forward { target, admitted } => (target, admitted),
            },
            None => (None, None),
        };
        // A purchase with an Idempotency-Key may be the replay of one that bought: only the
        // replica knows its first answer.
        let product = purchase_path
            .and_then(|p| p.id)
            .filter(|_| !has_idempotency_key(incoming.head));
        if let Some(answer) = product.and_then(|id| self.sold_out.answer(id)) {
            return answer;
        }
        let epoch = self.sold_out.epoch();
        let _purchase = if purchase {
            match self.purchases.enter(caller.user_id) {
                Some(purchase) => Some(purchase),
                None => {
                    metrics::counter!(crate::metrics::PURCHASES_REFUSED).increment(1);
                    return error::response(
                        StatusCode::TOO_MANY_REQUESTS,
                        "too_many_purchases",
                        "too many purchases under way for this user",
                    );
                }
            }
        } else {
            None
        };
        let Some(_slot) = self.in_flight.enter() else {
            metrics::counter!(crate::metrics::SHED).increment(1);
            return error::unavailable("overloaded, retry shortly");
        };
        let response = proxy::forward(
            &self.proxy,
            route.service,
            &caller,
            incoming,
            request_id,
            trace,
            target.as_deref(),
        )
        .await;
        if let Some(id) = product {
            self.sold_out.learn(id, &response, epoch);
            if response.status == StatusCode::PRECONDITION_REQUIRED {
                // Its room is on, and this gateway did not know.
                self.rooms.learn(id);
            }
        }
        if let Some((product_id, rank)) = admitted {
            // Not awaited: the answer does not wait on Redis (the records are idempotent).
            let rooms = self.rooms.clone();
            if response.status == StatusCode::ACCEPTED {
                let user_id = caller.user_id;
                tokio::spawn(async move { rooms.bought(product_id, rank, user_id).await });
            } else if crate::room::is_pushback(response.status) {
                tokio::spawn(async move { rooms.pushed_back(product_id).await });
            }
        }
        response
    }
}

/// Whether the request carries an `Idempotency-Key` header.
fn has_idempotency_key(head: &seckill_http1::RequestHead) -> bool {
    head.fields()
        .any(|(name, _, _)| name.eq_ignore_ascii_case(b"idempotency-key"))
}

/// Counts and times one response.
fn record(route: &'static str, method: &'static str, status: StatusCode, started: Instant) {
    request_metrics::record("gateway", route, method, status, started.elapsed());
}
