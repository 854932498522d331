//! The solver of the gateway's proof-of-work on joining a waiting room (docs/DESIGN.md §9):
//! a nonce such that SHA-256(challenge ‖ `:` ‖ nonce, in decimal) starts with `bits` zero
//! bits. The gateway answers a join without a proof `428 proof_of_work_required` with the
//! challenge; [`crate::room`] solves it and joins again.

use sha2::{Digest, Sha256};

/// Leading zero bits of `digest`.
fn leading_zero_bits(digest: &[u8]) -> u32 {
    let mut bits = 0;
    for &byte in digest {
        if byte != 0 {
            return bits + byte.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// Whether `nonce` solves `challenge` at `bits`.
pub fn solves(challenge: &str, nonce: u64, bits: u32) -> bool {
    let mut hash = Sha256::new();
    hash.update(challenge.as_bytes());
    hash.update(b":");
    hash.update(nonce.to_string().as_bytes());
    leading_zero_bits(&hash.finalize()) >= bits
}

/// The first nonce from 0 that solves `challenge` at `bits` (about 2^bits hashes). The
/// challenge's prefix is hashed once; each try hashes only the nonce on top of it.
pub fn solve(challenge: &str, bits: u32) -> u64 {
    let mut prefix = Sha256::new();
    prefix.update(challenge.as_bytes());
    prefix.update(b":");
    (0..=u64::MAX)
        .find(|nonce| {
            let mut hash = prefix.clone();
            hash.update(nonce.to_string().as_bytes());
            leading_zero_bits(&hash.finalize()) >= bits
        })
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_solution_has_its_bits_of_zeros_and_is_the_first() {
        let challenge = "1700000000456.10.0f1e2d3c4b5a69788796a5b4c3d2e1f0";
        let nonce = solve(challenge, 10);
        assert!(solves(challenge, nonce, 10));
        assert!((0..nonce).all(|n| !solves(challenge, n, 10)), "the first");
        // Zero bits: anything does.
        assert_eq!(solve(challenge, 0), 0);
    }

    #[test]
    fn zeros_are_counted_across_bytes() {
        assert_eq!(leading_zero_bits(&[0, 0, 0x20]), 18);
        assert_eq!(leading_zero_bits(&[0x01]), 7);
        assert_eq!(leading_zero_bits(&[0xff]), 0);
    }
}
