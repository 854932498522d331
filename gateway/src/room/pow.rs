//! The optional proof-of-work on joining a waiting room (`docs/DESIGN.md` §9): a join must
//! carry the solution of a challenge the gateway signed, whose difficulty rises with the
//! room's join rate.
//!
//! - The **difficulty** is a number of leading zero bits: `room_pow_min_bits` while the
//!   room's joins (all gateways together: the shared `joined` counter every tick reads)
//!   stay below `room_pow_rate` per second; one bit more from that rate on, and one more at
//!   each doubling of it, never above `room_pow_max_bits`. `room_pow_max_bits = 0` turns the
//!   whole thing off.
//! - A **challenge** (`super::ticket::RoomKey::challenge`) names its bits and its issue
//!   time under the room key's MAC; it is good for [`CHALLENGE_TTL_MS`]. Nothing is stored:
//!   any replica verifies it.
//! - A **solution** is a nonce, a decimal `u64` written plainly, such that
//!   SHA-256(challenge ‖ `:` ‖ nonce) starts with at least the challenge's bits of zeros.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use sha2::{Digest, Sha256};

/// How long a challenge may be solved and used, after its issue (ms).
pub const CHALLENGE_TTL_MS: i64 = 60_000;

/// The join rate is counted over about this long.
pub const RATE_WINDOW: Duration = Duration::from_secs(1);

/// The proof-of-work settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PowSettings {
    /// Difficulty below the threshold rate (`room_pow_min_bits`).
    pub min_bits: u32,
    /// Highest difficulty; 0: no proof-of-work at all (`room_pow_max_bits`).
    pub max_bits: u32,
    /// Joins per second at which the difficulty starts rising (`room_pow_rate`).
    pub rate: u32,
}

impl PowSettings {
    /// Proof-of-work off.
    pub const OFF: Self = Self {
        min_bits: 0,
        max_bits: 0,
        rate: 1000,
    };

    /// Whether joins may be asked for a proof at all.
    pub fn is_on(&self) -> bool {
        self.max_bits > 0
    }

    /// The difficulty at `joins_per_sec`: the least below the threshold, one bit more from
    /// it, and another at each doubling, up to the most.
    pub fn bits(&self, joins_per_sec: u64) -> u32 {
        if !self.is_on() {
            return 0;
        }
        let threshold = u64::from(self.rate.max(1));
        let over = joins_per_sec / threshold;
        let extra = if over == 0 { 0 } else { 1 + over.ilog2() };
        self.min_bits.saturating_add(extra).min(self.max_bits)
    }
}

/// A room's join rate, from successive readings of its `joined` counter, and the
/// difficulty it sets.
#[derive(Debug, Default)]
pub struct Difficulty {
    /// Readings of the last [`RATE_WINDOW`] (and the one just before, the base): when,
    /// the line, joined.
    readings: VecDeque<(Instant, u64, u64)>,
    /// The difficulty as of the last reading.
    pub bits: u32,
}

impl Difficulty {
    /// Records `joined` of `line` read at `at`; returns the joins per second over about the
    /// last second (over a full second while fewer readings cover one, so a gateway that
    /// just started following the room does not see a spike).
    pub fn record(&mut self, at: Instant, line: u64, joined: u64) -> u64 {
        if self.readings.back().is_some_and(|&(_, l, _)| l != line) {
            // Another line: another count.
            self.readings.clear();
        }
        // Two steps may return out of order: the counter never goes back on a line.
        let joined = self
            .readings
            .back()
            .map_or(joined, |&(_, _, last)| joined.max(last));
        self.readings.push_back((at, line, joined));
        while self.readings.len() > 2
            && self
                .readings
                .get(1)
                .is_some_and(|&(t, _, _)| at.saturating_duration_since(t) >= RATE_WINDOW)
        {
            self.readings.pop_front();
        }
        let Some(&(base_at, _, base)) = self.readings.front() else {
            return 0;
        };
        let elapsed = at.saturating_duration_since(base_at).max(RATE_WINDOW);
        let per_sec = u128::from(joined - base) * 1000 / elapsed.as_millis().max(1);
        u64::try_from(per_sec).unwrap_or(u64::MAX)
    }
}

/// Why a join's proof did not hold (`gateway_room_pow_failures_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// None sent: `428 proof_of_work_required` (a client's first join usually).
    Missing,
    /// Not a challenge of the caller's for this sale, below the least difficulty, or a nonce
    /// that does not solve it: `403 invalid_proof_of_work`.
    Invalid,
    /// A challenge older than [`CHALLENGE_TTL_MS`]: `403 proof_of_work_expired`.
    Expired,
}

impl Failure {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid => "invalid",
            Self::Expired => "expired",
        }
    }

    /// The refusal's status, code and message.
    pub fn refusal(self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::Missing => (
                StatusCode::PRECONDITION_REQUIRED,
                "proof_of_work_required",
                "joining this sale takes a proof of work: solve the challenge and join with it",
            ),
            Self::Invalid => (
                StatusCode::FORBIDDEN,
                "invalid_proof_of_work",
                "this proof of work does not hold: solve the challenge given here",
            ),
            Self::Expired => (
                StatusCode::FORBIDDEN,
                "proof_of_work_expired",
                "this challenge has expired: solve the one given here",
            ),
        }
    }
}

/// Leading zero bits of `digest`.
pub fn leading_zero_bits(digest: &[u8]) -> u32 {
    let mut bits = 0;
    for &byte in digest {
        if byte != 0 {
            return bits + byte.leading_zeros();
        }
        bits += 8;
    }
    bits
}

/// SHA-256 of `challenge` ‖ `:` ‖ `nonce`.
pub fn proof_hash(challenge: &str, nonce: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(challenge.as_bytes());
    hash.update(b":");
    hash.update(nonce.as_bytes());
    hash.finalize().into()
}

/// Whether `nonce` (a plain decimal `u64`: digits, no sign, no leading zero) solves
/// `challenge` at `bits`.
pub fn solves(challenge: &str, nonce: &str, bits: u32) -> bool {
    let plain = !nonce.is_empty()
        && nonce.len() <= 20
        && nonce.bytes().all(|b| b.is_ascii_digit())
        && (nonce == "0" || !nonce.starts_with('0'))
        && nonce.parse::<u64>().is_ok();
    plain && leading_zero_bits(&proof_hash(challenge, nonce)) >= bits
}

/// The first nonce from 0 that solves `challenge` at `bits` (for tests; clients have their
/// own solvers: `loadtest/src/pow.rs`, `gateway/static/sale/pow.js`).
pub fn solve(challenge: &str, bits: u32) -> u64 {
    let mut text = itoa::Buffer::new();
    (0..=u64::MAX)
        .find(|&nonce| leading_zero_bits(&proof_hash(challenge, text.format(nonce))) >= bits)
        .unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: PowSettings = PowSettings {
        min_bits: 4,
        max_bits: 10,
        rate: 100,
    };

    #[test]
    fn leading_zero_bits_are_counted_across_bytes() {
        assert_eq!(leading_zero_bits(&[0x80, 0]), 0);
        assert_eq!(leading_zero_bits(&[0x01, 0xff]), 7);
        assert_eq!(leading_zero_bits(&[0, 0x10]), 11);
        assert_eq!(leading_zero_bits(&[0, 0, 0]), 24);
        assert_eq!(leading_zero_bits(&[]), 0);
    }

    #[test]
    fn the_difficulty_is_the_least_below_the_rate_and_a_bit_more_per_doubling_capped() {
        assert_eq!(ON.bits(0), 4);
        assert_eq!(ON.bits(99), 4);
        assert_eq!(ON.bits(100), 5);
        assert_eq!(ON.bits(199), 5);
        assert_eq!(ON.bits(200), 6);
        assert_eq!(ON.bits(400), 7);
        assert_eq!(ON.bits(799), 7);
        assert_eq!(ON.bits(800), 8);
        assert_eq!(ON.bits(100 * 32), 10);
        assert_eq!(ON.bits(u64::MAX), 10);
        // From nothing: free until the rate is reached.
        let from_zero = PowSettings { min_bits: 0, ..ON };
        assert_eq!(from_zero.bits(99), 0);
        assert_eq!(from_zero.bits(100), 1);
        // Off: never.
        assert_eq!(PowSettings::OFF.bits(u64::MAX), 0);
        assert!(!PowSettings::OFF.is_on());
    }

    #[test]
    fn the_join_rate_is_counted_over_the_last_second() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut difficulty = Difficulty::default();
        assert_eq!(
            difficulty.record(at(0), 1, 5_000),
            0,
            "the first reading is a base"
        );
        // 50 joins in the first 100 ms: counted over a whole second, not as 500/s.
        assert_eq!(difficulty.record(at(100), 1, 5_050), 50);
        for tick in 2..=10 {
            difficulty.record(at(tick * 100), 1, 5_000 + tick * 50);
        }
        assert_eq!(difficulty.record(at(1_100), 1, 5_550), 500);
        // The crowd stops: a second later, nothing.
        for tick in 12..=22 {
            difficulty.record(at(tick * 100), 1, 5_550);
        }
        assert_eq!(difficulty.record(at(2_300), 1, 5_550), 0);
        // A step that read the counter before the last one's does not count backwards.
        assert_eq!(difficulty.record(at(2_400), 1, 5_540), 0);
        // A new line starts its own count.
        assert_eq!(difficulty.record(at(2_500), 2, 3), 0);
        assert_eq!(difficulty.record(at(3_500), 2, 303), 300);
    }

    #[test]
    fn a_solved_nonce_verifies_at_its_bits_only_in_its_plain_form() {
        let challenge = "1700000000456.12.0f1e2d3c4b5a69788796a5b4c3d2e1f0";
        let nonce = solve(challenge, 12);
        let text = nonce.to_string();
        assert!(solves(challenge, &text, 12));
        assert!(leading_zero_bits(&proof_hash(challenge, &text)) >= 12);
        // Its bits or fewer, not (almost surely) many more; nor for another challenge.
        assert!(solves(challenge, &text, 0));
        assert!(!solves(challenge, &text, 64));
        let other = "1700000000457.12.0f1e2d3c4b5a69788796a5b4c3d2e1f0";
        assert!(
            (0..20).any(|n| !solves(other, &(nonce + n).to_string(), 12)),
            "another challenge needs its own nonce"
        );
        for spelled in [
            format!("0{text}"),
            format!("+{text}"),
            format!("{text} "),
            String::new(),
        ] {
            assert!(!solves(challenge, &spelled, 0), "{spelled:?}");
        }
        assert!(!solves(challenge, "18446744073709551616", 0), "beyond u64");
    }
}
