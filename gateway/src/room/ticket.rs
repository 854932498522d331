//! Tickets and passes: what the gateway signs for a buyer of a queued sale, so that any
//! replica can check one without looking anything up.
//!
//! - A **ticket** is a buyer's place in line: `<place>.<joined_ms>.<mac>`.
//! - A **pass** admits its buyer to one purchase until it expires, and is the last segment
//!   of the buyer's own purchase path: `<rank>.<expires_ms>.<mac>`, the rank the buyer's
//!   position in the order of admission (its place, but in a drawn raffle its draw's rank).
//! - A **challenge** is a proof-of-work puzzle for a join (`super::pow`):
//!   `<issued_ms>.<bits>.<mac>`; its MAC's place is the bits, its time the issue.
//!
//! The MAC is HMAC-SHA256 under the room key, of a kind (`ticket`, `pass` or `challenge`),
//! the product,
//! the user, the sale (its start, unix ms: a sale moved to another time is another sale),
//! the line (the number its room was created with: a line Redis lost and that started
//! again is another line) and the fields above, each followed by `\n`; its first 16 bytes,
//! in lower-case hex.
//! The user is not written in either: it is the caller whose token verified, so a ticket or
//! pass taken from another buyer does not verify.

use std::fmt::Write;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Bytes of the MAC kept (128 bits).
const MAC_BYTES: usize = 16;

/// Longest text a ticket or pass can be: two 20-digit numbers, two dots, the MAC.
pub const MAX_LEN: usize = 20 + 1 + 20 + 1 + 2 * MAC_BYTES;

/// Whom and what a ticket or pass is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// The product on sale.
    pub product_id: i64,
    /// The buyer (the caller's verified user id).
    pub user_id: i64,
    /// The sale: its start, unix ms.
    pub sale: i64,
    /// The line: the number the room was created with.
    pub line: u64,
}

/// A checked ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// Place in line, from 0.
    pub place: u64,
    /// When the buyer joined, unix ms.
    pub joined_ms: i64,
}

/// A checked pass (its expiry not yet compared with the clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// The admitted buyer's position in the order of admission: the place in line, or in a
    /// drawn raffle the rank (`super::draw`).
    pub rank: u64,
    /// Until when it admits, unix ms.
    pub expires_ms: i64,
}

/// A checked challenge (its age not yet compared with the clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// When it was issued, unix ms.
    pub issued_ms: i64,
    /// Leading zero bits the proof's hash must have.
    pub bits: u32,
}

/// The key tickets and passes are signed with: the same on every gateway replica.
#[derive(Clone)]
pub struct RoomKey {
    keyed: Hmac<Sha256>,
}

impl std::fmt::Debug for RoomKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoomKey(..)")
    }
}

impl RoomKey {
    /// A key of `secret`'s bytes.
    pub fn new(secret: &[u8]) -> Self {
        Self {
            keyed: Hmac::new_from_slice(secret).expect("HMAC takes any key length"),
        }
    }

    /// The key derived from another secret (the gateway's internal key) for this one use:
    /// HMAC-SHA256 of `seckill waiting room` under it.
    pub fn derived_from(secret: &[u8]) -> Self {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
        mac.update(b"seckill waiting room");
        Self::new(&mac.finalize().into_bytes())
    }

    fn mac(&self, kind: &str, holder: Holder, place: u64, time: i64) -> Hmac<Sha256> {
        let mut mac = self.keyed.clone();
        let mut line = |field: &[u8]| {
            mac.update(field);
            mac.update(b"\n");
        };
        line(kind.as_bytes());
        line(itoa::Buffer::new().format(holder.product_id).as_bytes());
        line(itoa::Buffer::new().format(holder.user_id).as_bytes());
        line(itoa::Buffer::new().format(holder.sale).as_bytes());
        line(itoa::Buffer::new().format(holder.line).as_bytes());
        line(itoa::Buffer::new().format(place).as_bytes());
        line(itoa::Buffer::new().format(time).as_bytes());
        mac
    }

    fn sign(&self, kind: &str, holder: Holder, place: u64, time: i64) -> String {
        let tag = self.mac(kind, holder, place, time).finalize().into_bytes();
        let mut text = format!("{place}.{time}.");
        for byte in &tag[..MAC_BYTES] {
            let _ = write!(text, "{byte:02x}");
        }
        text
    }

    fn check(&self, kind: &str, holder: Holder, text: &str) -> Option<(u64, i64)> {
        if text.len() > MAX_LEN {
            return None;
        }
        let mut parts = text.splitn(3, '.');
        let place = plain_number(parts.next()?)?;
        let time = i64::try_from(plain_number(parts.next()?)?).ok()?;
        let tag = from_hex(parts.next()?)?;
        self.mac(kind, holder, place, time)
            .verify_truncated_left(&tag)
            .ok()?;
        Some((place, time))
    }

    /// The ticket of `holder`'s `place`, joined at `joined_ms`.
    pub fn ticket(&self, holder: Holder, ticket: Ticket) -> String {
        self.sign("ticket", holder, ticket.place, ticket.joined_ms)
    }

    /// `text` as a ticket of `holder`'s, if it is one.
    pub fn check_ticket(&self, holder: Holder, text: &str) -> Option<Ticket> {
        let (place, joined_ms) = self.check("ticket", holder, text)?;
        Some(Ticket { place, joined_ms })
    }

    /// The pass of `holder`'s admitted `rank`.
    pub fn pass(&self, holder: Holder, pass: Pass) -> String {
        self.sign("pass", holder, pass.rank, pass.expires_ms)
    }

    /// `text` as a pass of `holder`'s, if it is one (expired or not).
    pub fn check_pass(&self, holder: Holder, text: &str) -> Option<Pass> {
        let (rank, expires_ms) = self.check("pass", holder, text)?;
        Some(Pass { rank, expires_ms })
    }

    /// The proof-of-work challenge for `holder`'s join: `<issued_ms>.<bits>.<mac>`.
    pub fn challenge(&self, holder: Holder, challenge: Challenge) -> String {
        let signed = self.sign(
            "challenge",
            holder,
            u64::from(challenge.bits),
            challenge.issued_ms,
        );
        // Signed as `<bits>.<issued_ms>.<mac>`, written with the time first.
        let (_, rest) = signed.split_once('.').unwrap_or_default();
        let (_, tag) = rest.split_once('.').unwrap_or_default();
        format!("{}.{}.{tag}", challenge.issued_ms, challenge.bits)
    }

    /// `text` as a challenge issued to `holder`, if it is one (expired or not).
    pub fn check_challenge(&self, holder: Holder, text: &str) -> Option<Challenge> {
        let (issued, rest) = text.split_once('.')?;
        let (bits, tag) = rest.split_once('.')?;
        let (bits, issued_ms) =
            self.check("challenge", holder, &format!("{bits}.{issued}.{tag}"))?;
        Some(Challenge {
            issued_ms,
            bits: u32::try_from(bits).ok()?,
        })
    }
}

/// A decimal number as written by the gateway: digits only, no sign, no leading zero.
fn plain_number(text: &str) -> Option<u64> {
    let plain = !text.is_empty()
        && text.len() <= 20
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text == "0" || !text.starts_with('0'));
    plain.then(|| text.parse().ok()).flatten()
}

/// Exactly `MAC_BYTES` bytes of lower-case hex.
fn from_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 2 * MAC_BYTES {
        return None;
    }
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    text.as_bytes()
        .chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLDER: Holder = Holder {
        product_id: 7,
        user_id: 42,
        sale: 1_700_000_000_000,
        line: 0x5eed,
    };

    /// Holders that differ from [`HOLDER`] in one field each.
    fn others() -> [Holder; 4] {
        [
            Holder {
                user_id: 43,
                ..HOLDER
            },
            Holder {
                product_id: 8,
                ..HOLDER
            },
            Holder {
                sale: HOLDER.sale + 1,
                ..HOLDER
            },
            Holder {
                line: HOLDER.line + 1,
                ..HOLDER
            },
        ]
    }

    #[test]
    fn a_ticket_verifies_for_its_holder_only() {
        let key = RoomKey::new(b"room key");
        let ticket = Ticket {
            place: 12,
            joined_ms: 1_700_000_000_123,
        };
        let text = key.ticket(HOLDER, ticket);
        assert!(text.starts_with("12.1700000000123."), "{text}");
        assert_eq!(key.check_ticket(HOLDER, &text), Some(ticket));
        for other in others() {
            assert_eq!(key.check_ticket(other, &text), None, "{other:?}");
        }
        assert_eq!(RoomKey::new(b"other key").check_ticket(HOLDER, &text), None);
        // A ticket is not a pass, however alike they look.
        assert_eq!(key.check_pass(HOLDER, &text), None);
    }

    #[test]
    fn a_challenge_verifies_for_its_holder_only_and_its_bits_cannot_be_lowered() {
        let key = RoomKey::new(b"room key");
        let challenge = Challenge {
            issued_ms: 1_700_000_000_456,
            bits: 12,
        };
        let text = key.challenge(HOLDER, challenge);
        assert!(text.starts_with("1700000000456.12."), "{text}");
        assert_eq!(key.check_challenge(HOLDER, &text), Some(challenge));
        for other in others() {
            assert_eq!(key.check_challenge(other, &text), None, "{other:?}");
        }
        let tag = text.rsplit('.').next().unwrap();
        for forged in [
            format!("1700000000456.11.{tag}"),
            format!("1700000000456.0.{tag}"),
            format!("1700000000457.12.{tag}"),
            format!("12.1700000000456.{tag}"),
            format!("1700000000456.012.{tag}"),
            "1700000000456.12".to_string(),
            String::new(),
        ] {
            assert_eq!(key.check_challenge(HOLDER, &forged), None, "{forged}");
        }
        // Neither a ticket nor a pass of the same numbers is a challenge, nor the reverse.
        let ticket = key.ticket(
            HOLDER,
            Ticket {
                place: 12,
                joined_ms: challenge.issued_ms,
            },
        );
        assert_eq!(key.check_challenge(HOLDER, &ticket), None);
        assert_eq!(key.check_ticket(HOLDER, &text), None);
        assert_eq!(
            RoomKey::new(b"other key").check_challenge(HOLDER, &text),
            None
        );
    }

    #[test]
    fn a_pass_with_any_field_changed_is_refused() {
        let key = RoomKey::derived_from(b"internal key");
        let pass = Pass {
            rank: 3,
            expires_ms: 1_700_000_060_000,
        };
        let text = key.pass(HOLDER, pass);
        assert_eq!(key.check_pass(HOLDER, &text), Some(pass));
        let (place, rest) = text.split_once('.').unwrap();
        let (expires, tag) = rest.split_once('.').unwrap();
        let flipped = format!(
            "{}{}",
            &tag[..31],
            if tag.ends_with('0') { '1' } else { '0' }
        );
        for forged in [
            format!("4.{expires}.{tag}"),
            format!("{place}.{}.{tag}", pass.expires_ms + 1),
            format!("{place}.{expires}.{flipped}"),
            format!("{place}.{expires}.{}", tag.to_uppercase()),
            format!("0{place}.{expires}.{tag}"),
            format!("+{place}.{expires}.{tag}"),
            format!("{place}.{expires}.{}", &tag[..30]),
            format!("{place}.{expires}"),
            String::new(),
            "x".repeat(MAX_LEN + 1),
        ] {
            assert_eq!(key.check_pass(HOLDER, &forged), None, "{forged}");
        }
    }
}
