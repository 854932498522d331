//! The gateway → backend identity credential.
//!
//! The gateway strips every client-sent header in [`IDENTITY_HEADERS`], then sets
//! `x-user-id`, `x-user-roles`, `x-identity-ts` (unix ms) and `x-identity-sig`, the hex
//! HMAC-SHA256 of `"{user_id}\n{roles}\n{ts}"` under the internal key. Backends accept the
//! identity only when the signature matches and the timestamp is recent, so a caller that
//! goes around the gateway can neither invent an identity nor replay an old one for long.

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use seckill_http::error_response;

/// The verified user id.
pub const USER_ID: HeaderName = HeaderName::from_static("x-user-id");
/// Comma-separated roles.
pub const USER_ROLES: HeaderName = HeaderName::from_static("x-user-roles");
/// When the gateway signed, unix milliseconds.
pub const IDENTITY_TS: HeaderName = HeaderName::from_static("x-identity-ts");
/// Hex HMAC-SHA256 over id, roles and timestamp.
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
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
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
}

/// Signs (gateway) and verifies (backends) identity headers with the shared internal key.
#[derive(Clone)]
pub struct IdentitySigner {
    /// HMAC state with the key already absorbed: cloned per signature instead of hashing
    /// the key again each time.
    keyed: Hmac<Sha256>,
    max_age_ms: i64,
}

impl std::fmt::Debug for IdentitySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentitySigner")
            .field("max_age_ms", &self.max_age_ms)
            .finish_non_exhaustive()
    }
}

impl IdentitySigner {
    /// A signer for `key`; credentials older than `max_age_ms` are refused.
    pub fn new(key: &str, max_age_ms: i64) -> Self {
        Self {
            keyed: Hmac::<Sha256>::new_from_slice(key.as_bytes())
                .expect("HMAC accepts keys of any length"),
            max_age_ms,
        }
    }

    /// The MAC of `"{user_id}\n{roles}\n{ts}"`, the three as they travel in the headers.
    fn mac(&self, user_id: &str, roles: &str, ts: &str) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        for part in [user_id, "\n", roles, "\n", ts] {
            mac.update(part.as_bytes());
        }
        mac
    }

    /// Replaces any identity headers in `headers` with freshly signed ones.
    pub fn sign_into(&self, headers: &mut HeaderMap, user_id: i64, roles: &[String]) {
        self.sign(user_id, &join_roles(roles), |values| {
            // `insert` replaces every value a client sent under the name; each of the four
            // is set, so none of the client's survives.
            for (name, value) in IDENTITY_HEADERS.into_iter().zip(values) {
                match HeaderValue::from_bytes(value) {
                    Ok(value) => {
                        headers.insert(name, value);
                    }
                    // Digits, hex and plain role names are always valid; were one not, the
                    // client's must still go.
                    Err(_) => {
                        headers.remove(name);
                    }
                }
            }
        });
    }

    /// Appends the four identity header lines (`name: value\r\n`) to `out`; `roles` joined
    /// by [`join_roles`]. The caller must not forward any client-sent identity header.
    pub fn write_lines(&self, out: &mut Vec<u8>, user_id: i64, roles: &str) {
        self.sign(user_id, roles, |values| {
            for (name, value) in IDENTITY_HEADERS.iter().zip(values) {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        });
    }

    /// Calls `with` with the four values for `user_id` and `roles` (already joined), signed
    /// now, in the order of [`IDENTITY_HEADERS`]; they live on the stack, nothing is
    /// allocated per signature.
    fn sign(&self, user_id: i64, roles: &str, with: impl FnOnce([&[u8]; 4])) {
        let mut user = itoa::Buffer::new();
        let user = user.format(user_id);
        let mut ts = itoa::Buffer::new();
        let ts = ts.format(chrono::Utc::now().timestamp_millis());
        let mut sig = [0u8; 64];
        seckill_http::write_hex(&self.mac(user, roles, ts).finalize().into_bytes(), &mut sig);
        with([user.as_bytes(), roles.as_bytes(), ts.as_bytes(), &sig]);
    }

    /// Reads and checks the identity headers.
    pub fn verify(&self, headers: &HeaderMap) -> Result<Identity, IdentityError> {
        let text = |name: &HeaderName| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or(IdentityError::Missing)
        };
        let user_text = text(&USER_ID)?;
        let user_id: i64 = user_text.parse().map_err(|_| IdentityError::Missing)?;
        let roles = text(&USER_ROLES).unwrap_or("");
        let ts_text = text(&IDENTITY_TS)?;
        let ts: i64 = ts_text.parse().map_err(|_| IdentityError::Missing)?;
        let sig = unhex(text(&IDENTITY_SIG)?).ok_or(IdentityError::BadSignature)?;
        self.mac(user_text, roles, ts_text)
            .verify_slice(&sig)
            .map_err(|_| IdentityError::BadSignature)?;
        let age = chrono::Utc::now().timestamp_millis() - ts;
        if age.abs() > self.max_age_ms {
            return Err(IdentityError::Stale);
        }
        let roles = roles
            .split(',')
            .filter(|r| !r.is_empty())
            .map(String::from)
            .collect();
        Ok(Identity { user_id, roles })
    }
}

impl<S> FromRequestParts<S> for Identity
where
    IdentitySigner: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        IdentitySigner::from_ref(state)
            .verify(&parts.headers)
            .map_err(|e| {
                tracing::debug!(reason = %e, "identity refused");
                error_response(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "authentication required",
                )
            })
    }
}

/// An [`Identity`] that holds the `admin` role; others get 403.
#[derive(Debug, Clone)]
pub struct AdminIdentity(pub Identity);

impl<S> FromRequestParts<S> for AdminIdentity
where
    IdentitySigner: FromRef<S>,
    S: Send + Sync,
{
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

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        let mut text = vec![0; bytes.len() * 2];
        seckill_http::write_hex(bytes, &mut text);
        String::from_utf8(text).expect("hex digits are ASCII")
    }

    #[test]
    fn written_lines_carry_the_same_signed_identity() {
        let signer = IdentitySigner::new("k", 30_000);
        let mut out = b"x-other: 1\r\n".to_vec();
        let roles = ["admin".to_string(), "x,y".to_string(), "buyer".to_string()];
        signer.write_lines(&mut out, -3, &join_roles(&roles));
        let text = String::from_utf8(out).expect("text");
        let mut headers = HeaderMap::new();
        for line in text.split_terminator("\r\n") {
            let (name, value) = line.split_once(": ").expect("name: value");
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        assert_eq!(headers.len(), 5, "{text}");
        assert_eq!(headers[USER_ROLES], "admin,buyer");
        let identity = signer.verify(&headers).expect("valid");
        assert_eq!((identity.user_id, identity.is_admin()), (-3, true));
    }

    fn signed(signer: &IdentitySigner, user: i64, roles: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
        signer.sign_into(&mut headers, user, &roles);
        headers
    }

    #[test]
    fn a_signed_identity_verifies() {
        let signer = IdentitySigner::new("k", 30_000);
        let identity = signer
            .verify(&signed(&signer, 7, &["admin"]))
            .expect("valid");
        assert_eq!(identity.user_id, 7);
        assert!(identity.is_admin());
    }

    #[test]
    fn every_client_sent_identity_value_is_replaced() {
        let signer = IdentitySigner::new("k", 30_000);
        let mut headers = HeaderMap::new();
        for name in &IDENTITY_HEADERS {
            headers.append(name, HeaderValue::from_static("1"));
            headers.append(name, HeaderValue::from_static("admin"));
        }
        signer.sign_into(&mut headers, 7, &[]);
        for name in &IDENTITY_HEADERS {
            assert_eq!(headers.get_all(name).iter().count(), 1, "{name}");
        }
        assert_eq!(headers[USER_ROLES], "");
        let identity = signer.verify(&headers).expect("valid");
        assert_eq!((identity.user_id, identity.is_admin()), (7, false));
    }

    #[test]
    fn changing_the_user_id_breaks_the_signature() {
        let signer = IdentitySigner::new("k", 30_000);
        let mut headers = signed(&signer, 7, &[]);
        headers.insert(USER_ID, HeaderValue::from_static("8"));
        assert_eq!(signer.verify(&headers), Err(IdentityError::BadSignature));
    }

    #[test]
    fn adding_a_role_breaks_the_signature() {
        let signer = IdentitySigner::new("k", 30_000);
        let mut headers = signed(&signer, 7, &[]);
        headers.insert(USER_ROLES, HeaderValue::from_static("admin"));
        assert_eq!(signer.verify(&headers), Err(IdentityError::BadSignature));
    }

    #[test]
    fn another_key_is_refused() {
        let headers = signed(&IdentitySigner::new("k", 30_000), 7, &[]);
        assert_eq!(
            IdentitySigner::new("other", 30_000).verify(&headers),
            Err(IdentityError::BadSignature)
        );
    }

    #[test]
    fn a_role_with_a_comma_cannot_smuggle_admin() {
        let signer = IdentitySigner::new("k", 30_000);
        let identity = signer
            .verify(&signed(&signer, 7, &["x,admin", "buyer"]))
            .expect("valid");
        assert_eq!(identity.roles, vec!["buyer".to_string()]);
        assert!(!identity.is_admin());
    }

    #[test]
    fn missing_headers_are_refused() {
        let signer = IdentitySigner::new("k", 30_000);
        assert_eq!(
            signer.verify(&HeaderMap::new()),
            Err(IdentityError::Missing)
        );
    }

    #[test]
    fn the_signature_is_the_hex_hmac_sha256_of_id_roles_and_time() {
        // Computed independently (Python's hmac): backends in any language can check it.
        let signer = IdentitySigner::new("k", 30_000);
        let sig = hex(&signer
            .mac("7", "admin", "1700000000000")
            .finalize()
            .into_bytes());
        assert_eq!(
            sig,
            "68566626a7f513590ece9d0df2897916f16b7e9423028e8c96f0fa674116ea92"
        );
    }

    #[test]
    fn an_old_credential_is_refused() {
        let signer = IdentitySigner::new("k", 30_000);
        let ts = chrono::Utc::now().timestamp_millis() - 60_000;
        let sig = hex(&signer.mac("7", "", &ts.to_string()).finalize().into_bytes());
        let mut headers = HeaderMap::new();
        headers.insert(USER_ID, HeaderValue::from_static("7"));
        headers.insert(
            IDENTITY_TS,
            HeaderValue::from_str(&ts.to_string()).expect("ascii"),
        );
        headers.insert(IDENTITY_SIG, HeaderValue::from_str(&sig).expect("ascii"));
        assert_eq!(signer.verify(&headers), Err(IdentityError::Stale));
    }
}
