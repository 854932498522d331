//! Buyer markers and sweep reservations, as the module docs of [`crate::ledger`] define them.

use std::fmt::Display;

/// Whether a buyer's `marker` stands for purchase `request_id`.
pub fn names(marker: &str, request_id: impl Display) -> bool {
    marker
        .rsplit_once(':')
        .is_some_and(|(_, id)| id == request_id.to_string())
}

/// `h:<request id>`: bought from the home bucket.
pub fn home(request_id: impl Display) -> String {
    format!("h:{request_id}")
}

/// `t<bucket>:<request id>`: bought from `bucket` by a sweep.
pub fn taken(bucket: u16, request_id: impl Display) -> String {
    format!("t{bucket}:{request_id}")
}

/// `o:<request id>`: a purchase held in Postgres (a live order, a dead letter not given up),
/// as a load writes it (`load.lua`).
pub fn loaded(request_id: impl Display) -> String {
    format!("o:{request_id}")
}

/// What a buyer's marker says of one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// It was accepted and holds the buyer's unit.
    Accepted,
    /// Its sweep reserved the buyer's marker and has not closed the reservation (it may or
    /// may not have taken a unit: a later purchase finds out once the reservation is past
    /// its fence).
    Reserved,
    /// The marker is another purchase's, or there is none.
    No,
}

impl Holding {
    /// What `marker` (the buyer's, if any) says of purchase `request_id`.
    pub fn of(marker: Option<&str>, request_id: impl Display) -> Self {
        match marker {
            Some(m) if names(m, request_id) => {
                if m.starts_with("r:") {
                    Self::Reserved
                } else {
                    Self::Accepted
                }
            }
            _ => Self::No,
        }
    }
}

/// A sweep's reservation of a buyer's marker: `r:<ms>:<request id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// The marker as stored.
    marker: String,
}

impl Reservation {
    /// The reservation `reserve.lua` made at `at_ms` for `request_id`.
    pub(crate) fn made(at_ms: i64, request_id: &str) -> Self {
        Self {
            marker: format!("r:{at_ms}:{request_id}"),
        }
    }

    /// A reservation marker as found in a buyers hash (`purchase.lua` reports stale ones).
    pub(crate) fn found(marker: String) -> Self {
        Self { marker }
    }

    /// The marker as stored.
    pub fn marker(&self) -> &str {
        &self.marker
    }

    /// When it was made (ms, Redis' clock), as stored: the `<ms>` of `r:<ms>:<request id>`.
    pub fn at(&self) -> &str {
        self.marker
            .trim_start_matches("r:")
            .split(':')
            .next()
            .unwrap_or_default()
    }

    /// The purchase a `takers` hash value stands for, if it was taken under this
    /// reservation (`<ms>:<request id>`, see `take.lua`).
    pub(crate) fn taker<'a>(&self, stored: &'a str) -> Option<&'a str> {
        stored.strip_prefix(self.at())?.strip_prefix(':')
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_marker_names_its_purchase_and_no_other() {
        let id = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b";
        for marker in [
            format!("h:{id}"),
            format!("t12:{id}"),
            format!("o:{id}"),
            format!("r:1732500000000:{id}"),
        ] {
            assert!(names(&marker, id), "{marker}");
            assert!(
                !names(&marker, "0190a1b2-0000-7e5f-8a9b-0c1d2e3f4a5b"),
                "{marker}"
            );
        }
        assert!(!names("o", id), "an old marker that names nothing");
    }

    #[test]
    fn markers_are_written_as_the_scripts_write_them() {
        assert_eq!(home("abc"), "h:abc");
        assert_eq!(taken(3, "abc"), "t3:abc");
        assert_eq!(loaded("abc"), "o:abc");
        assert_eq!(Reservation::made(17, "abc").marker(), "r:17:abc");
    }

    #[test]
    fn a_reservation_finds_only_units_taken_under_it() {
        let reservation = Reservation::found("r:1732500000000:abc".into());
        assert_eq!(reservation.at(), "1732500000000");
        assert_eq!(reservation.taker("1732500000000:def"), Some("def"));
        assert_eq!(reservation.taker("1732500000001:def"), None);
        // A marker of an older version carries no request id.
        assert_eq!(Reservation::found("r:17".into()).taker("17:x"), Some("x"));
    }
}
