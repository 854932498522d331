//! Authentication at the door: bearer token → verified user id and roles.

use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;

use seckill_auth::JwtVerifier;
use seckill_auth::jwt::TokenError;
use seckill_http::error_response;

/// A caller whose token verified.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's `sub`.
    pub user_id: i64,
    /// The token's `roles`.
    pub roles: Vec<String>,
}

/// Verifies the bearer token in `headers`; on failure, the reason for metrics (the caller
/// is told only "unauthorized", see [`unauthorized`]).
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
    match verifier.verify(token) {
        Ok((user_id, claims)) => Ok(Caller {
            user_id,
            roles: claims.roles,
        }),
        Err(TokenError::BadSubject) => Err("bad_subject"),
        Err(TokenError::Invalid(reason)) => {
            tracing::debug!(%reason, "token refused");
            Err("invalid_token")
        }
    }
}

/// The 401 for a refused token; `reason` is counted, never sent.
pub fn unauthorized(reason: &'static str) -> Response {
    metrics::counter!("gateway_auth_failures_total", "reason" => reason).increment(1);
    let mut response = error_response(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "a valid bearer token is required",
    );
    response.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"seckill\""),
    );
    response
}

/// The 403 for a non-admin on an admin route.
pub fn forbidden() -> Response {
    metrics::counter!("gateway_auth_failures_total", "reason" => "not_admin").increment(1);
    error_response(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this action needs the admin role",
    )
}
