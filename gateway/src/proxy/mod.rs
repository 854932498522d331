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
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use tracing::Instrument;

use seckill_auth::IdentitySigner;
use seckill_http::error_response;
use seckill_http::layers::RouteLabel;

use crate::auth::{self, AuthFailure, Caller};
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

/// The metric label of the service that owns `path`, if any.
pub fn route_label(path: &str) -> Option<&'static str> {
    route(path).map(|(service, _)| match service {
        Service::SeckillApi => "seckill-api",
        Service::OrderService => "order-service",
    })
}

#[derive(Clone, Copy)]
enum Service {
    SeckillApi,
    OrderService,
}

/// Which service owns `path`, and whether it needs the admin role.
fn route(path: &str) -> Option<(Service, bool)> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if under("/api/seckill") || under("/api/products") {
        Some((Service::SeckillApi, false))
    } else if under("/admin/products") {
        Some((Service::SeckillApi, true))
    } else if under("/api/orders") {
        Some((Service::OrderService, false))
    } else if under("/admin/orders") || under("/admin/dlq") {
        Some((Service::OrderService, true))
    } else {
        None
    }
}

/// Refuses callers without a valid token (401) or the needed role (403), re-signs identity,
/// and forwards to a replica of the owning service.
pub async fn forward(
    State(state): State<ProxyState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let Some((service, admin_only)) = route(request.uri().path()) else {
        return error_response(StatusCode::NOT_FOUND, "not_found", "no such route");
    };
    let upstreams = match service {
        Service::SeckillApi => &state.seckill_api,
        Service::OrderService => &state.order_service,
    };
    let caller = match request.extensions().get::<Caller>() {
        Some(caller) => caller.clone(),
        None => {
            let reason = request
                .extensions()
                .get::<AuthFailure>()
                .map_or("missing_token", |f| f.0);
            return labelled(auth::unauthorized(reason), upstreams);
        }
    };
    if admin_only && !caller.is_admin() {
        return labelled(auth::forbidden(), upstreams);
    }
    let response = forward_to(&state, upstreams, &caller, peer, request).await;
    labelled(response, upstreams)
}

fn labelled(mut response: Response, upstreams: &Upstreams) -> Response {
    response
        .extensions_mut()
        .insert(RouteLabel(upstreams.name()));
    response
}

async fn forward_to(
    state: &ProxyState,
    upstreams: &Upstreams,
    caller: &Caller,
    peer: SocketAddr,
    request: Request,
) -> Response {
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, state.max_body_bytes).await {
        Ok(body) => body,
        Err(_) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "request bodies are limited to {} bytes",
                    state.max_body_bytes
                ),
            );
        }
    };
    let mut headers = parts.headers;
    let trace_id = headers::prepare(&mut headers, peer, &state.trusted_proxies);
    // sign_into first removes every identity header the client may have sent.
    state
        .signer
        .sign_into(&mut headers, caller.user_id, &caller.roles);

    let mut request = hyper::Request::new(Full::new(body));
    *request.method_mut() = parts.method;
    *request.uri_mut() = parts
        .uri
        .path_and_query()
        .cloned()
        .map_or_else(|| Uri::from_static("/"), Uri::from);
    *request.headers_mut() = headers;
    let span = tracing::info_span!("proxy", trace_id = %trace_id, user_id = caller.user_id);
    async move {
        for replica in upstreams.rotation() {
            let base = replica.base();
            match tokio::time::timeout(state.upstream_timeout, replica.pool().exchange(request))
                .await
            {
                Ok(Ok(upstream_response)) => {
                    let (mut parts, body) = upstream_response.into_parts();
                    headers::strip_hop_by_hop(&mut parts.headers);
                    return Response::from_parts(parts, Body::from(body));
                }
                // Nothing reached the replica: safe to try the next one, even for a purchase.
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
    .instrument(span)
    .await
}

fn upstream_error(upstreams: &Upstreams, kind: &'static str) {
    metrics::counter!("gateway_upstream_errors_total", "upstream" => upstreams.name(),
        "kind" => kind)
    .increment(1);
}

fn unavailable(message: &'static str) -> Response {
    let mut response = error_response(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// Maps the overload layers' errors to the JSON contract: shed → 503, deadline → 504.
pub async fn handle_overload(error: tower::BoxError) -> Response {
    if error.is::<tower::timeout::error::Elapsed>() {
        metrics::counter!("gateway_timeouts_total").increment(1);
        error_response(
            StatusCode::GATEWAY_TIMEOUT,
            "gateway_timeout",
            "the request took too long",
        )
    } else if error.is::<tower::load_shed::error::Overloaded>() {
        metrics::counter!("gateway_shed_total").increment(1);
        unavailable("overloaded, retry shortly")
    } else {
        tracing::error!(%error, "unexpected middleware error");
        error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error",
        )
        .into_response()
    }
}
