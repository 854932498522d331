//! JWT claims, verification with a pinned algorithm, and minting.
//!
//! The accepted algorithm comes from configuration ([`JwtAlgorithm`]) and is the only one in
//! the `Validation`, so a token cannot choose how it is checked: `alg: none`, an HS256 token
//! signed with an RSA public key as the HMAC secret (algorithm confusion) and any other
//! algorithm are refused before a signature is looked at.

use jsonwebtoken::errors::ErrorKind;
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

/// [`Claims`] as read off the wire: `exp` and `sub` may be absent here so that jsonwebtoken,
/// which deserializes before it validates, reports a missing claim as such, not as bad JSON.
#[derive(Deserialize)]
struct WireClaims {
    #[serde(default)]
    sub: Option<String>,
    #[serde(default)]
    exp: Option<i64>,
    #[serde(default)]
    iat: Option<i64>,
    #[serde(default)]
    nbf: Option<i64>,
    #[serde(default)]
    roles: Vec<String>,
}

impl WireClaims {
    /// The claims of a token that passed validation, which required `sub` and `exp`: a
    /// missing one never gets here.
    fn into_claims(self) -> Result<Claims, TokenError> {
        let (Some(sub), Some(exp)) = (self.sub, self.exp) else {
            return Err(TokenError::MissingClaim);
        };
        Ok(Claims {
            sub,
            exp,
            iat: self.iat,
            nbf: self.nbf,
            roles: self.roles,
        })
    }
}

/// The one signature algorithm a verifier accepts, chosen by configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum JwtAlgorithm {
    /// HMAC-SHA256 with a shared secret (the development default).
    #[default]
    #[serde(alias = "hs256")]
    HS256,
    /// RSASSA-PKCS1-v1_5 with SHA-256, verified with an RSA public key.
    #[serde(alias = "rs256")]
    RS256,
    /// Ed25519, verified with an Ed25519 public key.
    #[serde(alias = "eddsa", alias = "EDDSA")]
    EdDSA,
}

impl JwtAlgorithm {
    fn pinned(self) -> Algorithm {
        match self {
            Self::HS256 => Algorithm::HS256,
            Self::RS256 => Algorithm::RS256,
            Self::EdDSA => Algorithm::EdDSA,
        }
    }
}

/// What a token's registered claims must say besides carrying a valid signature.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClaimRules {
    /// Accepted `iss` values; empty means `iss` is neither required nor checked.
    pub issuers: Vec<String>,
    /// Accepted `aud` values; empty means `aud` is neither required nor checked.
    pub audiences: Vec<String>,
    /// Clock skew tolerated on `exp`, `nbf` and `iat`, seconds.
    pub leeway_secs: u64,
}

/// Why a token was refused. The client is told only "unauthorized"; [`TokenError::reason`]
/// goes to logs and metrics.
#[derive(Debug, Clone, Copy, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a JWT: wrong shape, bad base64, bad JSON, a claim of the wrong type, or an
    /// algorithm name that does not exist (`none`).
    #[error("malformed token")]
    Malformed,
    /// A real algorithm, but not the configured one.
    #[error("algorithm not accepted")]
    WrongAlgorithm,
    /// The signature does not match the payload under the configured key.
    #[error("signature does not verify")]
    BadSignature,
    /// `exp` is past (beyond the leeway).
    #[error("token expired")]
    Expired,
    /// `nbf` is in the future (beyond the leeway).
    #[error("token not yet valid")]
    NotYetValid,
    /// `iat` is in the future (beyond the leeway): minted by a clock or a hand not trusted.
    #[error("token issued in the future")]
    IssuedInFuture,
    /// `iss` is not an accepted issuer.
    #[error("issuer not accepted")]
    WrongIssuer,
    /// `aud` names none of the accepted audiences.
    #[error("audience not accepted")]
    WrongAudience,
    /// A required claim (`exp`, `sub`, or a configured `iss`/`aud`) is absent.
    #[error("required claim missing")]
    MissingClaim,
    /// `sub` is not a positive decimal user id.
    #[error("subject is not a user id")]
    BadSubject,
}

impl TokenError {
    /// A short, stable label for metrics and logs.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::WrongAlgorithm => "wrong_algorithm",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::IssuedInFuture => "issued_in_future",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::MissingClaim => "missing_claim",
            Self::BadSubject => "bad_subject",
        }
    }

    fn from_jwt(error: &jsonwebtoken::errors::Error) -> Self {
        match error.kind() {
            ErrorKind::InvalidSignature => Self::BadSignature,
            ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Self::WrongAlgorithm,
            ErrorKind::ExpiredSignature => Self::Expired,
            ErrorKind::ImmatureSignature => Self::NotYetValid,
            ErrorKind::InvalidIssuer => Self::WrongIssuer,
            ErrorKind::InvalidAudience => Self::WrongAudience,
            ErrorKind::MissingRequiredClaim(_) => Self::MissingClaim,
            // Shape, encoding, claim types, unknown algorithm names, and key errors the
            // pinned key cannot cause: all "this is not a token we can read".
            _ => Self::Malformed,
        }
    }
}

/// Why a verifier could not be built from the configured key.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The PEM holds a private key: the gateway needs, and should hold, only the public one.
    #[error("{0:?} needs a public key (BEGIN PUBLIC KEY), not a private key")]
    PrivateKey(JwtAlgorithm),
    /// The PEM is not a public key of the configured algorithm.
    #[error("not a usable {algorithm:?} public key: {reason}")]
    Invalid {
        /// The configured algorithm.
        algorithm: JwtAlgorithm,
        /// What the PEM parser said.
        reason: String,
    },
}

/// Verifies user tokens with one configured algorithm and key.
#[derive(Clone)]
pub struct JwtVerifier {
    algorithm: JwtAlgorithm,
    key: DecodingKey,
    validation: Validation,
    leeway_secs: i64,
    /// HS256 checked without jsonwebtoken's repeated work ([`hs256`]); RS256 and EdDSA go through jsonwebtoken.
    hs256: Option<hs256::Hs256>,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl JwtVerifier {
    /// A verifier for HS256 tokens signed with `secret`, allowing `leeway_secs` of clock skew
    /// and checking neither issuer nor audience.
    pub fn hs256(secret: &str, leeway_secs: u64) -> Self {
        let rules = ClaimRules {
            leeway_secs,
            ..ClaimRules::default()
        };
        Self::new(JwtAlgorithm::HS256, secret.as_bytes(), &rules)
            .expect("an HS256 verifier takes any secret")
    }

    /// A verifier for `algorithm`: `key` is the shared secret for HS256, a PEM public key
    /// (`BEGIN PUBLIC KEY` or `BEGIN RSA PUBLIC KEY`) for RS256, a PEM Ed25519 public key
    /// for EdDSA.
    pub fn new(algorithm: JwtAlgorithm, key: &[u8], rules: &ClaimRules) -> Result<Self, KeyError> {
        let decoding_key = match algorithm {
            JwtAlgorithm::HS256 => {
                let mut verifier = Self::with_key(algorithm, DecodingKey::from_secret(key), rules);
                verifier.hs256 = Some(hs256::Hs256::new(key, rules));
                return Ok(verifier);
            }
            JwtAlgorithm::RS256 | JwtAlgorithm::EdDSA => {
                // jsonwebtoken would take a PKCS#1 RSA *private* key here and then refuse
                // every token; say what is wrong at start instead.
                if String::from_utf8_lossy(key).contains("PRIVATE KEY") {
                    return Err(KeyError::PrivateKey(algorithm));
                }
                let parsed = if algorithm == JwtAlgorithm::RS256 {
                    DecodingKey::from_rsa_pem(key)
                } else {
                    DecodingKey::from_ed_pem(key)
                };
                parsed.map_err(|e| KeyError::Invalid {
                    algorithm,
                    reason: e.to_string(),
                })?
            }
        };
        Ok(Self::with_key(algorithm, decoding_key, rules))
    }

    fn with_key(algorithm: JwtAlgorithm, key: DecodingKey, rules: &ClaimRules) -> Self {
        // `Validation::new` lists exactly one algorithm: the header's `alg` must be it.
        let mut validation = Validation::new(algorithm.pinned());
        validation.leeway = rules.leeway_secs;
        validation.validate_exp = true;
        // jsonwebtoken leaves `nbf` unchecked unless asked.
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        if !rules.issuers.is_empty() {
            validation.set_issuer(&rules.issuers);
            required.push("iss");
        }
        // With no audience configured, a token's `aud` is someone else's business; with one,
        // it is required and must match.
        validation.validate_aud = !rules.audiences.is_empty();
        if validation.validate_aud {
            validation.set_audience(&rules.audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        Self {
            algorithm,
            key,
            validation,
            leeway_secs: i64::try_from(rules.leeway_secs).unwrap_or(i64::MAX),
            hs256: None,
        }
    }

    /// The algorithm this verifier accepts.
    pub fn algorithm(&self) -> JwtAlgorithm {
        self.algorithm
    }

    /// Clock skew tolerated on `exp`, `nbf` and `iat`, seconds.
    pub fn leeway_secs(&self) -> i64 {
        self.leeway_secs
    }

    /// Checks algorithm, signature and claims, and returns the user id with the claims.
    pub fn verify(&self, token: &str) -> Result<(i64, Claims), TokenError> {
        let now = chrono::Utc::now().timestamp();
        let claims = match &self.hs256 {
            Some(hs256) => hs256.verify(token, now.max(0).unsigned_abs())?,
            None => self.decode(token)?,
        };
        self.finish(claims, now)
    }

    /// [`Self::verify`] through jsonwebtoken's `decode` whatever the algorithm: what the
    /// HS256 path is tested against (`jwt/tests.rs`, the `jwt_hs256` fuzz target).
    #[doc(hidden)]
    pub fn verify_with_jsonwebtoken(&self, token: &str) -> Result<(i64, Claims), TokenError> {
        let claims = self.decode(token)?;
        self.finish(claims, chrono::Utc::now().timestamp())
    }

    fn decode(&self, token: &str) -> Result<Claims, TokenError> {
        decode::<WireClaims>(token, &self.key, &self.validation)
            .map_err(|e| TokenError::from_jwt(&e))?
            .claims
            .into_claims()
    }

    /// The checks jsonwebtoken does not make: `iat` and the subject as a user id.
    fn finish(&self, claims: Claims, now: i64) -> Result<(i64, Claims), TokenError> {
        // jsonwebtoken has no `iat` check: a token "issued" in the future is minted by a
        // clock or a hand we do not trust.
        if claims
            .iat
            .is_some_and(|iat| iat > now.saturating_add(self.leeway_secs))
        {
            return Err(TokenError::IssuedInFuture);
        }
        let user_id = claims
            .sub
            .parse::<i64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or(TokenError::BadSubject)?;
        Ok((user_id, claims))
    }
}

/// Mints HS256 tokens for scripts, tests and the load tester, with the `iss` and `aud` a
/// gateway that checks them expects. Production tokens come from the operator's identity
/// provider.
#[derive(Clone)]
pub struct TokenMinter {
    key: EncodingKey,
    issuer: Option<String>,
    audience: Option<String>,
}

impl std::fmt::Debug for TokenMinter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMinter")
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

/// [`Claims`] plus the scope claims a minter adds.
#[derive(Serialize)]
struct MintedClaims<'a> {
    #[serde(flatten)]
    claims: &'a Claims,
    #[serde(skip_serializing_if = "Option::is_none")]
    iss: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
}

impl TokenMinter {
    /// A minter signing with the HS256 `secret`, without `iss` or `aud`.
    pub fn new(secret: &str) -> Self {
        Self {
            key: EncodingKey::from_secret(secret.as_bytes()),
            issuer: None,
            audience: None,
        }
    }

    /// Puts `iss` in every token: the first of `issuers`, a comma-separated list as the
    /// gateway's settings take it (none when empty).
    pub fn issuer(mut self, issuers: &str) -> Self {
        self.issuer = first_of(issuers);
        self
    }

    /// Puts `aud` in every token: the first of `audiences`, as for [`Self::issuer`].
    pub fn audience(mut self, audiences: &str) -> Self {
        self.audience = first_of(audiences);
        self
    }

    /// A token for `user_id` with `roles`, valid for `ttl_secs` from now.
    pub fn mint(&self, user_id: i64, roles: &[&str], ttl_secs: i64) -> String {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: user_id.to_string(),
            exp: now + ttl_secs,
            iat: Some(now),
            nbf: None,
            roles: roles.iter().map(|r| r.to_string()).collect(),
        };
        let minted = MintedClaims {
            claims: &claims,
            iss: self.issuer.as_deref(),
            aud: self.audience.as_deref(),
        };
        encode(&Header::new(Algorithm::HS256), &minted, &self.key)
            .expect("HS256 encoding of plain claims cannot fail")
    }
}

/// The first entry of a comma-separated list, trimmed; none when it is empty.
fn first_of(list: &str) -> Option<String> {
    let first = list.split(',').next().unwrap_or("").trim();
    (!first.is_empty()).then(|| first.to_owned())
}

/// Mints an HS256 token for `user_id` valid for `ttl_secs`, without `iss` or `aud`
/// ([`TokenMinter`] adds them).
pub fn mint_token(secret: &str, user_id: i64, roles: &[&str], ttl_secs: i64) -> String {
    TokenMinter::new(secret).mint(user_id, roles, ttl_secs)
}

mod hs256;
#[cfg(test)]
mod tests;
