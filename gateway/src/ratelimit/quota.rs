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

impl RateKey {
    /// The key of a client at `ip`: an IPv6 address reduced to its network of
    /// `ipv6_prefix` bits (1-128), since one host commonly holds a whole /64 and could
    /// otherwise take a fresh bucket with every address.
    pub fn client(ip: IpAddr, ipv6_prefix: u8) -> Self {
        match ip.to_canonical() {
            IpAddr::V6(v6) => {
                let keep = u32::from(ipv6_prefix.clamp(1, 128));
                let mask = u128::MAX << (128 - keep);
                Self::Client(IpAddr::V6((u128::from(v6) & mask).into()))
            }
            v4 => Self::Client(v4),
        }
    }
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
    /// Redis did not answer: the failure mode decides.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(ip: &str, prefix: u8) -> RateKey {
        RateKey::client(ip.parse().expect("ip"), prefix)
    }

    #[test]
    fn ipv6_clients_are_keyed_by_their_network_and_ipv4_by_address() {
        let a = client("2001:db8:1:2:aaaa::1", 64);
        assert_eq!(a, client("2001:db8:1:2:ffff:1:2:3", 64));
        assert_eq!(a.to_string(), "ip:2001:db8:1:2::");
        assert_ne!(a, client("2001:db8:1:3::1", 64));
        assert_ne!(client("2001:db8::1", 128), client("2001:db8::2", 128));
        assert_eq!(client("2001:db8::1", 128).to_string(), "ip:2001:db8::1");
        assert_eq!(client("2001:db8:ff::1", 32), client("2001:db8:1::1", 32));
        assert_eq!(client("::ffff:10.0.0.9", 64).to_string(), "ip:10.0.0.9");
        assert_ne!(client("10.0.0.9", 64), client("10.0.0.10", 64));
    }
}
