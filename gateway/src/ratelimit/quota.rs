//! Whom a request is charged to, the quota it is charged against, and what a bucket said:
//! the words both bucket stores ([`super::memory`], [`super::redis`]) and the verdict share.

use std::fmt;
use std::net::IpAddr;

/// Whom a request is charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RateKey {
    /// A verified user, wherever they connect from.
    User(i64),
    /// An unauthenticated client, by address.
    Client(IpAddr),
}

impl fmt::Display for RateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::User(id) => write!(f, "u:{id}"),
            Self::Client(ip) => write!(f, "ip:{ip}"),
        }
    }
}

/// One quota: a rate, a burst, and the label it is counted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaSpec {
    /// `purchase` or `default`: the metric label and part of the Redis key.
    pub route: &'static str,
    /// Requests per second a client regains.
    pub per_sec: u32,
    /// Requests a client may send at once.
    pub burst: u32,
}

impl QuotaSpec {
    /// `None` when switched off (a zero rate or burst).
    pub(super) fn new(route: &'static str, per_sec: u32, burst: u32) -> Option<Self> {
        (per_sec > 0 && burst > 0).then_some(Self {
            route,
            per_sec,
            burst,
        })
    }

    /// Time between two regained requests, microseconds (at least one: settings refuse
    /// faster rates).
    pub fn interval_us(&self) -> u64 {
        (1_000_000 / u64::from(self.per_sec)).max(1)
    }
}

/// What Redis said about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Let through; `remaining` more would pass right now.
    Allowed {
        /// Requests left in the burst.
        remaining: u64,
    },
    /// Refused; the next request passes in `retry_after_secs` (rounded up).
    Limited {
        /// Whole seconds to wait.
        retry_after_secs: u64,
    },
    /// Redis did not answer: let through, unlimited.
    Unknown,
}
