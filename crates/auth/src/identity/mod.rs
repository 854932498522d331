//! The gateway → backend identity credential.
//!
//! The gateway strips every client-sent header in [`IDENTITY_HEADERS`], then sets
//! `x-user-id`, `x-user-roles`, `x-identity-ts` (unix ms) and `x-identity-sig`, a MAC over
//! the caller, the time and the request itself (method, path and query, target service,
//! request id, body digest) under the target service's key ([`credential`] has the wire
//! format). Backends accept the identity only for the request it was signed for, within a
//! few seconds of its signing, and once ([`verify`]): a caller that goes around the gateway
//! can neither invent an identity nor reuse one it captured for another request.
//!
//! Layout: [`credential`] — the signed fields and the gateway's [`IdentitySigner`];
//! [`verify`] — the backends' [`IdentityVerifier`] and the middleware that runs it;
//! `replay` — its bounded memory of the signatures already accepted; here —
//! the headers, [`Identity`] and the extractors handlers take.

pub mod credential;
mod replay;
pub mod verify;

use axum::extract::FromRequestParts;
use axum::http::HeaderName;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::Response;

use seckill_http::error_response;

pub use credential::{IdentitySigner, RequestFacts};
pub use verify::{IdentityVerifier, verified};

/// The verified user id.
pub const USER_ID: HeaderName = HeaderName::from_static("x-user-id");
/// Comma-separated roles.
pub const USER_ROLES: HeaderName = HeaderName::from_static("x-user-roles");
/// When the gateway signed, unix milliseconds.
pub const IDENTITY_TS: HeaderName = HeaderName::from_static("x-identity-ts");
/// `v2=` and the hex HMAC-SHA256 of the signed fields ([`credential`]).
pub const IDENTITY_SIG: HeaderName = HeaderName::from_static("x-identity-sig");

/// Every header a backend reads identity from; the gateway removes them from client requests.
pub const IDENTITY_HEADERS: [HeaderName; 4] = [USER_ID, USER_ROLES, IDENTITY_TS, IDENTITY_SIG];

/// A caller the gateway vouched for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The JWT `sub`.
    pub user_id: i64,
    /// The JWT `roles`.
    pub roles: Vec<String>,
}

impl Identity {
    /// Whether the caller holds the `admin` role.
    pub fn is_admin(&self) -> bool {
        self.roles.iter().any(|r| r == "admin")
    }
}

/// Why identity headers were refused.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// A header is missing or not valid text.
    #[error("identity headers missing")]
    Missing,
    /// The signature does not match.
    #[error("identity signature invalid")]
    BadSignature,
    /// Signed too long ago (or in the future beyond the allowed skew).
    #[error("identity credential expired")]
    Stale,
    /// The same credential was already used.
    #[error("identity credential replayed")]
    Replayed,
    /// The signature is not of a format version this build knows.
    #[error("identity credential of an unknown version")]
    UnknownVersion,
}

/// Read from what [`verified`] found; a request it did not check (no credential, or a
/// router without the middleware) has no identity.
impl<S: Send + Sync> FromRequestParts<S> for Identity {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let checked = parts.extensions.get::<verify::Checked>();
        match checked.map(|c| &c.0) {
            Some(Ok(identity)) => Ok(identity.clone()),
            _ => Err(error_response(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "authentication required",
            )),
        }
    }
}

/// An [`Identity`] that holds the `admin` role; others get 403.
#[derive(Debug, Clone)]
pub struct AdminIdentity(pub Identity);

impl<S: Send + Sync> FromRequestParts<S> for AdminIdentity {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let identity = Identity::from_request_parts(parts, state).await?;
        if identity.is_admin() {
            Ok(AdminIdentity(identity))
        } else {
            Err(error_response(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this action needs the admin role",
            ))
        }
    }
}

/// Roles as they travel in `x-user-roles`: comma-separated. A role containing a comma (or
/// anything but plain characters) would be read back as other roles, so it is dropped, not
/// forwarded.
pub fn join_roles(roles: &[String]) -> String {
    let plain = roles
        .iter()
        .filter(|r| seckill_http::is_plain_token(r.as_bytes()));
    plain.map(String::as_str).collect::<Vec<_>>().join(",")
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}
