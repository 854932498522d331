//! Authentication at the gateway: bearer token → verified user id and roles.
//!
//! [`Authenticator::known`] and [`Authenticator::check`] only say what they found (a
//! [`Caller`] or the reason there is none): the request path ([`crate::pipeline`]) charges a
//! verified user per user and everyone else — garbage tokens included — per client address,
//! and refuses the request afterwards if its route needs a caller.

use std::cell::RefCell;
use std::hash::BuildHasher;
use std::sync::Arc;

use anyhow::Context;
use axum::http::StatusCode;
use hashbrown::HashTable;

use seckill_auth::{ClaimRules, JwtAlgorithm, JwtVerifier};
use seckill_http1::Response;
use thread_local::ThreadLocal;

use crate::Settings;
use crate::error;

const WWW_AUTHENTICATE: &[u8] = b"www-authenticate";

/// A caller whose token verified.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The token's `sub`.
    pub user_id: i64,
    /// The token's `roles`.
    pub roles: Vec<String>,
    /// The roles as the identity header carries them ([`seckill_auth::join_roles`]),
    /// joined once when the token verified rather than for every request.
    pub roles_joined: String,
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
        issuers: settings.jwt_issuers.clone(),
        audiences: settings.jwt_audiences.clone(),
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

/// Verifies bearer tokens, remembering the ones that verified until they expire.
///
/// A client sends the same token with every request; checking its signature and claims
/// again each time was the largest single cost of a proxied request. A token that verified
/// is kept, per worker thread (no lock), with the caller it names and its `exp`; the same
/// token text is then accepted without a second check until `exp` plus the leeway has
/// passed — exactly as long as a full check would accept it, since the key, the algorithm
/// and the issuer/audience rules are fixed for the life of the process and time only moves
/// on (`nbf` and `iat` cannot turn a passed token back into a refused one). Only tokens that
/// verified are kept, so a flood of garbage cannot push real ones out, and refused tokens
/// are checked in full every time.
///
/// A request's token is hashed once ([`Self::bearer`]), with a seeded hash, and that hash
/// serves the lookup, the full check's second lookup and the insert: under a flood of
/// one-shot buyers every token is new, and hashing its ~200 bytes three times over was a
/// visible share of the request.
pub struct Authenticator {
    verifier: JwtVerifier,
    capacity: usize,
    verified: ThreadLocal<RefCell<HashTable<Verified>>>,
    hasher: foldhash::fast::RandomState,
    /// `gateway_token_verifications_total`, looked up once.
    verifications: metrics::Counter,
}

struct Verified {
    /// The token's hash ([`Bearer::hash`]).
    hash: u64,
    token: Box<str>,
    caller: Arc<Caller>,
    /// Unix seconds after which the token is refused.
    valid_until: i64,
}

/// The bearer token of a request, hashed for the table of verified tokens.
#[derive(Clone, Copy)]
pub struct Bearer<'a> {
    token: &'a str,
    hash: u64,
}

impl std::fmt::Debug for Bearer<'_> {
    /// Never the token: it is a credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bearer")
            .field("len", &self.token.len())
            .finish_non_exhaustive()
    }
}

impl Bearer<'_> {
    fn names(&self, verified: &Verified) -> bool {
        verified.hash == self.hash && *verified.token == *self.token
    }
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("verifier", &self.verifier)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Checks tokens with `verifier`, keeping up to `capacity` verified ones per thread
    /// (0: none).
    pub fn new(verifier: JwtVerifier, capacity: usize) -> Self {
        Self {
            verifier,
            capacity,
            verified: ThreadLocal::new(),
            hasher: foldhash::fast::RandomState::default(),
            verifications: metrics::counter!(crate::metrics::TOKEN_VERIFICATIONS),
        }
    }

    /// The bearer token in `authorization` (the header's value), if there is a non-empty
    /// one.
    pub fn bearer<'a>(&self, authorization: Option<&'a [u8]>) -> Option<Bearer<'a>> {
        let token = authorization.and_then(bearer_token)?;
        Some(Bearer {
            token,
            hash: self.hasher.hash_one(token),
        })
    }

    /// The caller of a token this worker thread verified before and is still valid: no
    /// signature check. `None` for any other (the caller charges those to the client's
    /// pre-limit before [`Self::check`] checks them in full).
    pub fn known(&self, bearer: Option<&Bearer<'_>>) -> Option<Arc<Caller>> {
        let bearer = bearer?;
        let verified = self.verified.get()?.borrow();
        let known = verified.find(bearer.hash, |v| bearer.names(v))?;
        (unix_now() <= known.valid_until).then(|| known.caller.clone())
    }

    /// The caller named by the bearer token in `authorization` (the header's value); on
    /// failure, the reason for logs and metrics.
    pub fn authenticate(&self, authorization: Option<&[u8]>) -> Result<Arc<Caller>, &'static str> {
        self.check(self.bearer(authorization))
    }

    /// The caller named by `bearer` ([`Self::bearer`]), remembered or checked in full; on
    /// failure, the reason for logs and metrics.
    pub fn check(&self, bearer: Option<Bearer<'_>>) -> Result<Arc<Caller>, &'static str> {
        let bearer = bearer.ok_or("missing_token")?;
        if self.capacity == 0 {
            return self.verify(bearer.token).map(|(caller, _)| caller);
        }
        let now = unix_now();
        let mut verified = self.verified.get_or_default().borrow_mut();
        if let Ok(known) = verified.find_entry(bearer.hash, |v| bearer.names(v)) {
            if now <= known.get().valid_until {
                return Ok(known.get().caller.clone());
            }
            known.remove();
        }
        let (caller, exp) = self.verify(bearer.token)?;
        if verified.len() >= self.capacity {
            verified.retain(|v| now <= v.valid_until);
            if verified.len() >= self.capacity {
                // Still full of live tokens: start over rather than track recency.
                verified.clear();
            }
        }
        verified.insert_unique(
            bearer.hash,
            Verified {
                hash: bearer.hash,
                token: bearer.token.into(),
                caller: caller.clone(),
                // The verifier's own leeway: the cache accepts exactly what it would.
                valid_until: exp.saturating_add(self.verifier.leeway_secs()),
            },
            |v| v.hash,
        );
        Ok(caller)
    }

    /// Full check of `token`: the caller and the token's `exp`.
    fn verify(&self, token: &str) -> Result<(Arc<Caller>, i64), &'static str> {
        // Counted: the cost the pre-limit bounds, visible to operators and tests.
        self.verifications.increment(1);
        let (user_id, claims) = self.verifier.verify(token).map_err(|e| e.reason())?;
        let caller = Caller {
            user_id,
            roles_joined: seckill_auth::join_roles(&claims.roles),
            roles: claims.roles,
        };
        Ok((Arc::new(caller), claims.exp))
    }

    /// Verified tokens kept on the calling thread (tests).
    pub fn cached_here(&self) -> usize {
        self.verified.get().map_or(0, |v| v.borrow().len())
    }
}

/// Now, in unix seconds.
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            i64::try_from(since.as_secs()).unwrap_or(i64::MAX)
        })
}

/// The token of an `Authorization: Bearer …` value, if there is a non-empty one.
fn bearer_token(value: &[u8]) -> Option<&str> {
    let value = std::str::from_utf8(value).ok()?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then_some(token)
}

/// The 401 for a refused token: one message whatever went wrong; `reason` goes to the log
/// and to `gateway_auth_failures_total{reason}`.
pub fn unauthorized(reason: &'static str) -> Response {
    metrics::counter!(crate::metrics::AUTH_FAILURES, "reason" => reason).increment(1);
    tracing::info!(reason, "request refused: no valid bearer token");
    let mut response = error::response(
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
    response.push_header(WWW_AUTHENTICATE, challenge.as_bytes());
    response
}

/// The 403 for a non-admin on an admin route.
pub fn forbidden() -> Response {
    metrics::counter!(crate::metrics::AUTH_FAILURES, "reason" => "not_admin").increment(1);
    let mut response = error::response(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this action needs the admin role",
    );
    response.push_header(
        WWW_AUTHENTICATE,
        b"Bearer realm=\"seckill\", error=\"insufficient_scope\"",
    );
    response
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use seckill_auth::TokenMinter;

    use super::*;

    const SECRET: &str = "a-test-secret-of-32-bytes-length";

    fn authenticator(leeway_secs: u64, capacity: usize) -> Authenticator {
        let rules = ClaimRules {
            issuers: vec![],
            audiences: vec![],
            leeway_secs,
        };
        let verifier =
            JwtVerifier::new(JwtAlgorithm::HS256, SECRET.as_bytes(), &rules).expect("verifier");
        Authenticator::new(verifier, capacity)
    }

    fn bearer(token: &str) -> Option<Vec<u8>> {
        Some(format!("Bearer {token}").into_bytes())
    }

    #[test]
    fn a_verified_token_is_remembered_and_names_the_same_caller() {
        let auth = authenticator(5, 100);
        let token = TokenMinter::new(SECRET).mint(7, &["admin"], 60);
        let first = auth
            .authenticate(bearer(&token).as_deref())
            .expect("verifies");
        assert_eq!(auth.cached_here(), 1);
        let second = auth
            .authenticate(bearer(&token).as_deref())
            .expect("remembered");
        assert!(
            Arc::ptr_eq(&first, &second),
            "the second response came from the cache"
        );
        assert_eq!((second.user_id, second.is_admin()), (7, true));
    }

    #[test]
    fn a_remembered_token_is_refused_once_it_expires() {
        let auth = authenticator(0, 100);
        let token = TokenMinter::new(SECRET).mint(8, &[], 1);
        assert!(auth.authenticate(bearer(&token).as_deref()).is_ok());
        assert_eq!(auth.cached_here(), 1);
        // Polled: the token expires within two seconds of its minting.
        let deadline = Instant::now() + Duration::from_secs(5);
        let refusal = loop {
            match auth.authenticate(bearer(&token).as_deref()) {
                Err(reason) => break reason,
                Ok(_) => assert!(Instant::now() < deadline, "never refused"),
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(refusal, "expired");
        assert_eq!(auth.cached_here(), 0, "the expired entry is gone");
    }

    #[test]
    fn refused_tokens_are_never_remembered_and_the_cache_stays_bounded() {
        let auth = authenticator(5, 2);
        let other = TokenMinter::new("another-secret-of-32-bytes-long!").mint(9, &[], 60);
        for bad in ["garbage", other.as_str()] {
            assert!(auth.authenticate(bearer(bad).as_deref()).is_err());
        }
        assert_eq!(auth.cached_here(), 0);
        assert_eq!(auth.authenticate(None).err(), Some("missing_token"));
        let minter = TokenMinter::new(SECRET);
        for user in 1..=5 {
            let token = minter.mint(user, &[], 60);
            assert_eq!(
                auth.authenticate(bearer(&token).as_deref())
                    .expect("ok")
                    .user_id,
                user
            );
            assert!(auth.cached_here() <= 2);
        }
    }

    #[test]
    fn a_bearer_token_never_shows_in_debug_output() {
        let auth = authenticator(5, 100);
        let token = TokenMinter::new(SECRET).mint(11, &[], 60);
        let header = bearer(&token);
        let read = auth.bearer(header.as_deref()).expect("a bearer token");
        let shown = format!("{read:?}");
        assert!(!shown.contains(&token[..20]), "{shown}");
        assert!(shown.contains("Bearer"), "{shown}");
    }

    #[test]
    fn with_no_capacity_nothing_is_remembered() {
        let auth = authenticator(5, 0);
        let token = TokenMinter::new(SECRET).mint(10, &[], 60);
        assert!(auth.authenticate(bearer(&token).as_deref()).is_ok());
        assert!(auth.authenticate(bearer(&token).as_deref()).is_ok());
        assert_eq!(auth.cached_here(), 0);
    }
}
