//! JWT claims, verification with a pinned algorithm, and minting.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, encode};
use serde::{Deserialize, Serialize};

/// The claims the platform reads. `sub` is the decimal user id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    /// The user id, decimal.
    pub sub: String,
    /// Expiry, seconds since the epoch. Required.
    pub exp: i64,
    /// Issued at, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    /// Not before, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Roles, e.g. `["admin"]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
}

/// Why a token was refused. Deliberately coarse: the client is told only "unauthorized".
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Signature, algorithm, format or claims are wrong.
    #[error("invalid token: {0}")]
    Invalid(String),
    /// `sub` is not a positive decimal user id.
    #[error("subject is not a user id")]
    BadSubject,
}

/// Verifies HS256 tokens. The algorithm is fixed here, never read from the token header.
#[derive(Clone)]
pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier").finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// A verifier for tokens signed with `secret`, allowing `leeway_secs` of clock skew.
    pub fn hs256(secret: &str, leeway_secs: u64) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = leeway_secs;
        validation.validate_exp = true;
        validation.validate_nbf = true;
        validation.validate_aud = false;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Self {
            key: DecodingKey::from_secret(secret.as_bytes()),
            validation,
        }
    }

    /// Checks signature and time claims and returns the user id with the claims.
    pub fn verify(&self, token: &str) -> Result<(i64, Claims), TokenError> {
        let data = decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| TokenError::Invalid(e.to_string()))?;
        let user_id = data
            .claims
            .sub
            .parse::<i64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or(TokenError::BadSubject)?;
        Ok((user_id, data.claims))
    }
}

/// Mints an HS256 token for `user_id` valid for `ttl_secs`, for scripts, tests and the load
/// tester. Production tokens come from the operator's identity provider.
pub fn mint_token(secret: &str, user_id: i64, roles: &[&str], ttl_secs: i64) -> String {
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        sub: user_id.to_string(),
        exp: now + ttl_secs,
        iat: Some(now),
        nbf: None,
        roles: roles.iter().map(|r| r.to_string()).collect(),
    };
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 encoding of plain claims cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minted_token_verifies_with_the_same_secret() {
        let token = mint_token("s3cret", 42, &["admin"], 60);
        let (user, claims) = JwtVerifier::hs256("s3cret", 0)
            .verify(&token)
            .expect("valid");
        assert_eq!(user, 42);
        assert_eq!(claims.roles, vec!["admin".to_string()]);
    }

    #[test]
    fn a_token_signed_with_another_secret_is_refused() {
        let token = mint_token("other", 42, &[], 60);
        assert!(JwtVerifier::hs256("s3cret", 0).verify(&token).is_err());
    }

    #[test]
    fn an_expired_token_is_refused() {
        let token = mint_token("s3cret", 42, &[], -120);
        assert!(JwtVerifier::hs256("s3cret", 5).verify(&token).is_err());
    }

    #[test]
    fn an_unsigned_alg_none_token_is_refused() {
        // header {"alg":"none","typ":"JWT"}, payload {"sub":"1","exp":9999999999}
        let token = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxIiwiZXhwIjo5OTk5OTk5OTk5fQ.";
        assert!(JwtVerifier::hs256("s3cret", 0).verify(token).is_err());
    }

    #[test]
    fn a_non_numeric_subject_is_refused() {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: "alice".into(),
            exp: now + 60,
            iat: None,
            nbf: None,
            roles: vec![],
        };
        let token = encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"s3cret"),
        )
        .expect("encode");
        assert_eq!(
            JwtVerifier::hs256("s3cret", 0).verify(&token),
            Err(TokenError::BadSubject)
        );
    }
}
