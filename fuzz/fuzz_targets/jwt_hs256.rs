//! seckill-auth's HS256 check against jsonwebtoken's `decode` (the reference it replaces on
//! the gateway's hot path): on any header and payload, signed with the secret or not, the
//! same verdict, the same claims, the same reason for a refusal.
//!
//! Input: one flags byte, then the header's JSON bytes, a 0xFF byte, the payload's. Flags:
//! bit 0 signs the token with another secret; bit 1 uses the bytes after the flags as the
//! token itself (when UTF-8); bits 2 and 3 require an issuer and an audience. The four
//! verifiers live across inputs, so headers they remember meet later tokens; each input's
//! token is also tried with another key's signature, once its header may be remembered.
#![no_main]

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::Mac as _;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use seckill_auth::{ClaimRules, JwtAlgorithm, JwtVerifier};

const SECRET: &[u8] = b"the-fuzzing-secret-of-32-bytes!!";

fn sign(message: &str, secret: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(message.as_bytes());
    B64.encode(mac.finalize().into_bytes())
}

/// One verifier per combination of flag bits 2 and 3, for the whole run.
fn verifier(flags: u8) -> &'static JwtVerifier {
    static VERIFIERS: OnceLock<Vec<JwtVerifier>> = OnceLock::new();
    let all = VERIFIERS.get_or_init(|| {
        (0..4u8)
            .map(|rules| {
                let rules = ClaimRules {
                    issuers: if rules & 1 != 0 {
                        vec!["iss-a".into(), "iss-b".into()]
                    } else {
                        vec![]
                    },
                    audiences: if rules & 2 != 0 {
                        vec!["aud-a".into()]
                    } else {
                        vec![]
                    },
                    leeway_secs: 30,
                };
                JwtVerifier::new(JwtAlgorithm::HS256, SECRET, &rules).expect("hs256")
            })
            .collect()
    });
    &all[usize::from((flags >> 2) & 3)]
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let token = if flags & 2 != 0 {
        let Ok(token) = std::str::from_utf8(rest) else {
            return;
        };
        token.to_owned()
    } else {
        let split = rest.iter().position(|&b| b == 0xFF).unwrap_or(rest.len());
        let (header, payload) = (&rest[..split], rest.get(split + 1..).unwrap_or_default());
        let message = format!("{}.{}", B64.encode(header), B64.encode(payload));
        let key: &[u8] = if flags & 1 != 0 { b"another" } else { SECRET };
        let signature = sign(&message, key);
        format!("{message}.{signature}")
    };
    let verifier = verifier(flags);
    let forged = match token.rsplit_once('.') {
        Some((message, _)) => format!("{message}.{}", sign(message, b"another")),
        None => token.clone(),
    };
    // Twice each: the second time the header may be one remembered.
    for token in [&token, &token, &forged, &forged] {
        let fast = verifier.verify(token);
        let reference = verifier.verify_with_jsonwebtoken(token);
        assert_eq!(fast, reference, "{token}");
    }
});
