//! Per-user and per-client rate limits (GCRA).
//!
//! A request is charged to its verified user when its token verified, and to its client
//! address otherwise (see [`crate::client_ip`]). The purchase route has its own
//! quota, everything else shares another. The buckets live in this process
//! ([`memory`], tower_governor) or, with `rate_limit_backend = "redis"`, in Redis so that
//! every replica enforces the same quotas ([`redis`], its own Redis if
//! `rate_limit_redis_url` says so; when Redis is down a request passes unmetered or, with
//! `rate_limit_redis_failure = "closed"`, gets a 503). IPv6 clients are charged per network
//! (`rate_limit_ipv6_prefix`, a /64 by default).
//!
//! Before a bearer token this process has not verified yet is checked in full (a signature
//! check: the dearest step of a request), its client address is charged against the
//! in-memory `unverified` pre-limit: a flood of garbage tokens from one address is refused
//! 429 after the pre-limit's burst without paying for more signature checks.
//!
//! Every response carries `x-ratelimit-limit` (the burst) and `x-ratelimit-remaining`; a 429
//! adds `Retry-After` and `x-ratelimit-reset`, both the whole seconds until the next request
//! would pass, rounded up so no client is told to come back early.
//!
//! Layout: [`quota`] — whom a request is charged to and against what; [`memory`] and
//! [`redis`] — the two places buckets live; `verdict` — the answer and its headers; here —
//! the quotas the settings ask for, and which one a request is charged to.

pub mod memory;
pub mod quota;
pub mod redis;
mod verdict;

use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
pub use crate::config::{RateLimitBackend, RateLimitFailure};
use memory::MemoryQuota;
use quota::Decision;
pub use quota::{QuotaSpec, RateKey};
use redis::RedisQuotas;

pub use verdict::Verdict;

/// How often idle in-memory keys are forgotten. A key can go once its bucket is full again
/// (governor's `retain_recent`): a one-shot buyer's after about two emission intervals of
/// its quota (100 ms at the default 20 purchases a second), so the keys held are the rate of
/// new buyers times that refill time plus this interval: at 45,000 buyers a second, some
/// 10,000 keys. Every new buyer's bucket is an insert into those tables, and with a sweep
/// every 10 s they held ten times more: under the sold-out flood the limiter took 4.7 % of
/// the gateway's CPU against 3.4 % now, and a million buyers took the gateway to 61 MB
/// against 49 MB (`docs/benchmarks.md`). A pass over them takes microseconds. Forgetting a
/// full bucket changes no verdict: a key charged again starts from the same full bucket.
pub const SWEEP_INTERVAL: Duration = Duration::from_millis(100);

/// How often the limiter's tables are shrunk to what they hold and freed memory is handed
/// back to the system ([`seckill_alloc::collect`]), here and by the workers: after a flood
/// of a million buyers the gateway is back near its idle size within this interval.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(10);

/// The gateway's quotas and where their buckets live, built from the settings.
#[derive(Clone)]
pub struct RateLimits {
    purchase: Option<QuotaSpec>,
    default: Option<QuotaSpec>,
    backend: Backend,
    /// The pre-limit on unverified tokens per client address, always in this process: it
    /// guards this replica's CPU, and must cost less than the signature check it saves.
    unverified: Option<(QuotaSpec, MemoryQuota)>,
    /// Leading bits of an IPv6 client address that name the client.
    ipv6_prefix: u8,
    /// What a request gets when the Redis backend cannot answer.
    on_failure: RateLimitFailure,
}

#[derive(Clone)]
enum Backend {
    Memory {
        purchase: Option<MemoryQuota>,
        default: Option<MemoryQuota>,
    },
    Redis(Arc<RedisQuotas>),
}

impl RateLimits {
    /// The quotas the settings ask for (none when `rate_limit_enabled` is false).
    pub async fn build(settings: &Settings) -> anyhow::Result<Self> {
        let enabled = settings.rate_limit_enabled;
        let purchase = QuotaSpec::new(
            "purchase",
            settings.rate_purchase_per_sec,
            settings.rate_purchase_burst,
        )
        .filter(|_| enabled);
        let default = QuotaSpec::new(
            "default",
            settings.rate_default_per_sec,
            settings.rate_default_burst,
        )
        .filter(|_| enabled);
        let backend = match settings.rate_limit_backend {
            _ if purchase.is_none() && default.is_none() => Backend::Memory {
                purchase: None,
                default: None,
            },
            RateLimitBackend::Memory => Backend::Memory {
                purchase: purchase.map(MemoryQuota::new),
                default: default.map(MemoryQuota::new),
            },
            RateLimitBackend::Redis => Backend::Redis(RedisQuotas::connect(settings).await?),
        };
        let unverified = QuotaSpec::new(
            "unverified",
            settings.rate_unverified_per_sec,
            settings.rate_unverified_burst,
        )
        .filter(|_| enabled)
        .map(|spec| (spec, MemoryQuota::new(spec)));
        Ok(Self {
            purchase,
            default,
            backend,
            unverified,
            ipv6_prefix: settings.rate_limit_ipv6_prefix,
            on_failure: settings.rate_limit_redis_failure,
        })
    }

    /// Forgets idle in-memory keys every [`SWEEP_INTERVAL`], and shrinks the tables every
    /// [`HOUSEKEEPING_INTERVAL`], until `cancel`: without it every user and address ever seen
    /// would stay in memory. (Redis buckets expire by themselves.)
    pub fn spawn_housekeeping(&self, cancel: CancellationToken) {
        let mut quotas: Vec<MemoryQuota> = self.unverified.iter().map(|(_, q)| q.clone()).collect();
        if let Backend::Memory { purchase, default } = &self.backend {
            quotas.extend([purchase, default].into_iter().flatten().cloned());
        }
        if quotas.is_empty() {
            return;
        }
        let sweeps_per_shrink =
            (HOUSEKEEPING_INTERVAL.as_millis() / SWEEP_INTERVAL.as_millis()).max(1);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for sweep in 1u128.. {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                quotas.iter().for_each(MemoryQuota::forget_idle);
                if sweep % sweeps_per_shrink == 0 {
                    quotas.iter().for_each(MemoryQuota::shrink);
                    // What the dropped buckets' tables held, and this thread freed, goes
                    // back (the workers, which made most of it, collect on their own tick).
                    seckill_alloc::collect();
                }
            }
        });
    }
}

impl RateLimits {
    /// The rate key of a client at `ip` (IPv6 by network, [`RateKey::client`]).
    pub fn client_key(&self, ip: std::net::IpAddr) -> RateKey {
        RateKey::client(ip, self.ipv6_prefix)
    }

    /// Charges `client` (a [`RateKey::Client`]) one request whose token is about to be
    /// verified in full.
    pub fn check_unverified(&self, client: &RateKey) -> Verdict {
        let Some((spec, quota)) = &self.unverified else {
            return Verdict::Unmetered;
        };
        Self::verdict(spec, quota.check(client), RateLimitFailure::Open)
    }

    /// Charges one request of `key` against the purchase quota or the default one.
    pub async fn check(&self, purchase: bool, key: RateKey) -> Verdict {
        let Some(spec) = (if purchase {
            self.purchase
        } else {
            self.default
        }) else {
            return Verdict::Unmetered;
        };
        let decision = match &self.backend {
            Backend::Memory {
                purchase: p,
                default: d,
            } => match if purchase { p } else { d } {
                Some(quota) => quota.check(&key),
                // Built together with the spec; absent only when every quota is off.
                None => return Verdict::Unmetered,
            },
            Backend::Redis(quotas) => quotas.check(&spec, &key).await,
        };
        Self::verdict(&spec, decision, self.on_failure)
    }

    fn verdict(spec: &QuotaSpec, decision: Decision, on_failure: RateLimitFailure) -> Verdict {
        match decision {
            Decision::Allowed { remaining } => Verdict::Allowed {
                limit: spec.burst,
                remaining,
            },
            Decision::Limited { retry_after_secs } => {
                metrics::counter!(crate::metrics::RATE_LIMITED, "route" => spec.route).increment(1);
                Verdict::Limited {
                    limit: spec.burst,
                    wait_secs: retry_after_secs.max(1),
                }
            }
            Decision::Unknown => match on_failure {
                RateLimitFailure::Open => Verdict::Unmetered,
                RateLimitFailure::Closed => Verdict::Unavailable,
            },
        }
    }
}

/// Whether the request is a purchase: `POST /api/seckill/{id}`, or with a waiting room's
/// pass `POST /api/seckill/{id}/{pass}` ([`crate::room::PurchasePath`]).
pub fn is_purchase(method: &Method, path: &str) -> bool {
    crate::room::PurchasePath::parse(method, path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_post_to_a_product_is_a_purchase() {
        assert!(is_purchase(&Method::POST, "/api/seckill/7"));
        assert!(!is_purchase(&Method::GET, "/api/seckill/7"));
        assert!(!is_purchase(&Method::POST, "/api/seckill/7/result"));
        assert!(is_purchase(
            &Method::POST,
            "/api/seckill/7/3.1700000060000.00ff"
        ));
        assert!(!is_purchase(&Method::POST, "/api/seckill/7/3/4"));
        assert!(!is_purchase(&Method::POST, "/api/seckill/7/"));
        assert!(!is_purchase(&Method::POST, "/api/seckill/"));
        assert!(!is_purchase(&Method::POST, "/api/orders/7"));
    }

    #[test]
    fn a_zero_rate_or_burst_switches_a_quota_off() {
        assert!(QuotaSpec::new("t", 0, 10).is_none());
        assert!(QuotaSpec::new("t", 10, 0).is_none());
        assert_eq!(
            QuotaSpec::new("t", 4, 1).map(|q| q.interval_us()),
            Some(250_000)
        );
    }

    #[tokio::test]
    async fn the_master_switch_turns_every_quota_off() {
        let off = RateLimits::build(&Settings {
            rate_limit_enabled: false,
            rate_limit_backend: RateLimitBackend::Redis,
            ..Settings::default()
        })
        .await
        .expect("build");
        assert!(off.purchase.is_none() && off.default.is_none());
        assert!(matches!(
            off.backend,
            Backend::Memory {
                purchase: None,
                default: None
            }
        ));
    }
}
