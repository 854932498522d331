//! Who is calling: JWT claims verified at the gateway, and the signed identity the gateway
//! hands to backends.
//!
//! Layout:
//! - [`jwt`] — claims, the verifier pinned to one configured algorithm (HS256, RS256 or
//!   EdDSA) with its `exp`/`nbf`/`iat`/`iss`/`aud` rules, and token minting (scripts, tests).
//! - [`identity`] — the gateway → backend credential, an HMAC over the caller, the time and
//!   the request it is for, and the middleware and extractors backends check it with.
//!   Behind the default feature `identity`, the only part that needs axum: without it the
//!   crate is the JWT check alone (what the HS256 fuzz target builds).
//!
//! Why an HMAC and not "backends verify the JWT": backends then never need the public JWT
//! configuration (issuers, keys, rotation), a client that reaches a backend directly cannot
//! act as anyone, and the check costs one SHA-256.

#[cfg(feature = "identity")]
pub mod identity;
pub mod jwt;

#[cfg(feature = "identity")]
pub use identity::{
    AdminIdentity, Identity, IdentitySigner, IdentityVerifier, RequestFacts, join_roles, verified,
};
pub use jwt::{ClaimRules, Claims, JwtAlgorithm, JwtVerifier, TokenError, TokenMinter, mint_token};
