//! HS256 tokens checked with the verdicts of jsonwebtoken's `decode` under the verifier's
//! `Validation` (the differential test in `tests.rs` and the `jwt_hs256` fuzz target hold
//! it to them), at a fraction of the cost.
//!
//! A gateway flooded by buyers it has never seen verifies a new token on every request, and
//! `decode` was a fifth of its CPU there: it reads the header twice and keys a new HMAC for
//! each token. Here the HMAC is keyed once and a header is recognised by its bytes once a
//! token carrying it has verified. The payload is read twice, as `decode` reads it: once
//! into the platform's claims, strictly, and once for the registered claims the rules
//! check, where a claim of an unexpected type only counts as unreadable — two readings
//! whose quirks (a read that fails half-way through a value and goes on) cannot be had
//! from one.
//!
//! What `decode` does, and so what this does, in order:
//! 1. the token is `header.payload.signature` split at its last two dots; the header is
//!    base64url (no padding) JSON that jsonwebtoken's `Header` reads, whose `alg` must be
//!    HS256 ([`TokenError::WrongAlgorithm`]);
//! 2. the signature, base64url, is HMAC-SHA256 of `header.payload` under the secret
//!    (compared in constant time);
//! 3. the payload, base64url, reads as the platform's claims ([`super::WireClaims`]: `sub`
//!    a string, `exp`, `iat`, `nbf` integers, `roles` strings) and as [`Registered`];
//! 4. `exp` and `sub` are required, and `iss` and `aud` when configured; `exp` and `nbf`
//!    must be non-negative numbers (an unreadable `nbf` is malformed), `iss` and `aud` a
//!    string or an array of strings;
//! 5. `exp` must not be before now less the leeway, `nbf` not after now plus it (a leeway
//!    beyond the epoch's age, where `decode`'s unsigned arithmetic overflows, saturates
//!    here: the gateway's settings refuse one over an hour);
//! 6. a configured `iss` (`aud`): the token's one value, or one of its array, is accepted.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::sync::OnceLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use serde::de::{self, Visitor};
use sha2::Sha256;

use super::{ClaimRules, Claims, TokenError, WireClaims};

/// Headers remembered once a token carrying them verified: an issuer uses one or a few.
const HEADERS_KEPT: usize = 4;

/// An HS256 key and the claim rules, ready for [`Hs256::verify`].
#[derive(Clone)]
pub(super) struct Hs256 {
    mac: Hmac<Sha256>,
    headers: [OnceLock<Box<str>>; HEADERS_KEPT],
    issuers: Vec<String>,
    audiences: Vec<String>,
    leeway: u64,
}

/// The registered claims as jsonwebtoken reads them to validate a token: each one whose
/// value is not of the expected type is [`Read::Unreadable`] instead of failing the read
/// (the read goes on from wherever that value's left it). Fields in jsonwebtoken's order,
/// which matters for a payload that is an array.
#[derive(Deserialize)]
struct Registered<'a> {
    #[serde(default, deserialize_with = "number")]
    exp: Read<u64>,
    #[serde(default, deserialize_with = "number")]
    nbf: Read<u64>,
    // No `default` on these three, as jsonwebtoken has it: an absent one is read as `null`
    // from an object, and is missing (a failed read) from an array.
    #[serde(borrow)]
    sub: Read<Cow<'a, str>>,
    #[serde(borrow)]
    iss: Read<Names<'a>>,
    #[serde(borrow)]
    aud: Read<Names<'a>>,
}

/// One registered claim.
#[derive(Default)]
enum Read<T> {
    Value(T),
    Unreadable,
    #[default]
    Absent,
}

impl<T> Read<T> {
    fn is_value(&self) -> bool {
        matches!(self, Self::Value(_))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Read<T> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(deserializer) {
            Ok(Some(value)) => Self::Value(value),
            Ok(None) => Self::Absent,
            Err(_) => Self::Unreadable,
        })
    }
}

/// `exp`, `nbf`: a non-negative integer, or a float that rounds to a `u64`; anything else
/// (a negative integer and `null` included) is unreadable.
fn number<'de, D: de::Deserializer<'de>>(deserializer: D) -> Result<Read<u64>, D::Error> {
    struct Number;
    impl Visitor<'_> for Number {
        type Value = Read<u64>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a number of seconds")
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Self::Value, E> {
            Ok(Read::Value(value))
        }

        fn visit_f64<E: de::Error>(self, value: f64) -> Result<Self::Value, E> {
            #[allow(clippy::cast_precision_loss)]
            let within = value.is_finite() && value >= 0.0 && value < u64::MAX as f64;
            if within {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                return Ok(Read::Value(value.round() as u64));
            }
            Err(E::custom("not a number of seconds"))
        }
    }
    Ok(deserializer
        .deserialize_any(Number)
        .unwrap_or(Read::Unreadable))
}

/// An `iss` or `aud` value: one string, or a set of them.
#[derive(Deserialize)]
#[serde(untagged)]
enum Names<'a> {
    One(#[serde(borrow)] Cow<'a, str>),
    Many(#[serde(borrow)] HashSet<Name<'a>>),
}

#[derive(Deserialize, PartialEq, Eq, Hash)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

impl Names<'_> {
    /// Whether the value names one of `accepted`.
    fn any_of(&self, accepted: &[String]) -> bool {
        let named = |name: &str| accepted.iter().any(|a| a == name);
        match self {
            Self::One(name) => named(name),
            Self::Many(names) => names.iter().any(|n| named(&n.0)),
        }
    }
}

impl Hs256 {
    pub(super) fn new(secret: &[u8], rules: &ClaimRules) -> Self {
        Self {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes a key of any length"),
            headers: Default::default(),
            issuers: rules.issuers.clone(),
            audiences: rules.audiences.clone(),
            leeway: rules.leeway_secs,
        }
    }

    /// Checks `token` at `now` (seconds since the epoch): its claims, or why not.
    pub(super) fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let (message, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (header, payload) = message.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let known = self.knows(header);
        if !known {
            let read = jsonwebtoken::decode_header(token).map_err(|e| TokenError::from_jwt(&e))?;
            if read.alg != jsonwebtoken::Algorithm::HS256 {
                return Err(TokenError::WrongAlgorithm);
            }
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac.clone();
        mac.update(message.as_bytes());
        mac.verify_slice(&signature)
            .map_err(|_| TokenError::BadSignature)?;
        let claims = self.claims(payload, now)?;
        if !known {
            // Only a token signed with the secret teaches a header: no one else can crowd
            // the ones the issuer uses out.
            self.remember(header);
        }
        Ok(claims)
    }

    fn knows(&self, header: &str) -> bool {
        self.headers
            .iter()
            .map_while(OnceLock::get)
            .any(|kept| **kept == *header)
    }

    fn remember(&self, header: &str) {
        for slot in &self.headers {
            match slot.get() {
                Some(kept) if **kept == *header => return,
                Some(_) => {}
                None => {
                    // Lost to another thread: done if it kept the same header, else the
                    // next free slot takes this one.
                    if slot.set(header.into()).is_ok() || slot.get().is_some_and(|k| **k == *header)
                    {
                        return;
                    }
                }
            }
        }
    }

    fn claims(&self, payload: &str, now: u64) -> Result<Claims, TokenError> {
        let json = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed)?;
        let wire: WireClaims = serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
        let registered: Registered<'_> =
            serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
        let required =
            |names: &Read<Names<'_>>, accepted: &[String]| accepted.is_empty() || names.is_value();
        if !registered.exp.is_value()
            || !registered.sub.is_value()
            || !required(&registered.iss, &self.issuers)
            || !required(&registered.aud, &self.audiences)
        {
            return Err(TokenError::MissingClaim);
        }
        if matches!(registered.nbf, Read::Unreadable) {
            return Err(TokenError::Malformed);
        }
        if matches!(registered.exp, Read::Value(exp) if exp < now.saturating_sub(self.leeway)) {
            return Err(TokenError::Expired);
        }
        if matches!(registered.nbf, Read::Value(nbf) if nbf > now.saturating_add(self.leeway)) {
            return Err(TokenError::NotYetValid);
        }
        let accepted = |names: &Read<Names<'_>>, accepted: &[String]| match names {
            Read::Value(names) => accepted.is_empty() || names.any_of(accepted),
            // Required, and so present, when configured.
            Read::Unreadable | Read::Absent => true,
        };
        if !accepted(&registered.iss, &self.issuers) {
            return Err(TokenError::WrongIssuer);
        }
        if !accepted(&registered.aud, &self.audiences) {
            return Err(TokenError::WrongAudience);
        }
        wire.into_claims()
    }
}
