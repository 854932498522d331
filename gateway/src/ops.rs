//! The operator endpoints, split by who may reach them.
//!
//! - The public port answers `/healthz` only, with `{"status":"ok"}`: a load balancer learns
//!   the process answers and nothing else. It also serves the API contract,
//!   `/openapi.json` (the committed `docs/openapi.json`, see [`crate::openapi`]). Its request and response are carried across to
//!   and from the gateway's own HTTP/1.1 types here, the one place the request path meets
//!   axum. `/metrics` and `/readyz` there are paths like any unknown one (404).
//! - The operator listener ([`serve_admin`], `admin_host`:`admin_port`, loopback by default)
//!   serves the shared router: `/healthz`, the detailed `/readyz` (which upstream answers)
//!   and `/metrics` (whose `gateway_auth_failures_total{reason}` would tell an attacker why
//!   a forged token failed).

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::routing::get;
use bytes::Bytes;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use seckill_http::ErrorBody;
use seckill_http1::{Incoming, Response, with_date};

use crate::error;

/// Largest body of an operator endpoint's response (metrics).
const MAX_LOCAL_BODY: usize = 16 * 1024 * 1024;

/// Whether `path` is one of the public port's own endpoints, served by [`public_router`].
pub fn is_ops(path: &str) -> bool {
    path == "/healthz" || path == "/openapi.json"
}

/// The public port's own router: `/healthz` answering `{"status":"ok"}` and the API
/// contract at `/openapi.json`. Neither needs a token.
pub fn public_router() -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi_json))
}

/// The liveness answer of the public port.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    /// Always `ok`.
    #[schema(pattern = "^ok$", example = "ok")]
    status: &'static str,
}

/// `GET /healthz`: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    operation_id = "healthz",
    tag = "operations",
    summary = "Liveness of the gateway",
    description = "Exempt from the rate limits and the bounds, so probes get through a flood. \
        Readiness and metrics are on the operator listener only.",
    responses(
        (status = 200, description = "The gateway answers.", body = Health),
        (status = 413, description = "`payload_too_large`: a request body was announced (none \
            is taken; the connection is closed).", body = ErrorBody),
    ),
)]
pub async fn healthz() -> axum::Json<Health> {
    axum::Json(Health { status: "ok" })
}

/// `GET /openapi.json`: the contract, as committed.
#[utoipa::path(
    get,
    path = "/openapi.json",
    operation_id = "openapi",
    tag = "operations",
    summary = "This document",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of the public API.",
            content_type = "application/json", body = Object),
        (status = 413, description = "`payload_too_large`: a request body was announced (none \
            is taken; the connection is closed).", body = ErrorBody),
    ),
)]
pub async fn openapi_json() -> impl axum::response::IntoResponse {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI_DOCUMENT,
    )
}

/// The committed contract, `docs/openapi.json` ([`crate::openapi`] generates and checks it).
pub const OPENAPI_DOCUMENT: &str = include_str!("../../docs/openapi.json");

/// Serves `router` (the operator endpoints) on `listener` until `cancel`.
pub async fn serve_admin(
    listener: TcpListener,
    router: Router,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(cancel.cancelled_owned())
    .await
}

/// An operator endpoint's response, through `router`.
pub async fn respond(router: &Router, incoming: &mut Incoming<'_>) -> Response {
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
            return error::response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "unreadable body",
            );
        }
    };
    let request = request
        .extension(axum::extract::ConnectInfo(incoming.peer))
        .body(Body::from(body));
    match request {
        Ok(request) => match router.clone().oneshot(request).await {
            Ok(response) => from_axum(response).await,
            Err(never) => match never {},
        },
        Err(_) => error::response(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "malformed request",
        ),
    }
}

/// An axum response as the gateway's own, with a `Date`; its framing headers are left to
/// the connection.
pub async fn from_axum(response: axum::response::Response) -> Response {
    let (parts, body) = response.into_parts();
    let mut converted = Response::new(parts.status);
    for (name, value) in &parts.headers {
        let framing = name == axum::http::header::CONTENT_LENGTH
            || name == axum::http::header::TRANSFER_ENCODING
            || name == axum::http::header::CONNECTION;
        if !framing {
            converted.push_header(name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if !parts.headers.contains_key(axum::http::header::DATE) {
        with_date(|date| converted.push_header(b"date", date));
    }
    converted.body = match axum::body::to_bytes(body, MAX_LOCAL_BODY).await {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(error = %e, "could not read the gateway's own response");
            converted.status = StatusCode::INTERNAL_SERVER_ERROR;
            Bytes::new()
        }
    };
    converted
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[tokio::test]
    async fn the_gateways_own_responses_keep_their_headers_and_get_a_date() {
        let mut response = seckill_http::error_response(StatusCode::NOT_FOUND, "not_found", "no");
        response
            .headers_mut()
            .insert("x-b", HeaderValue::from_static("2"));
        let error = error::response(StatusCode::NOT_FOUND, "not_found", "no");
        let answer = from_axum(response).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND);
        assert_eq!(answer.header("X-B"), Some(&b"2"[..]));
        assert_eq!(
            answer.header("content-type"),
            Some(&b"application/json"[..])
        );
        let date = answer.header("date").expect("a date");
        assert!(httpdate::parse_http_date(std::str::from_utf8(date).expect("text")).is_ok());
        assert!(
            answer.header("content-length").is_none(),
            "framing is the connection's"
        );
        let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
        assert_eq!(body["code"], "not_found");
        assert_eq!((error.status, &error.body), (answer.status, &answer.body));
    }

    #[tokio::test]
    async fn a_refusal_has_the_headers_axum_would_give_it() {
        let refusal = error::response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "slow \"down\"",
        );
        let axum = from_axum(seckill_http::error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "slow \"down\"",
        ))
        .await;
        let names = |r: &Response| r.lines().map(|(n, _)| n.to_vec()).collect::<Vec<_>>();
        assert_eq!(names(&refusal), names(&axum));
        assert_eq!(refusal.header("content-type"), axum.header("content-type"));
        assert_eq!((refusal.status, &refusal.body), (axum.status, &axum.body));
    }
}
