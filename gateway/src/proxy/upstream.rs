//! The replicas of one service: round-robin order, and passive ejection of a replica that
//! refused a connection.
//!
//! Ejection is passive: no health-check traffic, a replica is skipped for `eject_for` after a
//! refused or timed-out connect and is tried again once that has passed. An ejected replica
//! is still tried last when every other one failed too — better than a 503 without trying.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::http::Uri;
use axum::http::uri::Authority;

use super::pool::{Pool, PoolSettings};

/// One replica: its address, its connections and how long it is ejected for.
#[derive(Debug)]
pub struct Replica {
    base: String,
    pool: Pool,
    /// Milliseconds since [`Upstreams::epoch`] until which the replica is skipped; 0: never.
    ejected_until_ms: AtomicU64,
}

impl Replica {
    /// A replica at `base`, an `http://host[:port]` URL ([`base_authority`]).
    fn new(base: &str, pool: PoolSettings) -> Self {
        let base = base.trim_end_matches('/').to_string();
        // Settings::validate refused bases without one; a hand-built bad base gets a pool
        // whose connects fail, so the replica is ejected, never used.
        let authority = base_authority(&base).unwrap_or(Authority::from_static("invalid.:0"));
        Self {
            pool: Pool::new(&authority, pool),
            base,
            ejected_until_ms: AtomicU64::new(0),
        }
    }

    /// The base URL, e.g. `http://127.0.0.1:8081`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The replica's connections.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }
}

/// The authority of an upstream base URL, if it is `http://host[:port]` (a path is allowed
/// and ignored).
pub fn base_authority(base: &str) -> Option<Authority> {
    let uri: Uri = base.parse().ok()?;
    (uri.scheme_str() == Some("http"))
        .then(|| uri.authority().cloned())
        .flatten()
}

/// The replicas of one service, picked round-robin.
#[derive(Debug)]
pub struct Upstreams {
    name: &'static str,
    replicas: Vec<Replica>,
    next: AtomicUsize,
    eject_for: Duration,
    /// The clock ejection deadlines count from (an `Instant` cannot live in an atomic).
    epoch: Instant,
}

impl Upstreams {
    /// Replicas of service `name` at `bases`, connected to as `pool` says; a replica that
    /// refuses a connection is skipped for `eject_for` (zero: never skipped).
    pub fn new(
        name: &'static str,
        bases: Vec<String>,
        eject_for: Duration,
        pool: PoolSettings,
    ) -> Self {
        let replicas = bases.iter().map(|b| Replica::new(b, pool)).collect();
        Self {
            name,
            replicas,
            next: AtomicUsize::new(0),
            eject_for,
            epoch: Instant::now(),
        }
    }

    /// The service name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The first replica (readiness probes).
    pub fn first(&self) -> &Replica {
        &self.replicas[0]
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn is_ejected(&self, replica: &Replica, now_ms: u64) -> bool {
        replica.ejected_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// The replicas in the order this request should try them: round-robin among those not
    /// ejected, then the ejected ones.
    pub fn rotation(&self) -> Vec<&Replica> {
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let n = self.replicas.len();
        let now = self.now_ms();
        let mut order: Vec<(bool, &Replica)> = (0..n)
            .map(|i| &self.replicas[(start + i) % n])
            .map(|r| (self.is_ejected(r, now), r))
            .collect();
        // Stable: round-robin order is kept within each group.
        order.sort_by_key(|(ejected, _)| *ejected);
        order.into_iter().map(|(_, r)| r).collect()
    }

    /// Skips `replica` for the ejection period; counts an ejection only when it was in.
    pub fn eject(&self, replica: &Replica) {
        if self.eject_for.is_zero() {
            return;
        }
        let now = self.now_ms();
        let until = now.saturating_add(self.eject_for.as_millis() as u64);
        let before = replica.ejected_until_ms.swap(until, Ordering::Relaxed);
        if before <= now {
            tracing::warn!(upstream = self.name, replica = %replica.base,
                eject_ms = self.eject_for.as_millis() as u64, "replica ejected");
            metrics::counter!("gateway_upstream_ejections_total", "upstream" => self.name,
                "replica" => replica.base.clone())
            .increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bases(upstreams: &Upstreams) -> Vec<String> {
        upstreams
            .rotation()
            .into_iter()
            .map(|r| r.base().to_string())
            .collect()
    }

    #[test]
    fn replicas_take_turns() {
        let up = Upstreams::new(
            "s",
            vec!["http://a".into(), "http://b/".into()],
            Duration::ZERO,
            PoolSettings::default(),
        );
        assert_eq!(bases(&up), ["http://a", "http://b"]);
        assert_eq!(bases(&up), ["http://b", "http://a"]);
    }

    #[test]
    fn an_ejected_replica_goes_last_until_its_time_is_up() {
        let up = Upstreams::new(
            "s",
            vec!["http://a".into(), "http://b".into()],
            Duration::from_millis(300),
            PoolSettings::default(),
        );
        up.eject(&up.replicas[0]);
        for _ in 0..4 {
            assert_eq!(bases(&up), ["http://b", "http://a"]);
        }
        // Back in turn once the period is over (polled: a busy machine may be late).
        let deadline = Instant::now() + Duration::from_secs(5);
        while bases(&up)[0] != "http://a" {
            assert!(Instant::now() < deadline, "never readmitted");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_replica_is_reached_at_its_authority() {
        let up = Upstreams::new(
            "s",
            vec![
                "http://seckill-api:8081/".into(),
                "http://127.0.0.1".into(),
                "http://[::1]:9000".into(),
            ],
            Duration::ZERO,
            PoolSettings::default(),
        );
        let seen: Vec<(&str, &str)> = up
            .replicas
            .iter()
            .map(|r| (r.pool.address(), r.pool.host()))
            .collect();
        assert_eq!(
            seen,
            [
                ("seckill-api:8081", "seckill-api:8081"),
                ("127.0.0.1:80", "127.0.0.1"),
                ("[::1]:9000", "[::1]:9000"),
            ]
        );
        assert_eq!(base_authority("https://a:1"), None);
        assert_eq!(base_authority("127.0.0.1:8081"), None);
    }

    #[test]
    fn a_zero_period_never_ejects() {
        let up = Upstreams::new(
            "s",
            vec!["http://a".into(), "http://b".into()],
            Duration::ZERO,
            PoolSettings::default(),
        );
        up.eject(&up.replicas[0]);
        assert!(!up.is_ejected(&up.replicas[0], up.now_ms()));
    }
}
