//! The backends' memory of credentials already accepted: each signature is remembered for at
//! least the time a credential can stay valid, in a bounded amount of memory.
//!
//! Two generations of plain sets: new signatures go into the current one; once it is `keep`
//! old (or full) it becomes the previous one and the previous one is dropped. A signature
//! inserted into a generation that started at `s` was inserted before `s + keep` (else the
//! generation would have turned), and stays until the generation after next starts, at
//! `s + 2 keep` at the earliest: it is remembered for at least `keep`. Only when a
//! generation fills before it is `keep` old is a signature forgotten earlier — a replay is
//! then refused by the credential's age alone (see [`super::verify`]).
//!
//! What this replaced: a moka cache with a time-to-live, which held ~400 bytes per
//! signature and only evicted expired entries when it was next used, so a burst of purchases
//! left seckill-api ~90 MB larger for as long as the platform stayed idle after it. A set
//! of 16-byte keys costs ~20–40 bytes a signature, and both sets go at once when the first
//! request after a long pause finds them both too old.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The leading bytes of a signature kept to recognise it: 128 bits of an HMAC-SHA256 that
/// only the key holder can produce, so two different credentials never share them.
type Key = [u8; 16];

/// Signatures seen recently (see the module doc).
#[derive(Debug)]
pub(super) struct Seen {
    generations: Mutex<Generations>,
    /// How long a signature must be remembered at least.
    keep: Duration,
    /// Signatures per generation at most: the memory bound.
    per_generation: usize,
}

#[derive(Debug)]
struct Generations {
    current: HashSet<Key>,
    previous: HashSet<Key>,
    /// When `current` started taking signatures.
    started: Instant,
}

impl Seen {
    /// Remembers each signature for at least `keep`, holding at most `capacity` of them.
    pub(super) fn new(keep: Duration, capacity: usize) -> Self {
        Self {
            generations: Mutex::new(Generations {
                current: HashSet::new(),
                previous: HashSet::new(),
                started: Instant::now(),
            }),
            keep,
            per_generation: (capacity / 2).max(1),
        }
    }

    /// Whether `signature` is seen here for the first time; it is remembered from now on.
    pub(super) fn first_time(&self, signature: &[u8; 32]) -> bool {
        self.first_time_at(signature, Instant::now())
    }

    fn first_time_at(&self, signature: &[u8; 32], now: Instant) -> bool {
        let mut key = Key::default();
        key.copy_from_slice(&signature[..std::mem::size_of::<Key>()]);
        let mut g = self.generations.lock().unwrap_or_else(|e| e.into_inner());
        let age = now.saturating_duration_since(g.started);
        if age >= self.keep || g.current.len() >= self.per_generation {
            // Everything in `current` went in before `started + keep`: once twice that has
            // passed, it is all older than `keep`, and so is `previous`.
            g.previous = if age >= self.keep.saturating_mul(2) {
                HashSet::new()
            } else {
                std::mem::take(&mut g.current)
            };
            g.current = HashSet::new();
            g.started = now;
        }
        if g.previous.contains(&key) {
            return false;
        }
        g.current.insert(key)
    }

    /// Signatures held now (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        let g = self.generations.lock().unwrap();
        g.current.len() + g.previous.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature(n: u32) -> [u8; 32] {
        let mut s = [0u8; 32];
        s[..4].copy_from_slice(&n.to_be_bytes());
        s
    }

    const KEEP: Duration = Duration::from_secs(10);

    #[test]
    fn a_signature_is_refused_again_for_at_least_keep() {
        let seen = Seen::new(KEEP, 1000);
        let t0 = Instant::now();
        // Inserted just before its generation turns: the shortest stay there is.
        assert!(seen.first_time_at(&signature(1), t0));
        let late = t0 + KEEP - Duration::from_millis(1);
        assert!(seen.first_time_at(&signature(2), late));
        for step in [0, 1, 5, 9, 10] {
            let at = late + Duration::from_secs(step) - Duration::from_millis(1);
            assert!(
                !seen.first_time_at(&signature(2), at),
                "refused {step} s after it was seen"
            );
        }
        // Two whole generations later it is gone.
        assert!(seen.first_time_at(&signature(2), t0 + KEEP * 3));
    }

    #[test]
    fn after_a_long_pause_the_first_request_drops_both_generations() {
        let seen = Seen::new(KEEP, 1000);
        let t0 = Instant::now();
        for n in 0..100 {
            assert!(seen.first_time_at(&signature(n), t0));
        }
        assert!(seen.first_time_at(&signature(1000), t0 + KEEP));
        assert_eq!(seen.held(), 101);
        assert!(seen.first_time_at(&signature(2000), t0 + KEEP * 4));
        assert_eq!(seen.held(), 1, "only the newest signature is left");
    }

    #[test]
    fn a_flood_never_holds_more_than_the_capacity() {
        let seen = Seen::new(KEEP, 100);
        let t0 = Instant::now();
        for n in 0..10_000 {
            assert!(seen.first_time_at(&signature(n), t0));
            assert!(seen.held() <= 100, "{} held after {n}", seen.held());
        }
        // The newest are still refused: only the oldest went early.
        assert!(!seen.first_time_at(&signature(9_999), t0));
    }
}
