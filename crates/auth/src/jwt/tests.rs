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

/// The HS256 path (`hs256.rs`) against jsonwebtoken's `decode` on tokens built to reach
/// each of its branches: every header × every payload × every signature × four sets of
/// rules, each token twice (a header is remembered after a token with it verifies). Same
/// verdict, same claims, same reason.
#[test]
fn the_hs256_path_gives_jsonwebtokens_verdicts() {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;

    const SECRET: &str = "a-differential-test-secret-32-by";
    let t = now();
    // No value within a minute of a bound: the two paths read the clock separately.
    let times = [
        json!(null),
        json!(-5),
        json!(0),
        json!(t - 7200),
        json!(t - 10),
        json!(t + 7200),
        json!(1.5),
        json!(1e20),
        json!("1999999999"),
        json!(u64::MAX),
        json!(true),
    ];
    let names = |accepted: &str| {
        vec![
            json!(null),
            json!(accepted),
            json!("someone-else"),
            json!([accepted, "x"]),
            json!(["x", "y"]),
            json!([]),
            json!([1]),
            json!([accepted, 1]),
            json!(5),
            json!({ "a": accepted }),
        ]
    };
    let base = json!({"sub": "42", "exp": t + 7200, "iat": t - 5, "roles": ["admin"],
        "iss": "issuer-a", "aud": "audience-a"});
    let mut payloads: Vec<String> = vec![base.to_string()];
    let mut vary = |claim: &str, values: &[Value]| {
        for value in values {
            let mut payload = base.clone();
            match value {
                // Absent rather than null.
                Value::Bool(false) => {
                    payload.as_object_mut().expect("object").remove(claim);
                }
                value => payload[claim] = value.clone(),
            }
            payloads.push(payload.to_string());
        }
    };
    let absent = json!(false);
    vary(
        "sub",
        &[
            absent.clone(),
            json!(null),
            json!("0"),
            json!("-1"),
            json!("alice"),
            json!(""),
            json!(42),
            json!("9223372036854775808"),
            json!(["42"]),
        ],
    );
    vary("exp", &[&[absent.clone()][..], &times].concat());
    vary("nbf", &times);
    vary("iat", &times);
    vary(
        "roles",
        &[
            absent.clone(),
            json!(null),
            json!([]),
            json!(["a", "b"]),
            json!([1]),
            json!("admin"),
            json!({}),
        ],
    );
    vary("iss", &[&[absent.clone()][..], &names("issuer-a")].concat());
    vary(
        "aud",
        &[&[absent.clone()][..], &names("audience-a")].concat(),
    );
    payloads.extend([
        // Escapes, repeats, whitespace, other JSON, not JSON.
        format!(r#"{{"sub":"4\u0032","exp":{}}}"#, t + 7200),
        format!(r#"{{"sub":"1","sub":"2","exp":{}}}"#, t + 7200),
        format!(r#"{{"sub":"1","exp":{0},"exp":{0}}}"#, t + 7200),
        format!(
            r#"{{"sub":"1","exp":{},"iss":"issuer-a","iss":"issuer-a"}}"#,
            t + 7200
        ),
        format!(
            r#"{{"sub":"1","exp":{},"aud":"audience-a","aud":"x"}}"#,
            t + 7200
        ),
        format!(r#"{{"sub":"1","exp":{},"iat":1,"iat":2}}"#, t + 7200),
        format!(r#"  {{"sub":"1","exp":{}}}  "#, t + 7200),
        format!(r#"{{"sub":"1","exp":{}}} x"#, t + 7200),
        format!(
            r#"{{"sub":"1","exp":{},"extra":{{"deep":[1,2,{{}}]}}}}"#,
            t + 7200
        ),
        format!(r#"["42",{}]"#, t + 7200),
        format!(r#"[{},null,"42"]"#, t + 7200),
        format!(r#"{{"sub":"1","exp":{},"iss":["issuer-a"}}"#, t + 7200),
        format!(
            r#"{{"sub":"1","exp":{},"aud":{{"x":["audience-a"}}}}"#,
            t + 7200
        ),
        format!(
            r#"{{"sub":"1","exp":{},"iss":{}1{}}}"#,
            t + 7200,
            "[".repeat(200),
            "]".repeat(200)
        ),
        r#"{"sub":"1","exp":{"sub":"2"},"nbf":[1,2]}"#.to_string(),
        r#"{"exp":{"x":1},"sub":"1"}"#.to_string(),
        "[]".into(),
        "null".into(),
        "5".into(),
        r#""text""#.into(),
        "{".into(),
        String::new(),
    ]);
    let headers: Vec<String> = [
        r#"{"alg":"HS256","typ":"JWT"}"#,
        r#"{"typ":"JWT","alg":"HS256"}"#,
        r#"{"alg":"HS256"}"#,
        r#"{"alg":"HS256","kid":"k1","typ":"at+jwt"}"#,
        // More good headers than the path remembers: the fifth and sixth are read each time.
        r#"{"alg":"HS256","kid":"k2"}"#,
        r#"{"kid":"k3","cty":"JWT","alg":"HS256"}"#,
        r#"{"alg":"HS256","typ":5}"#,
        r#"{"alg":"HS256","alg":"HS256"}"#,
        r#"{"alg":"HS384"}"#,
        r#"{"alg":"RS256"}"#,
        r#"{"alg":"none"}"#,
        r#"{"alg":"hs256"}"#,
        r#"{}"#,
        r#"["HS256"]"#,
        "not json",
    ]
    .map(String::from)
    .into();
    let sign = |message: &str, secret: &str| {
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
        mac.update(message.as_bytes());
        B64.encode(mac.finalize().into_bytes())
    };
    let rule_sets = [
        rules(&[], &[]),
        // The largest leeway the gateway's settings take.
        ClaimRules {
            leeway_secs: 3600,
            ..rules(&["issuer-a"], &[])
        },
        rules(&["issuer-a", "issuer-b"], &[]),
        rules(&[], &["audience-a"]),
        rules(&["issuer-a"], &["audience-a"]),
    ];
    let (mut compared, mut accepted) = (0, 0);
    for rules in &rule_sets {
        let verifier =
            JwtVerifier::new(JwtAlgorithm::HS256, SECRET.as_bytes(), rules).expect("hs256");
        assert!(verifier.hs256.is_some(), "the HS256 path is the one tested");
        for header in &headers {
            for payload in &payloads {
                let message = format!("{}.{}", B64.encode(header), B64.encode(payload));
                let good = sign(&message, SECRET);
                let tokens = [
                    format!("{message}.{good}"),
                    format!("{message}.{}", sign(&message, "another-secret")),
                    format!("{message}.{good}="),
                    format!("{message}.{}", &good[..good.len() - 2]),
                    format!("{message}."),
                    format!("{message}.{good}.{good}"),
                    format!("x.{message}.{good}"),
                    message.clone(),
                    format!("{}.{good}", B64.encode(payload)),
                ];
                for token in &tokens {
                    for _ in 0..2 {
                        let fast = verifier.verify(token);
                        let reference = verifier.verify_with_jsonwebtoken(token);
                        assert_eq!(
                            fast, reference,
                            "{rules:?}: header {header} payload {payload} token {token}"
                        );
                        accepted += usize::from(fast.is_ok());
                        compared += 1;
                    }
                }
            }
        }
    }
    // The corpus reaches acceptance under every rule set, and far more refusals.
    assert!(accepted >= 5 * 8, "{accepted} accepted of {compared}");
    assert!(
        compared > 10 * accepted,
        "{accepted} accepted of {compared}"
    );
}
