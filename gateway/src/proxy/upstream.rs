//! The replicas of one service: where they are, round-robin order, and passive ejection of
//! a replica that refused a connection.
//!
//! Each configured URL is a source of replicas. An IP literal is one replica, as written. A
//! host name is re-resolved every `upstream_resolve_interval_ms` (and soon after a connect
//! failure): every address it resolves to is a replica of its own, with its own connections
//! and ejection state; an address that left is taken out of the rotation and its connections
//! closed once the requests under way on it finish; a new one joins. A resolution that fails
//! or finds nothing keeps the last known addresses (until the first success, the name itself
//! is the replica, reached through the system resolver at connect time, as before).
//!
//! Ejection is passive: no health-check traffic, a replica is skipped for `eject_for` after a
//! refused or timed-out connect and is tried again once that has passed. An ejected replica
//! is still tried last when every other one failed too — better than a 503 without trying.
//!
//! The request path reads the replica set without a lock: each worker thread keeps its own
//! copy (its own `Arc`, so no reference count is shared between threads) and takes a new one
//! only when the set's generation changed.

use std::cell::RefCell;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::Uri;
use axum::http::uri::Authority;
use thread_local::ThreadLocal;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::pool::{Pool, PoolSettings};
use super::resolve::Resolve;

/// The least time between two resolutions of a service's names, however many connect
/// failures ask for one.
const MIN_RESOLVE_GAP: Duration = Duration::from_millis(250);

/// How long one resolution may take before it counts as failed.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// One replica: its address, its connections and how long it is ejected for.
#[derive(Debug)]
pub struct Replica {
    base: String,
    /// The address a name resolved to; `None` for a replica reached as configured.
    address: Option<SocketAddr>,
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
            address: None,
            ejected_until_ms: AtomicU64::new(0),
        }
    }

    /// A replica at `address`, one of those `authority`'s name resolved to.
    fn at(address: SocketAddr, authority: &Authority, pool: PoolSettings) -> Self {
        Self {
            base: format!("http://{address}"),
            address: Some(address),
            pool: Pool::at(address, authority, pool),
            ejected_until_ms: AtomicU64::new(0),
        }
    }

    /// The base URL, e.g. `http://127.0.0.1:8081` (for a resolved address, the address).
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

/// How a name's new addresses change its replicas.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// Addresses new to the rotation.
    pub added: Vec<SocketAddr>,
    /// Addresses that left it.
    pub removed: Vec<SocketAddr>,
    /// Addresses in both: their replicas (connections, ejection) stay as they are.
    pub kept: Vec<SocketAddr>,
}

impl Change {
    /// Whether the set is the same.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }
}

/// What changes from the `current` addresses to the `resolved` ones.
pub fn diff(current: &[SocketAddr], resolved: &[SocketAddr]) -> Change {
    let mut change = Change::default();
    for address in resolved {
        if current.contains(address) {
            change.kept.push(*address);
        } else if !change.added.contains(address) {
            change.added.push(*address);
        }
    }
    change.removed = current
        .iter()
        .filter(|a| !resolved.contains(a))
        .copied()
        .collect();
    change
}

/// One configured URL's replicas.
#[derive(Debug)]
enum Source {
    /// An IP literal (or a name not re-resolved): one replica, as configured.
    Fixed(Arc<Replica>),
    /// A host name: a replica per address it last resolved to.
    Named {
        host: String,
        port: u16,
        authority: Authority,
        replicas: Vec<Arc<Replica>>,
        /// False until the first successful resolution: then `replicas` is the name itself.
        resolved: bool,
    },
}

impl Source {
    fn new(base: &str, pool: PoolSettings, resolve_names: bool) -> Self {
        let replica = Arc::new(Replica::new(base, pool));
        let Some(authority) = base_authority(base) else {
            return Self::Fixed(replica);
        };
        let host = authority.host();
        let literal = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .is_ok();
        // `localhost` names this host whichever family answers: re-resolving it would make
        // 127.0.0.1 and ::1 two replicas, one of which an IPv4-bound backend always refuses.
        if literal || !resolve_names || host.eq_ignore_ascii_case("localhost") {
            return Self::Fixed(replica);
        }
        Self::Named {
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
            authority,
            replicas: vec![replica],
            resolved: false,
        }
    }

    fn replicas(&self) -> &[Arc<Replica>] {
        match self {
            Self::Fixed(replica) => std::slice::from_ref(replica),
            Self::Named { replicas, .. } => replicas,
        }
    }

    /// Takes `resolved` (non-empty) as the name's replicas; the change, if any.
    fn update(&mut self, mut resolved: Vec<SocketAddr>, pool: PoolSettings) -> Option<Change> {
        let Self::Named {
            authority,
            replicas,
            resolved: was_resolved,
            ..
        } = self
        else {
            return None;
        };
        resolved.sort_unstable();
        resolved.dedup();
        let current: Vec<SocketAddr> = replicas.iter().filter_map(|r| r.address).collect();
        let change = diff(&current, &resolved);
        if *was_resolved && change.is_empty() {
            return None;
        }
        *replicas = resolved
            .iter()
            .map(|address| {
                replicas
                    .iter()
                    .find(|r| r.address == Some(*address))
                    .cloned()
                    .unwrap_or_else(|| Arc::new(Replica::at(*address, authority, pool)))
            })
            .collect();
        *was_resolved = true;
        Some(change)
    }
}

/// A worker thread's copy of the replica set.
#[derive(Debug)]
struct Local {
    generation: u64,
    replicas: Arc<[Arc<Replica>]>,
}

/// The replicas of one service, picked round-robin.
#[derive(Debug)]
pub struct Upstreams {
    name: &'static str,
    next: AtomicUsize,
    eject_for: Duration,
    /// The clock ejection deadlines count from (an `Instant` cannot live in an atomic).
    epoch: Instant,
    pool: PoolSettings,
    /// Whether a source is a name to resolve.
    named: bool,
    /// The configured URLs' replicas; the resolver's to change.
    sources: Mutex<Vec<Source>>,
    /// The replicas in rotation, as last published.
    published: Mutex<Arc<[Arc<Replica>]>>,
    /// Bumped after each publication: a thread whose copy is older takes the new set.
    generation: AtomicU64,
    local: ThreadLocal<RefCell<Local>>,
    /// Wakes the resolver early (a connect failed).
    resolve_now: Notify,
}

impl Upstreams {
    /// Replicas of service `name` at `bases`, connected to as `pool` says; a replica that
    /// refuses a connection is skipped for `eject_for` (zero: never skipped). Host names
    /// are resolved by [`Upstreams::refresh`], which the task of
    /// [`Upstreams::start_resolver`] runs.
    pub fn new(
        name: &'static str,
        bases: Vec<String>,
        eject_for: Duration,
        pool: PoolSettings,
    ) -> Self {
        Self::with_names(name, bases, eject_for, pool, true)
    }

    /// As [`Upstreams::new`]; with `resolve_names` false, a host name stays one replica
    /// reached through the system resolver at connect time.
    pub fn with_names(
        name: &'static str,
        bases: Vec<String>,
        eject_for: Duration,
        pool: PoolSettings,
        resolve_names: bool,
    ) -> Self {
        let sources: Vec<Source> = bases
            .iter()
            .map(|b| Source::new(b, pool, resolve_names))
            .collect();
        let named = sources.iter().any(|s| matches!(s, Source::Named { .. }));
        let replicas: Arc<[Arc<Replica>]> =
            sources.iter().flat_map(Source::replicas).cloned().collect();
        metrics::gauge!(crate::metrics::UPSTREAM_ADDRESSES, "upstream" => name)
            .set(replicas.len() as f64);
        Self {
            name,
            next: AtomicUsize::new(0),
            eject_for,
            epoch: Instant::now(),
            pool,
            named,
            sources: Mutex::new(sources),
            published: Mutex::new(replicas),
            generation: AtomicU64::new(0),
            local: ThreadLocal::new(),
            resolve_now: Notify::new(),
        }
    }

    /// The service name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The replicas in rotation, as this thread last saw them (a new copy when the set
    /// changed since).
    fn replicas(&self) -> Arc<[Arc<Replica>]> {
        let generation = self.generation.load(Ordering::Acquire);
        let copy = || -> Arc<[Arc<Replica>]> {
            let published = self
                .published
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // A copy of the thread's own: its reference count is touched by it alone.
            published.iter().cloned().collect()
        };
        let local = self.local.get_or(|| {
            RefCell::new(Local {
                generation,
                replicas: copy(),
            })
        });
        let mut local = local.borrow_mut();
        if local.generation != generation {
            *local = Local {
                generation,
                replicas: copy(),
            };
        }
        local.replicas.clone()
    }

    /// The first replica.
    pub fn first(&self) -> Arc<Replica> {
        self.replicas()[0].clone()
    }

    /// Every replica in rotation (the readiness probe tries them in turn).
    pub fn all(&self) -> Arc<[Arc<Replica>]> {
        self.replicas()
    }

    /// How many replicas are in rotation.
    pub fn len(&self) -> usize {
        self.replicas().len()
    }

    /// Whether no replica is in rotation (never: a name keeps its last addresses).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    #[cfg(test)]
    fn is_ejected(&self, replica: &Replica, now_ms: u64) -> bool {
        replica.ejected_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// The replicas in the order this request should try them: round-robin among those not
    /// ejected, then the ejected ones.
    pub fn rotation(&self) -> Rotation {
        Rotation {
            replicas: self.replicas(),
            start: self.next.fetch_add(1, Ordering::Relaxed),
            now_ms: self.now_ms(),
            step: 0,
            skipped: 0,
        }
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
            metrics::counter!(crate::metrics::UPSTREAM_EJECTIONS, "upstream" => self.name,
                "replica" => replica.base.clone())
            .increment(1);
        }
    }

    /// Asks the resolver to look the names up again soon (a connect failed: the replica
    /// may have moved).
    pub fn resolve_soon(&self) {
        if self.named {
            self.resolve_now.notify_one();
        }
    }

    /// Resolves every host name once and puts the addresses found in rotation; whether
    /// the set changed. A name that fails to resolve, or resolves to nothing, keeps its
    /// last known addresses.
    pub async fn refresh(&self, resolver: &dyn Resolve) -> bool {
        let names: Vec<(usize, String, u16)> = self
            .sources
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .enumerate()
            .filter_map(|(i, source)| match source {
                Source::Named { host, port, .. } => Some((i, host.clone(), *port)),
                Source::Fixed(_) => None,
            })
            .collect();
        let mut found = Vec::with_capacity(names.len());
        for (index, host, port) in names {
            let result = tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(&host, port))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
            found.push((index, host, result));
        }
        let mut sources = self.sources.lock().unwrap_or_else(PoisonError::into_inner);
        let mut changed = false;
        for (index, host, result) in found {
            let outcome = match result {
                Ok(addresses) if !addresses.is_empty() => {
                    if let Some(change) = sources[index].update(addresses, self.pool) {
                        tracing::info!(upstream = self.name, host, added = ?change.added,
                            removed = ?change.removed, kept = change.kept.len(),
                            "upstream addresses changed");
                        changed = true;
                    }
                    "ok"
                }
                Ok(_) => {
                    tracing::warn!(
                        upstream = self.name,
                        host,
                        "upstream name resolved to no address; keeping the last known"
                    );
                    "empty"
                }
                Err(e) => {
                    tracing::warn!(upstream = self.name, host, error = %e,
                        "upstream name did not resolve; keeping the last known addresses");
                    "error"
                }
            };
            metrics::counter!(crate::metrics::UPSTREAM_RESOLUTIONS, "upstream" => self.name,
                "outcome" => outcome)
            .increment(1);
        }
        if changed {
            let replicas: Arc<[Arc<Replica>]> =
                sources.iter().flat_map(Source::replicas).cloned().collect();
            metrics::gauge!(crate::metrics::UPSTREAM_ADDRESSES, "upstream" => self.name)
                .set(replicas.len() as f64);
            *self
                .published
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = replicas;
            self.generation.fetch_add(1, Ordering::Release);
        }
        changed
    }

    /// Resolves the host names once (the service starts on their addresses, when found),
    /// then again every `interval` and soon after a connect failure, until `cancel`; does
    /// nothing without names or with a zero interval.
    pub async fn start_resolver(
        self: &Arc<Self>,
        resolver: Arc<dyn Resolve>,
        interval: Duration,
        cancel: CancellationToken,
    ) {
        if !self.named || interval.is_zero() {
            return;
        }
        self.refresh(&*resolver).await;
        let upstreams = self.clone();
        tokio::spawn(async move {
            loop {
                let earliest = tokio::time::Instant::now() + MIN_RESOLVE_GAP;
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(interval) => {}
                    () = upstreams.resolve_now.notified() => {}
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep_until(earliest) => {}
                }
                upstreams.refresh(&*resolver).await;
            }
        });
    }
}

/// One request's order of replicas ([`Upstreams::rotation`]): round-robin from its turn
/// among those not ejected, then the ejected ones. Allocates nothing: it holds the thread's
/// copy of the set and remembers which replicas it skipped (the first 64 in its order; any
/// further ones are tried in turn even when ejected).
#[derive(Debug)]
pub struct Rotation {
    replicas: Arc<[Arc<Replica>]>,
    start: usize,
    now_ms: u64,
    /// Positions visited: the first pass is `0..n`, the second `n..2n`.
    step: usize,
    /// Bit i: the replica at position i was skipped in the first pass (ejected).
    skipped: u64,
}

impl Rotation {
    /// The next replica to try, if any is left.
    pub fn next_replica(&mut self) -> Option<&Replica> {
        let n = self.replicas.len();
        while self.step < 2 * n {
            let (position, first_pass) = (self.step % n, self.step < n);
            self.step += 1;
            let at = (self.start % n + position) % n;
            let bit = 1u64.checked_shl(position as u32).unwrap_or(0);
            if first_pass {
                let ejected =
                    self.replicas[at].ejected_until_ms.load(Ordering::Relaxed) > self.now_ms;
                if ejected && bit != 0 {
                    self.skipped |= bit;
                    continue;
                }
                return Some(&self.replicas[at]);
            }
            if self.skipped & bit != 0 {
                return Some(&self.replicas[at]);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bases(upstreams: &Upstreams) -> Vec<String> {
        let mut rotation = upstreams.rotation();
        let mut bases = Vec::new();
        while let Some(replica) = rotation.next_replica() {
            bases.push(replica.base().to_string());
        }
        bases
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
        up.eject(&up.replicas()[0]);
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
        let seen: Vec<(String, String)> = up
            .replicas()
            .iter()
            .map(|r| (r.pool.address().to_string(), r.pool.host().to_string()))
            .collect();
        let expected = [
            ("seckill-api:8081", "seckill-api:8081"),
            ("127.0.0.1:80", "127.0.0.1"),
            ("[::1]:9000", "[::1]:9000"),
        ]
        .map(|(a, h)| (a.to_string(), h.to_string()));
        assert_eq!(seen, expected);
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
        up.eject(&up.replicas()[0]);
        assert!(!up.is_ejected(&up.replicas()[0], up.now_ms()));
    }

    /// A resolver answering from a list the test changes; `None`: a failure.
    #[derive(Debug, Default)]
    struct Scripted(Mutex<Option<Vec<SocketAddr>>>);

    impl Scripted {
        fn answer(&self, last_octets: &[u8]) {
            let addresses = last_octets
                .iter()
                .map(|o| SocketAddr::from(([127, 0, 0, *o], 8081)))
                .collect();
            *self.0.lock().unwrap() = Some(addresses);
        }

        fn fail(&self) {
            *self.0.lock().unwrap() = None;
        }
    }

    impl Resolve for Scripted {
        fn resolve<'a>(
            &'a self,
            host: &'a str,
            port: u16,
        ) -> super::super::resolve::Resolution<'a> {
            assert_eq!((host, port), ("api.test", 8081));
            let answer = self.0.lock().unwrap().clone();
            Box::pin(async move { answer.ok_or_else(|| std::io::Error::other("SERVFAIL")) })
        }
    }

    fn addresses(octets: &[u8]) -> Vec<SocketAddr> {
        octets
            .iter()
            .map(|o| SocketAddr::from(([127, 0, 0, *o], 80)))
            .collect()
    }

    #[test]
    fn a_diff_tells_added_removed_and_kept_addresses() {
        let change = diff(&addresses(&[2, 3, 4]), &addresses(&[3, 5, 4, 5]));
        assert_eq!(
            change,
            Change {
                added: addresses(&[5]),
                removed: addresses(&[2]),
                kept: addresses(&[3, 4]),
            }
        );
        assert!(diff(&addresses(&[2, 3]), &addresses(&[3, 2])).is_empty());
        assert_eq!(diff(&[], &addresses(&[2])).added, addresses(&[2]));
    }

    #[tokio::test]
    async fn a_name_becomes_a_replica_per_address_and_follows_its_changes() {
        let up = Upstreams::new(
            "s",
            vec!["http://api.test:8081".into(), "http://127.0.0.9:1".into()],
            Duration::from_secs(60),
            PoolSettings::default(),
        );
        // Until resolved, the name itself is the replica.
        assert_eq!(up.len(), 2);
        assert_eq!(up.first().base(), "http://api.test:8081");
        let resolver = Scripted::default();
        resolver.answer(&[3, 2, 3]);
        assert!(up.refresh(&resolver).await);
        let mut seen = bases(&up);
        seen.sort();
        assert_eq!(
            seen,
            [
                "http://127.0.0.2:8081",
                "http://127.0.0.3:8081",
                "http://127.0.0.9:1"
            ]
        );
        // Every address is reached at its own address, with the name as Host.
        let first = up.first();
        assert_eq!(
            (first.pool().address(), first.pool().host()),
            ("127.0.0.2:8081", "api.test:8081")
        );
        // Ejection state stays with an address that stays; a new address joins fresh.
        let kept = up.replicas()[1].clone();
        assert_eq!(kept.base(), "http://127.0.0.3:8081");
        up.eject(&kept);
        resolver.answer(&[3, 4]);
        assert!(up.refresh(&resolver).await);
        let now = up.replicas();
        let bases_now: Vec<&str> = now.iter().map(|r| r.base()).collect();
        assert_eq!(
            bases_now,
            [
                "http://127.0.0.3:8081",
                "http://127.0.0.4:8081",
                "http://127.0.0.9:1"
            ]
        );
        assert!(
            Arc::ptr_eq(&now[0], &kept),
            "the same replica, not a new one"
        );
        assert!(up.is_ejected(&now[0], up.now_ms()));
        assert!(!up.is_ejected(&now[1], up.now_ms()));
        // The same set again changes nothing; a failure or an empty answer keeps the set.
        assert!(!up.refresh(&resolver).await);
        resolver.fail();
        assert!(!up.refresh(&resolver).await);
        resolver.answer(&[]);
        assert!(!up.refresh(&resolver).await);
        assert_eq!(up.len(), 3);
    }

    #[tokio::test]
    async fn a_departed_address_is_dropped_once_no_thread_holds_it() {
        let up = Upstreams::new(
            "s",
            vec!["http://api.test:8081".into()],
            Duration::ZERO,
            PoolSettings::default(),
        );
        let resolver = Scripted::default();
        resolver.answer(&[2, 3]);
        up.refresh(&resolver).await;
        let leaving = Arc::downgrade(&up.replicas()[0]);
        // A request under way keeps it until it finishes.
        let in_flight = up.rotation();
        resolver.answer(&[3]);
        up.refresh(&resolver).await;
        assert_eq!(bases(&up), ["http://127.0.0.3:8081"]);
        assert!(leaving.upgrade().is_some(), "still used by the request");
        drop(in_flight);
        assert!(leaving.upgrade().is_none(), "its pool is gone with it");
    }

    #[test]
    fn an_ip_literal_is_never_resolved() {
        let up = Upstreams::new(
            "s",
            vec!["http://127.0.0.1:1".into(), "http://[::1]:2".into()],
            Duration::ZERO,
            PoolSettings::default(),
        );
        assert!(!up.named);
        let by_name = Upstreams::with_names(
            "s",
            vec!["http://api.test:1".into()],
            Duration::ZERO,
            PoolSettings::default(),
            false,
        );
        assert!(!by_name.named);
    }

    #[test]
    fn a_rotation_tries_every_replica_once_even_when_ejected_during_it() {
        let up = Upstreams::new(
            "s",
            vec!["http://a".into(), "http://b".into(), "http://c".into()],
            Duration::from_secs(60),
            PoolSettings::default(),
        );
        up.eject(&up.replicas()[1]);
        let mut rotation = up.rotation();
        let mut tried = Vec::new();
        while let Some(replica) = rotation.next_replica() {
            // As the proxy does after a refused connect.
            up.eject(replica);
            tried.push(replica.base().to_string());
        }
        assert_eq!(tried, ["http://a", "http://c", "http://b"]);
    }
}
