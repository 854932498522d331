//! The backends' side: checking a credential against the request that carried it, once.
//!
//! [`verified`] wraps a backend's routes in a middleware that, for a request carrying an
//! identity signature, reads the body (it is part of what is signed), checks the MAC, the
//! age and that the same signature was not seen before, and leaves the outcome in the
//! request's extensions for the [`super::Identity`] extractors. A request without one passes
//! untouched: routes that need an identity refuse it there, with 401.
//!
//! Replays: a signature is remembered for twice the window (a credential cannot be valid for
//! longer: `|age| <= window` either side), so the same request sent again is refused even
//! within its window. The gateway signs each attempt afresh and sends one only once (a
//! non-safe request never goes twice; a safe one goes again only when the replica dropped
//! the connection without answering, so it never reached a handler). The cache is per
//! process and bounded: a replay to another replica of the same service, or one after the
//! cache had to evict under a flood, is only refused by the window.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode};
use axum::middleware::{self, Next};
use axum::response::Response;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use seckill_http::error_response;
use seckill_http::layers::REQUEST_ID;

use super::credential::{RequestFacts, VERSION, keyed, mac};
use super::replay::Seen;
use super::{IDENTITY_SIG, IDENTITY_TS, Identity, IdentityError, USER_ID, USER_ROLES};

/// The largest body read to check its digest: axum's default body limit, the one the
/// backends' JSON extractors apply anyway.
pub const MAX_SIGNED_BODY_BYTES: usize = 2 * 1024 * 1024;

/// Signatures remembered at most; beyond, the oldest are forgotten early (see the module
/// doc). ~40 bytes each at most: 40 MB for a full memory. Each of the two generations holds
/// half and turns every twice the window (10 s by default), so signatures are forgotten
/// early only past ~52,000 requests a second with the default window.
const SEEN_CAPACITY: usize = 1 << 20;

/// Verifies the gateway's credentials for one service with that service's key.
#[derive(Clone)]
pub struct IdentityVerifier {
    keyed: Hmac<Sha256>,
    /// This service's name, as the gateway signs it (shared: the middleware clones the
    /// verifier for every request).
    service: Arc<str>,
    /// How far a credential's time may be from now, either way, in milliseconds.
    window_ms: i64,
    /// Signatures already accepted, for twice the window.
    seen: Arc<Seen>,
}

impl std::fmt::Debug for IdentityVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityVerifier")
            .field("service", &self.service)
            .field("window_ms", &self.window_ms)
            .finish_non_exhaustive()
    }
}

/// The outcome of checking a request's credential, left in its extensions.
#[derive(Debug, Clone)]
pub(super) struct Checked(pub(super) Result<Identity, IdentityError>);

impl IdentityVerifier {
    /// A verifier for `service` under `key`, accepting credentials signed within `window`
    /// of now (past or future).
    pub fn new(key: &str, service: &str, window: Duration) -> Self {
        Self {
            keyed: keyed(key),
            service: Arc::from(service),
            window_ms: i64::try_from(window.as_millis()).unwrap_or(i64::MAX),
            seen: Arc::new(Seen::new(window.saturating_mul(2), SEEN_CAPACITY)),
        }
    }

    /// Checks the credential in `headers` for `facts`, and that it was not used before.
    pub async fn verify(
        &self,
        headers: &HeaderMap,
        facts: &RequestFacts<'_>,
    ) -> Result<Identity, IdentityError> {
        let sig = self.check(headers, facts, chrono::Utc::now().timestamp_millis())?;
        if !self.seen.first_time(&sig) {
            return Err(IdentityError::Replayed);
        }
        let roles = text(headers, &USER_ROLES).unwrap_or("");
        let roles = roles
            .split(',')
            .filter(|r| !r.is_empty())
            .map(String::from)
            .collect();
        let user_id = text(headers, &USER_ID)?
            .parse()
            .map_err(|_| IdentityError::Missing)?;
        Ok(Identity { user_id, roles })
    }

    /// The MAC and age checks at `now_ms`; the signature bytes on success.
    fn check(
        &self,
        headers: &HeaderMap,
        facts: &RequestFacts<'_>,
        now_ms: i64,
    ) -> Result<[u8; 32], IdentityError> {
        let user = text(headers, &USER_ID)?;
        user.parse::<i64>().map_err(|_| IdentityError::Missing)?;
        let roles = text(headers, &USER_ROLES).unwrap_or("");
        let ts_text = text(headers, &IDENTITY_TS)?;
        let ts: i64 = ts_text.parse().map_err(|_| IdentityError::Missing)?;
        let sig = text(headers, &IDENTITY_SIG)?;
        let hex = sig
            .strip_prefix(VERSION)
            .and_then(|rest| rest.strip_prefix('='))
            .ok_or(IdentityError::UnknownVersion)?;
        let sig: [u8; 32] = super::unhex(hex)
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or(IdentityError::BadSignature)?;
        mac(&self.keyed, &self.service, facts, [user, roles, ts_text])
            .verify_slice(&sig)
            .map_err(|_| IdentityError::BadSignature)?;
        if now_ms.abs_diff(ts) > self.window_ms.unsigned_abs() {
            return Err(IdentityError::Stale);
        }
        Ok(sig)
    }
}

fn text<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<&'h str, IdentityError> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .ok_or(IdentityError::Missing)
}

/// `routes` with every request's credential checked by `verifier` (see the module doc).
/// Apply it to the routes as merged, before any `nest`: the path checked is the request's.
pub fn verified(routes: Router, verifier: IdentityVerifier) -> Router {
    routes.layer(middleware::from_fn_with_state(verifier, check_request))
}

async fn check_request(
    State(verifier): State<IdentityVerifier>,
    request: Request,
    next: Next,
) -> Response {
    if !request.headers().contains_key(IDENTITY_SIG) {
        return next.run(request).await;
    }
    let (mut parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_SIGNED_BODY_BYTES).await else {
        let message = format!("request bodies are limited to {MAX_SIGNED_BODY_BYTES} bytes");
        return error_response(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", &message);
    };
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let request_id = parts
        .headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let facts = RequestFacts {
        method: parts.method.as_str(),
        target,
        request_id,
        body: &body,
    };
    let outcome = verifier.verify(&parts.headers, &facts).await;
    if let Err(e) = &outcome {
        tracing::info!(reason = %e, "identity credential refused");
    }
    parts.extensions.insert(Checked(outcome));
    next.run(Request::from_parts(parts, Body::from(body))).await
}

#[cfg(test)]
mod tests;
