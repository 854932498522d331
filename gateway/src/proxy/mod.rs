//! The reverse proxy: which service owns a path, which replica gets the request, and the
//! forwarding itself.
//!
//! Layout: [`upstream`] — replicas, round-robin, passive ejection; [`pool`] — each
//! replica's keep-alive connections, driven by the request that holds one; [`headers`] —
//! what the gateway adds to and removes from forwarded headers (`X-Forwarded-*`,
//! `traceparent`).

pub mod headers;
pub mod pool;
pub mod upstream;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;

use seckill_auth::IdentitySigner;
use seckill_http::error_response;

use crate::auth::Caller;
use crate::client_ip::TrustedProxies;

pub use pool::{ExchangeError, PoolSettings};
pub use upstream::Upstreams;

/// What the proxy handler needs.
#[derive(Clone, Debug)]
pub struct ProxyState {
    /// Signs the identity headers for backends.
    pub signer: IdentitySigner,
    /// seckill-api replicas.
    pub seckill_api: Arc<Upstreams>,
    /// order-service replicas.
    pub order_service: Arc<Upstreams>,
    /// Deadline for one replica's whole answer; the request may have reached it, so a
    /// timeout is answered 504, never retried elsewhere.
    pub upstream_timeout: Duration,
    /// Largest accepted body.
    pub max_body_bytes: usize,
    /// Whose `X-Forwarded-Proto` is believed.
    pub trusted_proxies: Arc<TrustedProxies>,
}

impl ProxyState {
    /// The replicas of `service`.
    pub fn upstreams(&self, service: Service) -> &Upstreams {
        match service {
            Service::SeckillApi => &self.seckill_api,
            Service::OrderService => &self.order_service,
        }
    }
}

/// A service behind the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// seckill-api: products and purchases.
    SeckillApi,
    /// order-service: orders and dead letters.
    OrderService,
}

impl Service {
    /// The service's name: metric label and log field.
    pub fn name(self) -> &'static str {
        match self {
            Self::SeckillApi => "seckill-api",
            Self::OrderService => "order-service",
        }
    }
}

/// Where a path goes: the owning service, and whether it needs the admin role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The service that owns the path.
    pub service: Service,
    /// Only callers with the `admin` role may pass.
    pub admin_only: bool,
}

/// The route of `path`, if a service owns it.
pub fn route(path: &str) -> Option<Route> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    let (service, admin_only) = if under("/api/seckill") || under("/api/products") {
        (Service::SeckillApi, false)
    } else if under("/admin/products") {
        (Service::SeckillApi, true)
    } else if under("/api/orders") {
        (Service::OrderService, false)
    } else if under("/admin/orders") || under("/admin/dlq") {
        (Service::OrderService, true)
    } else {
        return None;
    };
    Some(Route {
        service,
        admin_only,
    })
}

/// Forwards an admitted request of `caller` to a replica of `service`, with identity
/// re-signed: reads the body whole (413 beyond `max_body_bytes`), tries the replicas in
/// turn while nothing was sent, and answers with the replica's response or a JSON error.
pub async fn forward(
    state: &ProxyState,
    service: Service,
    caller: &Caller,
    peer: SocketAddr,
    request: hyper::Request<Incoming>,
) -> Response {
    let upstreams = state.upstreams(service);
    let (mut parts, body) = request.into_parts();
    let body = match Limited::new(body, state.max_body_bytes).collect().await {
        Ok(body) => body.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "request bodies are limited to {} bytes",
                    state.max_body_bytes
                ),
            );
        }
        Err(e) => {
            tracing::debug!(error = %e, "client body unreadable");
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the request body could not be read",
            );
        }
    };
    let headers = &mut parts.headers;
    let trace_id = headers::prepare(headers, peer, &state.trusted_proxies);
    tracing::Span::current().record("trace_id", trace_id.as_str());
    // sign_into replaces every identity header the client may have sent.
    state
        .signer
        .sign_into(headers, caller.user_id, &caller.roles);
    // Method, target and headers as they are now; the pool writes only the target's path
    // and query, and its own framing.
    let mut request = hyper::Request::from_parts(parts, body);
    for replica in upstreams.rotation() {
        let base = replica.base();
        match tokio::time::timeout(state.upstream_timeout, replica.pool().exchange(request)).await {
            // Its headers are end-to-end ones already (the pool leaves hop-by-hop ones out).
            Ok(Ok(upstream_response)) => return upstream_response.map(Body::from),
            // Nothing reached the replica (or, for a safe request, nothing was answered):
            // safe to try the next one, even for a purchase.
            Ok(Err(ExchangeError::Connect {
                reason,
                request: unsent,
            })) => {
                tracing::warn!(upstream = base, error = %reason, "upstream refused connection");
                upstream_error(upstreams, "connect");
                upstreams.eject(replica);
                request = *unsent;
            }
            Ok(Err(ExchangeError::TooLarge(limit))) => {
                tracing::warn!(upstream = base, limit, "upstream answer too large");
                upstream_error(upstreams, "too_large");
                return error_response(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream answer was too large",
                );
            }
            // The request may have reached the replica: never retry (a purchase must not
            // be sent twice by us).
            Ok(Err(ExchangeError::Failed(e))) => {
                tracing::warn!(upstream = base, error = %e, "upstream request failed");
                upstream_error(upstreams, "request");
                return error_response(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream service failed",
                );
            }
            Err(_) => {
                tracing::warn!(upstream = base, "upstream did not answer in time");
                upstream_error(upstreams, "timeout");
                return error_response(
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the upstream service took too long",
                );
            }
        }
    }
    unavailable("no upstream available, retry shortly")
}

fn upstream_error(upstreams: &Upstreams, kind: &'static str) {
    metrics::counter!("gateway_upstream_errors_total", "upstream" => upstreams.name(),
        "kind" => kind)
    .increment(1);
}

/// A 503 with `Retry-After: 1`.
pub fn unavailable(message: &'static str) -> Response {
    let mut response = error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}
