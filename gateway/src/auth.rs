//! Authentication at the door: bearer token → verified user id and roles.
//!
//! [`authenticate`] only says what it found (a [`Caller`] or the reason there is none): the
//! request path ([`crate::door`]) charges a verified user per user and everyone else —
//! garbage tokens included — per client address, and refuses the request afterwards if its
//! route needs a caller.

use anyhow::Context;
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use seckill_auth::{ClaimRules, JwtAlgorithm, JwtVerifier};
use seckill_config::split_list;
use seckill_http::error_response;

use crate::Settings;

/// A caller whose token verified.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's `sub`.
    pub user_id: i64,
    /// The token's `roles`.
    pub roles: Vec<String>,
}

impl Caller {
    /// Whether the caller holds the `admin` role.
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "admin")
    }
}

/// The verifier the settings describe: algorithm, key (read from the file if named), rules.
pub fn verifier(settings: &Settings) -> anyhow::Result<JwtVerifier> {
    let rules = ClaimRules {
        issuers: split_list(&settings.jwt_issuer),
        audiences: split_list(&settings.jwt_audience),
        leeway_secs: settings.jwt_leeway_secs,
    };
    let key: Vec<u8> = match settings.jwt_algorithm {
        JwtAlgorithm::HS256 => settings.jwt_secret.expose().as_bytes().to_vec(),
        _ if !settings.jwt_public_key_pem.trim().is_empty() => {
            settings.jwt_public_key_pem.as_bytes().to_vec()
        }
        _ => std::fs::read(&settings.jwt_public_key_file).with_context(|| {
            format!("read jwt_public_key_file {}", settings.jwt_public_key_file)
        })?,
    };
    JwtVerifier::new(settings.jwt_algorithm, &key, &rules).context("jwt public key")
}

/// Verifies the bearer token in `headers`; on failure, the reason for logs and metrics.
pub fn authenticate(verifier: &JwtVerifier, headers: &HeaderMap) -> Result<Caller, &'static str> {
    let token = headers
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err("missing_token");
    };
    verifier
        .verify(token)
        .map(|(user_id, claims)| Caller {
            user_id,
            roles: claims.roles,
        })
        .map_err(|e| e.reason())
}

/// The 401 for a refused token: one message whatever went wrong; `reason` goes to the log
/// and to `gateway_auth_failures_total{reason}`.
pub fn unauthorized(reason: &'static str) -> Response {
    metrics::counter!("gateway_auth_failures_total", "reason" => reason).increment(1);
    tracing::info!(reason, "request refused: no valid bearer token");
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a valid bearer token is required",
    );
    // RFC 6750 §3: no error code when no token was sent, `invalid_token` otherwise.
    let challenge = if reason == "missing_token" {
        "Bearer realm=\"seckill\""
    } else {
        "Bearer realm=\"seckill\", error=\"invalid_token\""
    };
    response
        .headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    response
}

/// The 403 for a non-admin on an admin route.
pub fn forbidden() -> Response {
    metrics::counter!("gateway_auth_failures_total", "reason" => "not_admin").increment(1);
    let mut response = error_response(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this action needs the admin role",
    );
    response.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"seckill\", error=\"insufficient_scope\""),
    );
    response
}
