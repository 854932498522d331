//! A raffle's draw: the order in which a `raffle` room admits the buyers who entered before
//! its sale started, re-derivable by anyone from what the room publishes.
//!
//! The room's seed (64 hex digits, written by seckill-api when it created the room) is
//! committed to before the sale: `GET /api/rooms/{id}/draw` answers its SHA-256
//! ([`commitment`]) from the room's creation on, and the seed itself only once entry has
//! closed, at the sale's start. The entries are the places handed out until then,
//! `0..entries`. Each entry's draw key is SHA-256 of the seed's text, `:` and the place in
//! decimal; the entries in ascending order of their keys (bytes compared in order; a tie,
//! never seen, goes to the lower place) are the drawn order, and a buyer's **rank** is their
//! index in it. Buyers who joined after the close keep their arrival order behind the drawn
//! ones: the rank of a place at or past `entries` is the place itself.
//!
//! With the seed, the number of entries and the ticket list (the user of each place) that
//! the draw route publishes, anyone computes the same ranks; since the seed was committed to
//! before anyone entered, it was not chosen to favour any entry.

use std::fmt::Write;

use sha2::{Digest, Sha256};

/// A draw larger than this is refused (a room that took more entries than this has to be
/// `fifo`): ranks are kept as `u32`.
pub const MAX_ENTRIES: u64 = u32::MAX as u64;

/// The drawn order of one raffle.
#[derive(Debug)]
pub struct Draw {
    /// The revealed seed, as written.
    pub seed: String,
    /// Places `0..entries` took part in the draw.
    pub entries: u64,
    /// The rank of each place below `entries`.
    ranks: Vec<u32>,
    /// The draw route's answer, made once (`super::Rooms`): a drawn raffle's never changes.
    pub published: tokio::sync::OnceCell<bytes::Bytes>,
}

impl PartialEq for Draw {
    fn eq(&self, other: &Self) -> bool {
        self.seed == other.seed && self.entries == other.entries
    }
}

impl Eq for Draw {}

/// The draw key of `place` under `seed`.
pub fn key(seed: &str, place: u64) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update(seed.as_bytes());
    hash.update(b":");
    hash.update(itoa::Buffer::new().format(place).as_bytes());
    hash.finalize().into()
}

/// What the room publishes before the close: SHA-256 of the seed's text, lower-case hex.
pub fn commitment(seed: &str) -> String {
    hex(&Sha256::digest(seed.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

impl Draw {
    /// The draw of `entries` places under `seed`; `None` past [`MAX_ENTRIES`]. Costs one
    /// SHA-256 per entry and a sort: run it off the request path for a large room.
    pub fn new(seed: &str, entries: u64) -> Option<Self> {
        if entries > MAX_ENTRIES {
            return None;
        }
        let count = usize::try_from(entries).ok()?;
        let mut keyed: Vec<([u8; 32], u32)> = (0..entries)
            .map(|place| (key(seed, place), u32::try_from(place).unwrap_or(u32::MAX)))
            .collect();
        keyed.sort_unstable();
        let mut ranks = vec![0u32; count];
        for (rank, &(_, place)) in keyed.iter().enumerate() {
            ranks[place as usize] = u32::try_from(rank).unwrap_or(u32::MAX);
        }
        Some(Self {
            seed: seed.to_owned(),
            entries,
            ranks,
            published: tokio::sync::OnceCell::new(),
        })
    }

    /// The rank of `place`: its index in the drawn order, or its place when it joined after
    /// the close.
    pub fn rank(&self, place: u64) -> u64 {
        usize::try_from(place)
            .ok()
            .and_then(|at| self.ranks.get(at))
            .map_or(place, |&rank| u64::from(rank))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = "5f0c3b9a1e2d4c6b8a7f9e0d1c2b3a4958675a4b3c2d1e0f9a8b7c6d5e4f3a2b";

    #[test]
    fn the_ranks_are_the_order_of_the_keys() {
        let draw = Draw::new(SEED, 1_000).expect("a draw");
        let mut by_rank: Vec<u64> = (0..1_000).collect();
        by_rank.sort_by_key(|&place| draw.rank(place));
        // A permutation of the entries, in ascending key order.
        let ranks: std::collections::BTreeSet<u64> = (0..1_000).map(|p| draw.rank(p)).collect();
        assert_eq!(ranks.len(), 1_000);
        assert_eq!(ranks.last(), Some(&999));
        for pair in by_rank.windows(2) {
            assert!(key(SEED, pair[0]) < key(SEED, pair[1]), "{pair:?}");
        }
        // Not the arrival order.
        assert!((0..1_000).filter(|&p| draw.rank(p) == p).count() < 10);
    }

    #[test]
    fn later_buyers_follow_in_arrival_order_and_the_seed_decides() {
        let draw = Draw::new(SEED, 10).expect("a draw");
        assert_eq!(draw.rank(10), 10);
        assert_eq!(draw.rank(12_345), 12_345);
        let other = Draw::new(&SEED.replace('5', "6"), 10).expect("a draw");
        assert!((0..10).any(|p| draw.rank(p) != other.rank(p)));
        assert_eq!(Draw::new(SEED, 0).expect("empty").rank(0), 0);
    }

    #[test]
    fn the_key_and_commitment_are_sha256_of_the_published_texts() {
        // sha256("abc"), a published test vector.
        assert_eq!(
            commitment("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(&key("ab", 0)[..], &Sha256::digest(b"ab:0")[..]);
        assert_eq!(
            &key(SEED, 42)[..],
            &Sha256::digest(format!("{SEED}:42"))[..]
        );
    }
}
