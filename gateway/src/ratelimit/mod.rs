//! Per-user and per-client rate limits (GCRA).
//!
//! A request is charged to its verified user when its token verified, and to its client
//! address otherwise (see [`crate::client_ip`]). The purchase route has its own
//! quota, everything else shares another. The buckets live in this process
//! ([`memory`], tower_governor) or, with `rate_limit_backend = "redis"`, in Redis so that
//! every replica enforces the same quotas ([`redis`], failing open when Redis is down).
//!
//! Every response carries `x-ratelimit-limit` (the burst) and `x-ratelimit-remaining`; a 429
//! adds `Retry-After` and `x-ratelimit-reset`, both the whole seconds until the next request
//! would pass, rounded up so no client is told to come back early.
//!
//! Layout: [`quota`] — whom a request is charged to and against what; [`memory`] and
//! [`redis`] — the two places buckets live; here — the verdict and its headers.

pub mod memory;
pub mod quota;
pub mod redis;

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use tokio_util::sync::CancellationToken;

pub use crate::config::RateLimitBackend;
use crate::config::Settings;
use crate::http1::Response;
use crate::refusal;
use memory::MemoryQuota;
use quota::Decision;
pub use quota::{QuotaSpec, RateKey};
use redis::RedisQuotas;

const X_RATELIMIT_LIMIT: &[u8] = b"x-ratelimit-limit";
const X_RATELIMIT_REMAINING: &[u8] = b"x-ratelimit-remaining";
const X_RATELIMIT_RESET: &[u8] = b"x-ratelimit-reset";
const RETRY_AFTER: &[u8] = b"retry-after";

/// The gateway's two quotas and where their buckets live, built from the settings.
#[derive(Clone)]
pub struct RateLimits {
    purchase: Option<QuotaSpec>,
    default: Option<QuotaSpec>,
    backend: Backend,
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
        Ok(Self {
            purchase,
            default,
            backend,
        })
    }

    /// Forgets idle in-memory keys once a minute until `cancel`: without it every user and
    /// address ever seen would stay in memory. (Redis buckets expire by themselves.)
    pub fn spawn_housekeeping(&self, cancel: CancellationToken) {
        let Backend::Memory { purchase, default } = &self.backend else {
            return;
        };
        let quotas: Vec<MemoryQuota> = [purchase, default].into_iter().flatten().cloned().collect();
        if quotas.is_empty() {
            return;
        }
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(60));
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tick.tick() => {}
                }
                quotas.iter().for_each(MemoryQuota::forget_idle);
            }
        });
    }
}

/// What a quota says about one request.
#[derive(Debug)]
pub enum Verdict {
    /// Let through; the response carries the quota's headers.
    Allowed {
        /// The burst, for `x-ratelimit-limit`.
        limit: u32,
        /// Requests left right now, for `x-ratelimit-remaining`.
        remaining: u64,
    },
    /// Refused: a 429.
    Limited {
        /// The burst, for `x-ratelimit-limit`.
        limit: u32,
        /// Whole seconds until the next request would pass (already rounded up, at least 1),
        /// for `Retry-After` and `x-ratelimit-reset`.
        wait_secs: u64,
    },
    /// No quota applies (switched off), or its Redis did not answer (fail open).
    Unmetered,
}

impl Verdict {
    /// Puts the quota's headers on a response: `x-ratelimit-limit` and `-remaining`, and on a
    /// refusal `Retry-After` and `x-ratelimit-reset` too.
    pub fn annotate(&self, response: &mut Response) {
        let mut number = itoa::Buffer::new();
        let (limit, remaining, wait_secs) = match *self {
            Self::Allowed { limit, remaining } => (limit, remaining, None),
            Self::Limited { limit, wait_secs } => (limit, 0, Some(wait_secs)),
            Self::Unmetered => return,
        };
        response.push_header(X_RATELIMIT_LIMIT, number.format(limit).as_bytes());
        response.push_header(X_RATELIMIT_REMAINING, number.format(remaining).as_bytes());
        if let Some(wait) = wait_secs {
            response.push_header(RETRY_AFTER, number.format(wait).as_bytes());
            response.push_header(X_RATELIMIT_RESET, number.format(wait).as_bytes());
        }
    }

    /// The JSON 429 when the request was refused, with the quota's headers.
    pub fn refusal(&self) -> Option<Response> {
        let Self::Limited { .. } = self else {
            return None;
        };
        let mut response = refusal::error(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many requests, retry later",
        );
        self.annotate(&mut response);
        Some(response)
    }
}

impl RateLimits {
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
        match decision {
            Decision::Allowed { remaining } => Verdict::Allowed {
                limit: spec.burst,
                remaining,
            },
            Decision::Limited { retry_after_secs } => {
                metrics::counter!("gateway_rate_limited_total", "route" => spec.route).increment(1);
                Verdict::Limited {
                    limit: spec.burst,
                    wait_secs: retry_after_secs.max(1),
                }
            }
            Decision::Unknown => Verdict::Unmetered,
        }
    }
}

/// Whether the request is a purchase: `POST /api/seckill/{id}`, and nothing below it.
pub fn is_purchase(method: &Method, path: &str) -> bool {
    method == Method::POST
        && path
            .strip_prefix("/api/seckill/")
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_post_to_a_product_is_a_purchase() {
        assert!(is_purchase(&Method::POST, "/api/seckill/7"));
        assert!(!is_purchase(&Method::GET, "/api/seckill/7"));
        assert!(!is_purchase(&Method::POST, "/api/seckill/7/result"));
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
