//! Per-user and per-client rate limits (GCRA).
//!
//! A request is charged to its verified user when [`crate::auth::identify`] found one, and to
//! its client address otherwise (see [`crate::client_ip`]). The purchase route has its own
//! quota, everything else shares another. The buckets live in this process
//! ([`memory`], tower_governor) or, with `rate_limit_backend = "redis"`, in Redis so that
//! every replica enforces the same quotas ([`redis`], failing open when Redis is down).
//!
//! Every answer carries `x-ratelimit-limit` (the burst) and `x-ratelimit-remaining`; a 429
//! adds `Retry-After` and `x-ratelimit-reset`, both the whole seconds until the next request
//! would pass, rounded up so no client is told to come back early.

pub mod memory;
pub mod redis;

use std::convert::Infallible;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};
use tower_governor::key_extractor::KeyExtractor;

use seckill_http::error_response;

use crate::Settings;
use memory::{CallerOrClientIp, Limited, MemoryQuota};
use redis::{Decision, RedisQuotas};

const X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Where the buckets live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateLimitBackend {
    /// In this process: each replica limits on its own.
    #[default]
    Memory,
    /// In Redis: the quotas hold across every replica sharing the Redis and namespace.
    Redis,
}

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
    fn new(route: &'static str, per_sec: u32, burst: u32) -> Option<Self> {
        (per_sec > 0 && burst > 0).then_some(Self {
            route,
            per_sec,
            burst,
        })
    }

    /// Time between two regained requests, microseconds.
    pub fn interval_us(&self) -> u64 {
        1_000_000 / u64::from(self.per_sec)
    }
}

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

impl<S: Clone> Layer<S> for RateLimits {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> RateLimit<S> {
        let routed = match &self.backend {
            Backend::Memory { purchase, default } => Routed::Memory {
                purchase: purchase.as_ref().map(|q| q.wrap(inner.clone())),
                default: default.as_ref().map(|q| q.wrap(inner.clone())),
            },
            Backend::Redis(quotas) => Routed::Redis(quotas.clone()),
        };
        RateLimit {
            purchase: self.purchase,
            default: self.default,
            routed,
            inner,
        }
    }
}

/// Sends each request through the quota of its route, or straight on when that is off.
#[derive(Clone)]
pub struct RateLimit<S> {
    purchase: Option<QuotaSpec>,
    default: Option<QuotaSpec>,
    routed: Routed<S>,
    inner: S,
}

#[derive(Clone)]
enum Routed<S> {
    Memory {
        purchase: Option<Limited<S>>,
        default: Option<Limited<S>>,
    },
    Redis(Arc<RedisQuotas>),
}

/// Whether the request is a purchase: `POST /api/seckill/{id}`, and nothing below it.
pub fn is_purchase(method: &Method, path: &str) -> bool {
    method == Method::POST
        && path
            .strip_prefix("/api/seckill/")
            .is_some_and(|id| !id.is_empty() && !id.contains('/'))
}

impl<S> Service<Request> for RateLimit<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Each call drives a clone to readiness itself (`oneshot`).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let purchase = is_purchase(request.method(), request.uri().path());
        let inner = self.inner.clone();
        match &self.routed {
            Routed::Memory {
                purchase: p,
                default: d,
            } => match if purchase { p } else { d } {
                Some(limited) => Box::pin(limited.clone().oneshot(request)),
                None => Box::pin(inner.oneshot(request)),
            },
            Routed::Redis(quotas) => {
                let Some(spec) = (if purchase {
                    self.purchase
                } else {
                    self.default
                }) else {
                    return Box::pin(inner.oneshot(request));
                };
                let Ok(key) = CallerOrClientIp.extract(&request) else {
                    return Box::pin(std::future::ready(Ok(no_key_response(spec.route))));
                };
                let quotas = quotas.clone();
                Box::pin(async move {
                    match quotas.check(&spec, &key).await {
                        Decision::Allowed { remaining } => {
                            let mut response = inner.oneshot(request).await?;
                            set_quota_headers(response.headers_mut(), spec.burst, remaining);
                            Ok(response)
                        }
                        Decision::Limited { retry_after_secs } => {
                            Ok(limited_response(spec, retry_after_secs))
                        }
                        Decision::Unknown => inner.oneshot(request).await,
                    }
                })
            }
        }
    }
}

fn set_quota_headers(headers: &mut HeaderMap, limit: u32, remaining: u64) {
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(remaining));
}

/// The JSON 429 of `spec`'s quota: come back in `wait_secs` (already rounded up).
fn limited_response(spec: QuotaSpec, wait_secs: u64) -> Response {
    metrics::counter!("gateway_rate_limited_total", "route" => spec.route).increment(1);
    let mut response = error_response(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        "too many requests, retry later",
    );
    let headers = response.headers_mut();
    set_quota_headers(headers, spec.burst, 0);
    let wait = HeaderValue::from(wait_secs.max(1));
    headers.insert(RETRY_AFTER, wait.clone());
    headers.insert(X_RATELIMIT_RESET, wait);
    response
}

/// A request [`crate::auth::identify`] left without caller or address: a wiring bug.
fn no_key_response(route: &'static str) -> Response {
    tracing::error!(
        route,
        "rate limit: request has no caller and no client address"
    );
    error_response(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error",
    )
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
