//! The reverse proxy: which service owns a path, which replica gets the request, and the
//! forwarding itself.
//!
//! Layout: [`upstream`] — replicas (one per address a host name resolves to, re-resolved
//! by [`resolve`]), round-robin, passive ejection; [`pool`] — each
//! replica's keep-alive connections, checked out by the request that holds one (the
//! exchange itself is [`seckill_http1::client`]'s); [`headers`] —
//! what the gateway adds to and removes from forwarded headers (`X-Forwarded-*`,
//! `traceparent`, the signed identity).

pub mod headers;
pub mod pool;
pub mod resolve;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;

use seckill_auth::IdentitySigner;
use seckill_http1::{BodyError, ExchangeError, Incoming, Outgoing, Response};

use crate::auth::Caller;
use crate::client_ip::TrustedProxies;
use crate::error;
use headers::Forward;
pub use headers::TraceContext;

pub use pool::PoolSettings;
pub use upstream::Upstreams;

/// What the proxy handler needs.
#[derive(Clone, Debug)]
pub struct ProxyState {
    /// Signs the identity headers for seckill-api, with its key.
    pub seckill_api_signer: IdentitySigner,
    /// Signs the identity headers for order-service, with its key.
    pub order_service_signer: IdentitySigner,
    /// seckill-api replicas.
    pub seckill_api: Arc<Upstreams>,
    /// order-service replicas.
    pub order_service: Arc<Upstreams>,
    /// Deadline for one replica's whole response; the request may have reached it, so a
    /// timeout is answered 504, never retried elsewhere.
    pub upstream_timeout: Duration,
    /// Whose `X-Forwarded-Proto` is believed.
    pub trusted_proxies: Arc<TrustedProxies>,
}

impl ProxyState {
    /// The signer of identity credentials for `service`.
    pub fn signer(&self, service: Service) -> &IdentitySigner {
        match service {
            Service::SeckillApi => &self.seckill_api_signer,
            Service::OrderService => &self.order_service_signer,
        }
    }

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

/// Whether `path` has a `.` or `..` segment, plain or percent-encoded: the gateway routes
/// on the path as it came, and a backend that resolved such segments could see another
/// route than the one that was authorised.
pub fn has_dot_segment(path: &str) -> bool {
    // Nearly every path has neither a dot nor an escape: no segment of it can be one.
    if !path.bytes().any(|b| b == b'.' || b == b'%') {
        return false;
    }
    let is_dot = |s: &str| s == "." || s.eq_ignore_ascii_case("%2e");
    path.split('/').any(|segment| {
        is_dot(segment)
            || (1..=3)
                .filter(|&at| segment.is_char_boundary(at))
                .any(|at| is_dot(&segment[..at]) && is_dot(&segment[at..]))
    })
}

/// Forwards an admitted request of `caller` to a replica of `service`, with identity
/// re-signed, to the client's target or to `target` in its place: takes the body whole (413 beyond `max_body_bytes`; usually read already, see
/// `crate::pipeline`), tries the replicas in
/// turn while nothing was sent, and responds with the replica's response or a JSON error.
pub async fn forward(
    state: &ProxyState,
    service: Service,
    caller: &Caller,
    incoming: &mut Incoming<'_>,
    request_id: &[u8],
    trace: &TraceContext,
    target: Option<&str>,
) -> Response {
    let body = match incoming.body().await {
        Ok(body) => body,
        Err(e) => return refuse_body(e),
    };
    let head = incoming.head;
    let forward = Forward {
        head,
        target: target.unwrap_or(head.target()),
        body: &body,
        peer: incoming.peer,
        trusted: &state.trusted_proxies,
        request_id,
        trace,
        caller,
        signer: state.signer(service),
    };
    let upstreams = state.upstreams(service);
    let mut rotation = upstreams.rotation();
    while let Some(replica) = rotation.next_replica() {
        let base = replica.base();
        let pool = replica.pool();
        let wire = forward.encode(pool.host().as_bytes());
        let exchange = pool.exchange(Outgoing::new(&wire));
        let mut timer = incoming.upstream_timer();
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + state.upstream_timeout);
        let outcome = tokio::select! {
            biased;
            outcome = exchange => Ok(outcome),
            () = timer => Err(()),
        };
        let (status, code, message) = match outcome {
            Ok(Ok(response)) => return response,
            // Nothing reached the replica (or, for a safe request, nothing was answered):
            // safe to try the next one, even for a purchase.
            Ok(Err(ExchangeError::Connect(reason))) => {
                tracing::warn!(upstream = base, error = %reason, "upstream refused connection");
                upstream_error(upstreams, "connect");
                upstreams.eject(replica);
                upstreams.resolve_soon();
                continue;
            }
            Ok(Err(ExchangeError::TooLarge(limit))) => {
                tracing::warn!(upstream = base, limit, "upstream answer too large");
                upstream_error(upstreams, "too_large");
                (
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream answer was too large",
                )
            }
            // The request may have reached the replica: never retry (a purchase must not
            // be sent twice by us).
            Ok(Err(ExchangeError::Failed(e))) => {
                tracing::warn!(upstream = base, error = %e, "upstream request failed");
                upstream_error(upstreams, "request");
                (
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream service failed",
                )
            }
            Err(_) => {
                tracing::warn!(upstream = base, "upstream did not answer in time");
                upstream_error(upstreams, "timeout");
                (
                    StatusCode::GATEWAY_TIMEOUT,
                    "gateway_timeout",
                    "the upstream service took too long",
                )
            }
        };
        return error::response(status, code, message);
    }
    error::unavailable("no upstream available, retry shortly")
}

/// The response to a request whose body could not be had: 413 when too large, 400
/// otherwise.
pub fn refuse_body(error: BodyError) -> Response {
    match error {
        BodyError::TooLarge(limit) => {
            let message = format!("request bodies are limited to {limit} bytes");
            error::response(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", &message)
        }
        e => {
            tracing::debug!(error = ?e, "client body unreadable");
            let message = "the request body could not be read";
            error::response(StatusCode::BAD_REQUEST, "invalid_request", message)
        }
    }
}

fn upstream_error(upstreams: &Upstreams, kind: &'static str) {
    metrics::counter!(crate::metrics::UPSTREAM_ERRORS, "upstream" => upstreams.name(),
        "kind" => kind)
    .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_belong_to_their_service_and_admin_paths_need_the_role() {
        let owner = |path| route(path).map(|r| (r.service, r.admin_only));
        assert_eq!(owner("/api/seckill/7"), Some((Service::SeckillApi, false)));
        assert_eq!(owner("/admin/products"), Some((Service::SeckillApi, true)));
        assert_eq!(owner("/api/orders/3"), Some((Service::OrderService, false)));
        assert_eq!(
            owner("/admin/dlq/redrive"),
            Some((Service::OrderService, true))
        );
        for unowned in ["/", "/api/seckillx", "/admin", "*", "/api/products-all"] {
            assert_eq!(owner(unowned), None, "{unowned}");
        }
    }

    #[test]
    fn dot_segments_plain_or_encoded_are_found() {
        for dotted in [
            "/api/products/../../admin/products",
            "/api/products/./1",
            "/api/products/%2e%2E/admin",
            "/api/products/.%2e",
            "/api/products/%2E.",
            "/api/products/%2e",
            "/..",
        ] {
            assert!(has_dot_segment(dotted), "{dotted}");
        }
        for plain in [
            "/api/products/1",
            "/api/products/a.b",
            "/api/products/...",
            "/.well-known",
        ] {
            assert!(!has_dot_segment(plain), "{plain}");
        }
    }
}
