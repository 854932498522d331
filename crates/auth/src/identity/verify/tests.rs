use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::super::{IDENTITY_HEADERS, IDENTITY_SIG, USER_ID, USER_ROLES, join_roles};
use super::*;
use crate::IdentitySigner;

const WINDOW: Duration = Duration::from_secs(5);

fn purchase() -> RequestFacts<'static> {
    RequestFacts {
        method: "POST",
        target: "/api/seckill/7?x=1",
        request_id: "rid-1",
        body: br#"{"quantity":1}"#,
    }
}

/// The headers `signer` writes for `facts`, signed at `ts`.
fn signed_at(signer: &IdentitySigner, roles: &str, ts: i64, facts: &RequestFacts<'_>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    signer.sign_at(42, roles, ts, facts, |values| {
        for (name, value) in IDENTITY_HEADERS.into_iter().zip(values) {
            headers.insert(name, HeaderValue::from_bytes(value).expect("value"));
        }
    });
    headers
}

fn now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[test]
fn the_signature_is_the_hex_hmac_sha256_of_the_nine_fields() {
    // Computed independently (Python's hmac and hashlib), so a backend in any language can
    // check the format: see the module doc of `credential`.
    let signer = IdentitySigner::new("k", "seckill-api");
    let headers = signed_at(&signer, "admin,buyer", 1_700_000_000_000, &purchase());
    assert_eq!(
        headers[IDENTITY_SIG],
        "v2=96d8993b45574e8e9f56a0b5d58954b4e2426a345a370bdd5df0d41aa68c9fe5"
    );
    let empty_body = RequestFacts {
        method: "GET",
        target: "/api/orders",
        request_id: "rid-2",
        body: b"",
    };
    let signer = IdentitySigner::new("k", "order-service");
    let headers = signed_at(&signer, "", 1_700_000_000_000, &empty_body);
    assert_eq!(
        headers[IDENTITY_SIG],
        "v2=6a87c7d510461f5c4308902bb0bb46594d00e0b0709abebfef5069afbc8fd208"
    );
}

#[tokio::test]
async fn a_credential_verifies_for_its_own_request_once() {
    let signer = IdentitySigner::new("k", "seckill-api");
    let verifier = IdentityVerifier::new("k", "seckill-api", WINDOW);
    let headers = signed_at(&signer, "admin", now(), &purchase());
    let identity = verifier.verify(&headers, &purchase()).await.expect("valid");
    assert_eq!((identity.user_id, identity.is_admin()), (42, true));
    assert_eq!(
        verifier.verify(&headers, &purchase()).await,
        Err(IdentityError::Replayed)
    );
}

#[tokio::test]
async fn every_bound_field_breaks_the_signature_when_changed() {
    let signer = IdentitySigner::new("k", "seckill-api");
    let verifier = IdentityVerifier::new("k", "seckill-api", WINDOW);
    let headers = signed_at(&signer, "", now(), &purchase());
    let facts = purchase();
    for other in [
        RequestFacts {
            method: "PUT",
            ..facts
        },
        RequestFacts {
            target: "/api/seckill/8?x=1",
            ..facts
        },
        RequestFacts {
            target: "/api/seckill/7?x=2",
            ..facts
        },
        RequestFacts {
            request_id: "rid-2",
            ..facts
        },
        RequestFacts {
            body: br#"{"quantity":9}"#,
            ..facts
        },
        RequestFacts { body: b"", ..facts },
    ] {
        assert_eq!(
            verifier.verify(&headers, &other).await,
            Err(IdentityError::BadSignature),
            "{other:?}"
        );
    }
    let other_service = IdentityVerifier::new("k", "order-service", WINDOW);
    let other_key = IdentityVerifier::new("k2", "seckill-api", WINDOW);
    for verifier in [other_service, other_key] {
        assert_eq!(
            verifier.verify(&headers, &facts).await,
            Err(IdentityError::BadSignature)
        );
    }
    for (name, value) in [(USER_ID, "43"), (USER_ROLES, "admin")] {
        let mut forged = headers.clone();
        forged.insert(name, HeaderValue::from_static(value));
        assert_eq!(
            verifier.verify(&forged, &facts).await,
            Err(IdentityError::BadSignature)
        );
    }
}

#[tokio::test]
async fn credentials_outside_the_window_either_way_are_stale() {
    let signer = IdentitySigner::new("k", "seckill-api");
    let verifier = IdentityVerifier::new("k", "seckill-api", WINDOW);
    for skew in [-6_000, 6_000, -60_000] {
        let headers = signed_at(&signer, "", now() + skew, &purchase());
        assert_eq!(
            verifier.verify(&headers, &purchase()).await,
            Err(IdentityError::Stale),
            "{skew}"
        );
    }
    let recent = signed_at(&signer, "", now() - 3_000, &purchase());
    assert!(verifier.verify(&recent, &purchase()).await.is_ok());
}

#[tokio::test]
async fn a_signature_without_the_version_or_headers_is_refused() {
    let signer = IdentitySigner::new("k", "seckill-api");
    let verifier = IdentityVerifier::new("k", "seckill-api", WINDOW);
    let mut headers = signed_at(&signer, "", now(), &purchase());
    let bare = headers[IDENTITY_SIG].to_str().expect("text")[3..].to_string();
    headers.insert(IDENTITY_SIG, HeaderValue::from_str(&bare).expect("hex"));
    assert_eq!(
        verifier.verify(&headers, &purchase()).await,
        Err(IdentityError::UnknownVersion)
    );
    assert_eq!(
        verifier.verify(&HeaderMap::new(), &purchase()).await,
        Err(IdentityError::Missing)
    );
}

#[tokio::test]
async fn every_client_sent_identity_value_is_replaced_and_commas_cannot_smuggle_admin() {
    let signer = IdentitySigner::new("k", "seckill-api");
    let verifier = IdentityVerifier::new("k", "seckill-api", WINDOW);
    let mut headers = HeaderMap::new();
    for name in &IDENTITY_HEADERS {
        headers.append(name, HeaderValue::from_static("1"));
        headers.append(name, HeaderValue::from_static("admin"));
    }
    let roles = ["x,admin".to_string(), "buyer".to_string()];
    signer.sign_into(&mut headers, 7, &roles, &purchase());
    for name in &IDENTITY_HEADERS {
        assert_eq!(headers.get_all(name).iter().count(), 1, "{name}");
    }
    let identity = verifier.verify(&headers, &purchase()).await.expect("valid");
    assert_eq!(identity.user_id, 7);
    assert_eq!(identity.roles, vec!["buyer".to_string()]);
}

#[test]
fn written_lines_carry_the_signed_identity() {
    let signer = IdentitySigner::new("k", "seckill-api");
    let mut out = Vec::new();
    let roles = ["admin".to_string(), "x,y".to_string()];
    signer.write_lines(&mut out, -3, &join_roles(&roles), &purchase());
    let text = String::from_utf8(out).expect("text");
    let mut headers = HeaderMap::new();
    for line in text.split_terminator("\r\n") {
        let (name, value) = line.split_once(": ").expect("name: value");
        headers.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            HeaderValue::from_str(value).expect("value"),
        );
    }
    assert_eq!(headers.len(), 4, "{text}");
    assert_eq!(headers[USER_ROLES], "admin");
    let verifier = IdentityVerifier::new("k", "seckill-api", WINDOW);
    let sig = verifier.check(&headers, &purchase(), now());
    assert!(sig.is_ok(), "{sig:?}");
}
