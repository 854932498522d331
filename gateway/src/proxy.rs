//! The reverse proxy: which service owns a path, which replica gets the request, and the
//! forwarding itself.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{HOST, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;

use seckill_auth::{IdentitySigner, JwtVerifier};
use seckill_http::error_response;
use seckill_http::layers::RouteLabel;

use crate::auth;

/// The pooled keep-alive HTTP/1 client used for every upstream.
pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// The replicas of one service, picked round-robin.
#[derive(Debug)]
pub struct Upstreams {
    name: &'static str,
    bases: Vec<String>,
    next: AtomicUsize,
}

impl Upstreams {
    /// Replicas of service `name` at `bases` (e.g. `http://127.0.0.1:8081`).
    pub fn new(name: &'static str, bases: Vec<String>) -> Self {
        let bases = bases
            .into_iter()
            .map(|b| b.trim_end_matches('/').to_string())
            .collect();
        Self {
            name,
            bases,
            next: AtomicUsize::new(0),
        }
    }

    /// The replicas in the order this request should try them.
    fn rotation(&self) -> impl Iterator<Item = &str> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.bases.len();
        (0..n).map(move |i| self.bases[(start + i) % n].as_str())
    }

    /// The first replica (readiness probes).
    pub fn first(&self) -> &str {
        &self.bases[0]
    }
}

/// What the proxy handler needs.
#[derive(Clone, Debug)]
pub struct ProxyState {
    /// Verifies user tokens.
    pub verifier: JwtVerifier,
    /// Signs the identity headers for backends.
    pub signer: IdentitySigner,
    /// seckill-api replicas.
    pub seckill_api: Arc<Upstreams>,
    /// order-service replicas.
    pub order_service: Arc<Upstreams>,
    /// The shared client.
    pub client: UpstreamClient,
    /// Largest accepted body.
    pub max_body_bytes: usize,
}

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-authenticate"),
    HeaderName::from_static("proxy-authorization"),
    HeaderName::from_static("te"),
    HeaderName::from_static("trailer"),
    HeaderName::from_static("upgrade"),
];
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// Which service owns `path`, and whether it needs the admin role.
fn owner<'a>(state: &'a ProxyState, path: &str) -> Option<(&'a Upstreams, bool)> {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if under("/api/seckill") || under("/api/products") {
        Some((&state.seckill_api, false))
    } else if under("/admin/products") {
        Some((&state.seckill_api, true))
    } else if under("/api/orders") {
        Some((&state.order_service, false))
    } else {
        None
    }
}

/// Authenticates, re-signs identity, and forwards to a replica of the owning service.
pub async fn forward(
    State(state): State<ProxyState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
) -> Response {
    let Some((upstreams, admin_only)) = owner(&state, request.uri().path()) else {
        return error_response(StatusCode::NOT_FOUND, "not_found", "no such route");
    };
    let mut response = forward_to(&state, upstreams, admin_only, peer, request).await;
    response.extensions_mut().insert(RouteLabel(upstreams.name));
    response
}

async fn forward_to(
    state: &ProxyState,
    upstreams: &Upstreams,
    admin_only: bool,
    peer: SocketAddr,
    request: Request,
) -> Response {
    let caller = match auth::authenticate(&state.verifier, request.headers()) {
        Ok(caller) => caller,
        Err(reason) => return auth::unauthorized(reason),
    };
    if admin_only && !caller.roles.iter().any(|r| r == "admin") {
        return auth::forbidden();
    }
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
    prepare_headers(&mut headers, peer);
    // sign_into first removes every identity header the client may have sent.
    state
        .signer
        .sign_into(&mut headers, caller.user_id, &caller.roles);

    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    for base in upstreams.rotation() {
        let Ok(uri) = format!("{base}{path_and_query}").parse::<Uri>() else {
            return error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "bad request URI",
            );
        };
        let mut upstream_request = hyper::Request::new(Full::new(body.clone()));
        *upstream_request.method_mut() = parts.method.clone();
        *upstream_request.uri_mut() = uri;
        *upstream_request.headers_mut() = headers.clone();
        match state.client.request(upstream_request).await {
            Ok(upstream_response) => {
                let (mut parts, body) = upstream_response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                return Response::from_parts(parts, Body::new(body));
            }
            // Nothing reached the upstream: safe to try the next replica, even for a purchase.
            Err(e) if e.is_connect() => {
                tracing::warn!(upstream = base, error = %e, "upstream refused connection");
                metrics::counter!("gateway_upstream_errors_total", "upstream" => upstreams.name,
                    "kind" => "connect")
                .increment(1);
            }
            // The request may have reached the upstream: never retry (a purchase must not be
            // sent twice by us).
            Err(e) => {
                tracing::warn!(upstream = base, error = %e, "upstream request failed");
                metrics::counter!("gateway_upstream_errors_total", "upstream" => upstreams.name,
                    "kind" => "request")
                .increment(1);
                return error_response(
                    StatusCode::BAD_GATEWAY,
                    "bad_gateway",
                    "the upstream service failed",
                );
            }
        }
    }
    let mut response = error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        "no upstream available, retry shortly",
    );
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Drops hop-by-hop headers, the client's Host and token (backends trust only the signed
/// identity), and records the client address.
fn prepare_headers(headers: &mut HeaderMap, peer: SocketAddr) {
    strip_hop_by_hop(headers);
    headers.remove(HOST);
    headers.remove(axum::http::header::AUTHORIZATION);
    let forwarded_for = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(previous) => format!("{previous}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(value) = HeaderValue::from_str(&forwarded_for) {
        headers.insert(X_FORWARDED_FOR, value);
    }
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
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
        let mut response = error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "overloaded, retry shortly",
        );
        response
            .headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        response
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
