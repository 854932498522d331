//! The in-memory backend: one keyed GCRA limiter per quota, per replica.
//!
//! The limiter is tower_governor's (built by its `GovernorConfigBuilder`, so a quota means
//! here what it means to tower_governor), asked directly by the gateway's request path
//! instead of through tower_governor's `Service` wrapper: the verdict is needed before the
//! route is known to exist, and the same [`Decision`] comes from the Redis backend.

use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use tower_governor::governor::{GovernorConfig, GovernorConfigBuilder};
use tower_governor::key_extractor::KeyExtractor;

use super::quota::{Decision, QuotaSpec, RateKey};

/// The key type of the limiter. The gateway hands keys to the limiter itself, so this
/// extractor only names them; it never reads a request.
#[derive(Debug, Clone, Copy)]
pub struct ByRateKey;

impl KeyExtractor for ByRateKey {
    type Key = RateKey;

    fn name(&self) -> &'static str {
        "caller or client ip"
    }

    fn extract<T>(
        &self,
        _req: &axum::http::Request<T>,
    ) -> Result<RateKey, tower_governor::GovernorError> {
        Err(tower_governor::GovernorError::UnableToExtractKey)
    }

    fn key_name(&self, key: &RateKey) -> Option<String> {
        Some(key.to_string())
    }
}

type Config = GovernorConfig<ByRateKey, StateInformationMiddleware>;

/// One quota's keyed limiter.
#[derive(Clone)]
pub struct MemoryQuota {
    config: Arc<Config>,
}

impl MemoryQuota {
    /// The limiter for `spec`.
    pub fn new(spec: QuotaSpec) -> Self {
        // tower_governor's `per_second(n)` is the replenish *period*: a rate of n per second
        // is one token every 1/n s, set here as that period.
        let config = GovernorConfigBuilder::default()
            .key_extractor(ByRateKey)
            .use_headers()
            .period(Duration::from_micros(spec.interval_us()))
            .burst_size(spec.burst)
            .finish()
            .expect("QuotaSpec holds a positive rate and burst");
        Self {
            config: Arc::new(config),
        }
    }

    /// Charges one request to `key`.
    pub fn check(&self, key: &RateKey) -> Decision {
        match self.config.limiter().check_key(key) {
            Ok(snapshot) => Decision::Allowed {
                remaining: u64::from(snapshot.remaining_burst_capacity()),
            },
            Err(not_until) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Decision::Limited {
                    // Whole seconds, rounded up: no client is told to come back early.
                    retry_after_secs: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
                }
            }
        }
    }

    /// Forgets keys whose buckets are full again.
    pub fn forget_idle(&self) {
        self.config.limiter().retain_recent();
    }

    /// Shrinks the tables to the keys they hold: the memory of forgotten keys goes back.
    pub fn shrink(&self) {
        self.config.limiter().shrink_to_fit();
    }

    /// Keys with a bucket in memory now.
    pub fn keys(&self) -> usize {
        self.config.limiter().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_passes_then_the_next_request_waits_whole_seconds() {
        let quota = MemoryQuota::new(QuotaSpec {
            route: "t",
            per_sec: 1,
            burst: 2,
        });
        let alice = RateKey::User(1);
        assert!(matches!(
            quota.check(&alice),
            Decision::Allowed { remaining: 1 }
        ));
        assert!(matches!(
            quota.check(&alice),
            Decision::Allowed { remaining: 0 }
        ));
        assert!(matches!(
            quota.check(&alice),
            Decision::Limited {
                retry_after_secs: 1
            }
        ));
        // Another key has a bucket of its own.
        assert!(matches!(
            quota.check(&RateKey::User(2)),
            Decision::Allowed { remaining: 1 }
        ));
    }

    #[tokio::test]
    async fn a_crowd_of_one_shot_buyers_is_forgotten_once_their_buckets_refill() {
        // A flash sale's crowd: each buyer charged once, never again.
        let quota = MemoryQuota::new(QuotaSpec {
            route: "t",
            per_sec: 1000,
            burst: 2,
        });
        for user in 0..10_000 {
            assert!(matches!(
                quota.check(&RateKey::User(user)),
                Decision::Allowed { .. }
            ));
        }
        assert_eq!(quota.keys(), 10_000);
        // A bucket one request below full refills in 1 ms at this rate.
        seckill_testkit::eventually("every idle key forgotten", Duration::from_secs(5), || {
            quota.forget_idle();
            std::future::ready((quota.keys() == 0).then_some(()))
        })
        .await;
        // A key charged again starts over with a full bucket.
        assert!(matches!(
            quota.check(&RateKey::User(1)),
            Decision::Allowed { remaining: 1 }
        ));
    }
}
