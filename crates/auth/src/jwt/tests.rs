//! Each refusal maps to its reason; RS256 and EdDSA keys come from the gateway's test-only
//! fixtures (`gateway/tests/fixtures/README.md`).

use serde_json::{Value, json};

use super::*;

const RS256_PUBLIC: &[u8] = include_bytes!("../../../../gateway/tests/fixtures/rs256_public.pem");
const RS256_PRIVATE: &[u8] = include_bytes!("../../../../gateway/tests/fixtures/rs256_private.pem");
const ED25519_PUBLIC: &[u8] =
    include_bytes!("../../../../gateway/tests/fixtures/ed25519_public.pem");
const ED25519_PRIVATE: &[u8] =
    include_bytes!("../../../../gateway/tests/fixtures/ed25519_private.pem");

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn hs256(claims: &Value, secret: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("encode")
}

fn rules(issuers: &[&str], audiences: &[&str]) -> ClaimRules {
    ClaimRules {
        issuers: issuers.iter().map(|s| s.to_string()).collect(),
        audiences: audiences.iter().map(|s| s.to_string()).collect(),
        leeway_secs: 5,
    }
}

fn verifier(rules: &ClaimRules) -> JwtVerifier {
    JwtVerifier::new(JwtAlgorithm::HS256, b"s3cret", rules).expect("hs256")
}

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
fn a_token_signed_with_another_secret_is_refused_as_a_bad_signature() {
    let token = mint_token("other", 42, &[], 60);
    assert_eq!(
        JwtVerifier::hs256("s3cret", 0).verify(&token),
        Err(TokenError::BadSignature)
    );
}

#[test]
fn an_expired_token_is_refused() {
    let token = mint_token("s3cret", 42, &[], -120);
    assert_eq!(
        JwtVerifier::hs256("s3cret", 5).verify(&token),
        Err(TokenError::Expired)
    );
}

#[test]
fn an_unsigned_alg_none_token_is_refused() {
    // header {"alg":"none","typ":"JWT"}, payload {"sub":"1","exp":9999999999}
    let token = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxIiwiZXhwIjo5OTk5OTk5OTk5fQ.";
    assert_eq!(
        JwtVerifier::hs256("s3cret", 0).verify(token),
        Err(TokenError::Malformed)
    );
}

#[test]
fn a_non_numeric_subject_is_refused() {
    let token = hs256(&json!({"sub": "alice", "exp": now() + 60}), "s3cret");
    assert_eq!(
        JwtVerifier::hs256("s3cret", 0).verify(&token),
        Err(TokenError::BadSubject)
    );
}

#[test]
fn time_claims_are_checked_with_the_leeway() {
    let v = verifier(&rules(&[], &[]));
    let t = now();
    let cases = [
        (
            json!({"sub": "1", "exp": t + 60, "nbf": t + 60}),
            Err(TokenError::NotYetValid),
        ),
        (json!({"sub": "1", "exp": t + 60, "nbf": t + 3}), Ok(1)),
        (
            json!({"sub": "1", "exp": t + 600, "iat": t + 300}),
            Err(TokenError::IssuedInFuture),
        ),
        (json!({"sub": "1", "exp": t + 60, "iat": t + 3}), Ok(1)),
        (json!({"sub": "1", "exp": t - 3}), Ok(1)),
        (json!({"sub": "1"}), Err(TokenError::MissingClaim)),
        (json!({"exp": t + 60}), Err(TokenError::MissingClaim)),
        (
            json!({"sub": "1", "exp": "soon"}),
            Err(TokenError::Malformed),
        ),
    ];
    for (claims, expected) in cases {
        let got = v.verify(&hs256(&claims, "s3cret")).map(|(id, _)| id);
        assert_eq!(got, expected, "claims {claims}");
    }
}

#[test]
fn a_minter_with_issuer_and_audience_passes_a_verifier_that_requires_them() {
    let strict = verifier(&rules(&["https://idp.example"], &["seckill"]));
    // The gateway's settings are comma-separated lists; the first entry is minted.
    let scoped = TokenMinter::new("s3cret")
        .issuer("https://idp.example,https://other.example")
        .audience(" seckill , spare");
    let (user, claims) = strict
        .verify(&scoped.mint(9, &["admin"], 60))
        .expect("scoped token");
    assert_eq!((user, claims.roles), (9, vec!["admin".to_string()]));
    // Without them, or with another audience, the same verifier refuses.
    assert_eq!(
        strict.verify(&mint_token("s3cret", 9, &[], 60)),
        Err(TokenError::MissingClaim)
    );
    let elsewhere = TokenMinter::new("s3cret")
        .issuer("https://idp.example")
        .audience("other");
    assert_eq!(
        strict.verify(&elsewhere.mint(9, &[], 60)),
        Err(TokenError::WrongAudience)
    );
    // An empty value means "no claim", as in the gateway's settings.
    let blank = TokenMinter::new("s3cret").issuer("").audience("  ");
    assert_eq!(
        verifier(&rules(&[], &[]))
            .verify(&blank.mint(9, &[], 60))
            .map(|(id, _)| id),
        Ok(9)
    );
    assert_eq!(
        strict.verify(&blank.mint(9, &[], 60)),
        Err(TokenError::MissingClaim)
    );
}

#[test]
fn issuer_and_audience_are_required_and_checked_only_when_configured() {
    let t = now();
    let strict = verifier(&rules(&["https://idp.example"], &["seckill"]));
    let cases = [
        (
            json!({"iss": "https://idp.example", "aud": "seckill"}),
            Ok(7),
        ),
        (
            json!({"iss": "https://idp.example", "aud": ["other", "seckill"]}),
            Ok(7),
        ),
        (
            json!({"iss": "https://evil.example", "aud": "seckill"}),
            Err(TokenError::WrongIssuer),
        ),
        (
            json!({"iss": "https://idp.example", "aud": "other"}),
            Err(TokenError::WrongAudience),
        ),
        (json!({"aud": "seckill"}), Err(TokenError::MissingClaim)),
        (
            json!({"iss": "https://idp.example"}),
            Err(TokenError::MissingClaim),
        ),
    ];
    for (extra, expected) in cases {
        let mut claims = json!({"sub": "7", "exp": t + 60});
        for (k, v) in extra.as_object().expect("object") {
            claims[k] = v.clone();
        }
        let got = strict.verify(&hs256(&claims, "s3cret")).map(|(id, _)| id);
        assert_eq!(got, expected, "claims {claims}");
    }
    // Unconfigured: whatever `iss`/`aud` a token carries is not ours to judge.
    let lax = verifier(&rules(&[], &[]));
    let claims = json!({"sub": "7", "exp": t + 60, "iss": "x", "aud": "y"});
    assert_eq!(
        lax.verify(&hs256(&claims, "s3cret")).map(|(id, _)| id),
        Ok(7)
    );
}

#[test]
fn rs256_and_eddsa_tokens_verify_with_their_public_keys() {
    let t = now();
    let claims = json!({"sub": "9", "exp": t + 60});
    let rs = encode(
        &Header::new(Algorithm::RS256),
        &claims,
        &EncodingKey::from_rsa_pem(RS256_PRIVATE).expect("rsa private"),
    )
    .expect("encode");
    let ed = encode(
        &Header::new(Algorithm::EdDSA),
        &claims,
        &EncodingKey::from_ed_pem(ED25519_PRIVATE).expect("ed private"),
    )
    .expect("encode");
    let rules = rules(&[], &[]);
    let rs_verifier = JwtVerifier::new(JwtAlgorithm::RS256, RS256_PUBLIC, &rules).expect("rsa");
    let ed_verifier = JwtVerifier::new(JwtAlgorithm::EdDSA, ED25519_PUBLIC, &rules).expect("ed");
    assert_eq!(rs_verifier.verify(&rs).map(|(id, _)| id), Ok(9));
    assert_eq!(ed_verifier.verify(&ed).map(|(id, _)| id), Ok(9));
    // Each is pinned: the other's token is refused before any key is tried.
    assert_eq!(rs_verifier.verify(&ed), Err(TokenError::WrongAlgorithm));
    assert_eq!(ed_verifier.verify(&rs), Err(TokenError::WrongAlgorithm));
}

#[test]
fn an_hs256_token_keyed_with_the_rsa_public_key_is_refused_by_an_rs256_verifier() {
    // Algorithm confusion: the public key is public, so an attacker can HMAC with it.
    let token = encode(
        &Header::new(Algorithm::HS256),
        &json!({"sub": "1", "exp": now() + 60, "roles": ["admin"]}),
        &EncodingKey::from_secret(RS256_PUBLIC),
    )
    .expect("encode");
    let verifier =
        JwtVerifier::new(JwtAlgorithm::RS256, RS256_PUBLIC, &rules(&[], &[])).expect("rsa");
    assert_eq!(verifier.verify(&token), Err(TokenError::WrongAlgorithm));
}

#[test]
fn a_private_or_mismatched_key_is_refused_at_construction() {
    let rules = rules(&[], &[]);
    assert!(matches!(
        JwtVerifier::new(JwtAlgorithm::RS256, RS256_PRIVATE, &rules),
        Err(KeyError::PrivateKey(JwtAlgorithm::RS256))
    ));
    assert!(matches!(
        JwtVerifier::new(JwtAlgorithm::RS256, ED25519_PUBLIC, &rules),
        Err(KeyError::Invalid { .. })
    ));
    assert!(matches!(
        JwtVerifier::new(JwtAlgorithm::EdDSA, RS256_PUBLIC, &rules),
        Err(KeyError::Invalid { .. })
    ));
    assert!(matches!(
        JwtVerifier::new(JwtAlgorithm::EdDSA, b"not a pem", &rules),
        Err(KeyError::Invalid { .. })
    ));
}

#[test]
fn algorithm_names_parse_as_configured() {
    for (text, algorithm) in [
        ("\"HS256\"", JwtAlgorithm::HS256),
        ("\"rs256\"", JwtAlgorithm::RS256),
        ("\"EdDSA\"", JwtAlgorithm::EdDSA),
    ] {
        assert_eq!(
            serde_json::from_str::<JwtAlgorithm>(text).expect(text),
            algorithm
        );
    }
    assert!(serde_json::from_str::<JwtAlgorithm>("\"none\"").is_err());
}
