//! Hostile tokens against RS256 and EdDSA configurations: every one refused with the same
//! 401, counted under its reason, and none reaching a backend.

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

use seckill_auth::JwtAlgorithm;

use crate::echo::{Echo, Gateway, seen_headers, settings, spawn_echo, spawn_gateway};

const RS256_PUBLIC: &[u8] = include_bytes!("../fixtures/rs256_public.pem");
const RS256_PRIVATE: &[u8] = include_bytes!("../fixtures/rs256_private.pem");
const RS256_OTHER_PRIVATE: &[u8] = include_bytes!("../fixtures/rs256_other_private.pem");
const ED25519_PUBLIC: &str = include_str!("../fixtures/ed25519_public.pem");
const ED25519_PRIVATE: &[u8] = include_bytes!("../fixtures/ed25519_private.pem");
const ED25519_OTHER_PRIVATE: &[u8] = include_bytes!("../fixtures/ed25519_other_private.pem");

const ISSUER: &str = "https://idp.test";
const AUDIENCE: &str = "seckill";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims the RS256 gateway below accepts, for `sub`, with `changes` applied (`null` drops).
fn claims(sub: &str, changes: Value) -> Value {
    let mut claims = json!({
        "sub": sub, "iss": ISSUER, "aud": AUDIENCE,
        "iat": now(), "nbf": now() - 10, "exp": now() + 600,
    });
    for (k, v) in changes.as_object().expect("object") {
        if v.is_null() {
            claims.as_object_mut().expect("object").remove(k);
        } else {
            claims[k] = v.clone();
        }
    }
    claims
}

fn sign(algorithm: Algorithm, key: &EncodingKey, claims: &Value) -> String {
    encode(&Header::new(algorithm), claims, key).expect("encode")
}

fn rs256(claims: &Value) -> String {
    let key = EncodingKey::from_rsa_pem(RS256_PRIVATE).expect("rsa key");
    sign(Algorithm::RS256, &key, claims)
}

fn eddsa(private: &[u8], claims: &Value) -> String {
    let key = EncodingKey::from_ed_pem(private).expect("ed key");
    sign(Algorithm::EdDSA, &key, claims)
}

async fn rs256_gateway(echo: &Echo) -> Gateway {
    spawn_gateway(gateway::Settings {
        jwt_algorithm: JwtAlgorithm::RS256,
        jwt_public_key_file: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/rs256_public.pem"
        )
        .into(),
        jwt_issuers: vec![ISSUER.into()],
        jwt_audiences: vec![AUDIENCE.into()],
        ..settings(&echo.url)
    })
    .await
}

/// Sends `token` and checks the one 401 every refusal gets; returns its message.
async fn assert_refused(gateway: &Gateway, token: &str, what: &str) -> String {
    let response = gateway
        .post("/api/seckill/1")
        .bearer_auth(token)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 401, "{what}");
    let challenge = response
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(
        challenge.starts_with("Bearer") && challenge.contains("error=\"invalid_token\""),
        "{what}: WWW-Authenticate {challenge:?}"
    );
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "unauthorized", "{what}");
    body["message"].as_str().expect("message").to_string()
}

#[tokio::test]
async fn every_hostile_token_gets_the_same_401_and_none_reaches_a_backend() {
    let echo = spawn_echo().await;
    let gateway = rs256_gateway(&echo).await;

    let valid = rs256(&claims("5", json!({})));
    let (header, _) = valid.split_once('.').expect("jwt");
    let admin_payload = rs256(&claims("1", json!({"roles": ["admin"]})));
    let admin_payload = admin_payload.split('.').nth(1).expect("payload");
    let signature = valid.rsplit('.').next().expect("signature");
    let other_key = EncodingKey::from_rsa_pem(RS256_OTHER_PRIVATE).expect("rsa key");

    let attacks: Vec<(&str, String, &str)> = vec![
        (
            "alg none",
            // {"alg":"none","typ":"JWT"} . {"sub":"5","exp":9999999999} . (no signature)
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiI1IiwiZXhwIjo5OTk5OTk5OTk5fQ.".into(),
            "malformed",
        ),
        (
            "HS256 keyed with the RS256 public key (algorithm confusion)",
            sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(RS256_PUBLIC),
                &claims("1", json!({"roles": ["admin"]})),
            ),
            "wrong_algorithm",
        ),
        (
            "signed by another RSA key",
            sign(Algorithm::RS256, &other_key, &claims("5", json!({}))),
            "bad_signature",
        ),
        (
            "expired",
            rs256(&claims(
                "5",
                json!({"exp": now() - 600, "iat": now() - 1200}),
            )),
            "expired",
        ),
        (
            "nbf in the future",
            rs256(&claims("5", json!({"nbf": now() + 600}))),
            "not_yet_valid",
        ),
        (
            "iat in the future",
            rs256(&claims("5", json!({"iat": now() + 600}))),
            "issued_in_future",
        ),
        (
            "wrong issuer",
            rs256(&claims("5", json!({"iss": "https://evil.test"}))),
            "wrong_issuer",
        ),
        (
            "wrong audience",
            rs256(&claims("5", json!({"aud": "another-service"}))),
            "wrong_audience",
        ),
        (
            "no audience",
            rs256(&claims("5", json!({"aud": null}))),
            "missing_claim",
        ),
        (
            "no exp",
            rs256(&claims("5", json!({"exp": null}))),
            "missing_claim",
        ),
        (
            "tampered payload (user 1, admin) under user 5's signature",
            format!("{header}.{admin_payload}.{signature}"),
            "bad_signature",
        ),
        (
            // 342 base64url characters of signature, 332 left: still clean base64 (a
            // multiple of 4), so this is the signature check refusing it, every time.
            "truncated signature",
            valid[..valid.len() - 10].to_string(),
            "bad_signature",
        ),
        (
            // A cut that leaves stray bits is refused earlier, as not even base64.
            "truncated mid-character",
            format!("{}x", &valid[..valid.len() - 10]),
            "malformed",
        ),
        (
            "two parts",
            format!("{header}.{admin_payload}"),
            "malformed",
        ),
        ("garbage", "not-a-jwt".into(), "malformed"),
    ];
    let mut messages = Vec::new();
    for (what, token, reason) in &attacks {
        let before = gateway
            .metric("gateway_auth_failures_total", &[("reason", reason)])
            .await;
        messages.push(assert_refused(&gateway, token, what).await);
        let after = gateway
            .metric("gateway_auth_failures_total", &[("reason", reason)])
            .await;
        assert!(
            after > before,
            "{what}: reason {reason} not counted ({before} -> {after})"
        );
    }
    messages.dedup();
    assert_eq!(
        messages.len(),
        1,
        "one message whatever the reason: {messages:?}"
    );
    assert_eq!(echo.hits(), 0, "a refused token reached the backend");

    // The control: the same gateway lets the valid token through as user 5.
    let response = gateway
        .post("/api/seckill/1")
        .bearer_auth(&valid)
        .send()
        .await
        .expect("request");
    let seen = seen_headers(response).await;
    assert_eq!(seen["x-user-id"], "5");
    assert_eq!(echo.hits(), 1);
}

#[tokio::test]
async fn a_missing_token_is_told_to_authenticate_without_an_error_code() {
    let echo = spawn_echo().await;
    let gateway = rs256_gateway(&echo).await;
    let response = gateway.get("/api/orders").send().await.expect("request");
    assert_eq!(response.status(), 401);
    assert_eq!(
        response.headers()["www-authenticate"],
        "Bearer realm=\"seckill\""
    );
    assert_eq!(echo.hits(), 0);
}

#[tokio::test]
async fn admin_routes_need_the_admin_role_and_identity_headers_come_from_the_token() {
    let echo = spawn_echo().await;
    let gateway = rs256_gateway(&echo).await;

    let user = rs256(&claims("7", json!({})));
    let response = gateway
        .post("/admin/products")
        .bearer_auth(&user)
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 403);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["code"], "forbidden");
    assert_eq!(echo.hits(), 0);

    // A user claiming someone else's identity in headers is forwarded as themselves.
    let response = gateway
        .post("/api/seckill/1")
        .bearer_auth(&user)
        .header("x-user-id", "999")
        .header("x-user-roles", "admin")
        .header("x-identity-sig", "forged")
        .send()
        .await
        .expect("request");
    let seen = seen_headers(response).await;
    assert_eq!(seen["x-user-id"], "7");
    assert_eq!(seen["x-user-roles"], "");
    assert_ne!(seen["x-identity-sig"], "forged");
    assert!(
        !seen.contains_key("authorization"),
        "the token is not forwarded"
    );

    let admin = rs256(&claims("1", json!({"roles": ["admin"]})));
    let response = gateway
        .post("/admin/products")
        .bearer_auth(&admin)
        .send()
        .await
        .expect("request");
    let seen = seen_headers(response).await;
    assert_eq!(seen["x-user-roles"], "admin");
}

#[tokio::test]
async fn an_eddsa_gateway_takes_only_tokens_from_its_ed25519_key() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        jwt_algorithm: JwtAlgorithm::EdDSA,
        jwt_public_key_pem: ED25519_PUBLIC.into(),
        ..settings(&echo.url)
    })
    .await;
    let plain = json!({"sub": "8", "exp": now() + 600});

    for (what, token) in [
        ("RS256 token", rs256(&plain)),
        ("another Ed25519 key", eddsa(ED25519_OTHER_PRIVATE, &plain)),
        (
            "HS256 keyed with the Ed25519 public key",
            sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(ED25519_PUBLIC.as_bytes()),
                &plain,
            ),
        ),
    ] {
        assert_refused(&gateway, &token, what).await;
    }
    assert_eq!(echo.hits(), 0);

    let response = gateway
        .get("/api/orders")
        .bearer_auth(eddsa(ED25519_PRIVATE, &plain))
        .send()
        .await
        .expect("request");
    assert_eq!(seen_headers(response).await["x-user-id"], "8");
}

#[tokio::test]
async fn an_hs256_gateway_with_an_issuer_refuses_tokens_without_it() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        jwt_issuers: vec![ISSUER.into()],
        jwt_leeway_secs: 0,
        ..settings(&echo.url)
    })
    .await;
    let secret = EncodingKey::from_secret(seckill_testkit::JWT_SECRET.as_bytes());
    let bare = seckill_auth::mint_token(seckill_testkit::JWT_SECRET, 3, &[], 600);
    assert_refused(&gateway, &bare, "no iss").await;
    let issued = sign(
        Algorithm::HS256,
        &secret,
        &json!({"sub": "3", "iss": ISSUER, "exp": now() + 600}),
    );
    let response = gateway
        .get("/api/orders")
        .bearer_auth(issued)
        .send()
        .await
        .expect("request");
    assert_eq!(seen_headers(response).await["x-user-id"], "3");

    // With no leeway, a token that expired a moment ago is already refused.
    let just_expired = sign(
        Algorithm::HS256,
        &secret,
        &json!({"sub": "3", "iss": ISSUER, "exp": now() - 2}),
    );
    assert_refused(&gateway, &just_expired, "expired, no leeway").await;
}
