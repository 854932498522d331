//! How fast redrives go: a GCRA limiter (`governor`), so a large redrive cannot flood the
//! queue and the database it feeds.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

/// Paces redrives: `rate` per second, up to `burst` at once after a quiet spell; shared by
/// the concurrent redrives of one process.
#[derive(Debug)]
pub struct RedrivePace {
    limiter: RateLimiter<NotKeyed, InMemoryState, TokioClock, NoOpMiddleware<std::time::Instant>>,
}

impl RedrivePace {
    /// `rate` per second (at least one per 1000 s), bursts of up to `burst` (at least one; a
    /// fraction is dropped), starting with the whole burst available.
    pub fn new(rate: f64, burst: f64) -> Self {
        // One cell per period: the token bucket's rate, as GCRA states it.
        let period = Duration::from_secs_f64(1.0 / rate.max(0.001)).max(Duration::from_nanos(1));
        let burst = NonZeroU32::new(burst.max(1.0) as u32).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(period)
            .expect("a period of at least a nanosecond")
            .allow_burst(burst);
        Self {
            limiter: RateLimiter::direct_with_clock(quota, TokioClock),
        }
    }

    /// Waits until one more redrive may go, and counts it.
    pub async fn take(&self) {
        while let Err(not_until) = self.limiter.check() {
            tokio::time::sleep(not_until.wait_time_from(TokioClock.now())).await;
        }
    }
}

/// Tokio's clock, so that waits and the limiter agree, and a test with paused time runs
/// the limiter on that time.
#[derive(Debug, Clone, Copy, Default)]
struct TokioClock;

impl Clock for TokioClock {
    type Instant = std::time::Instant;

    fn now(&self) -> Self::Instant {
        tokio::time::Instant::now().into_std()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_redrive_pace_allows_its_burst_then_its_rate() {
        let pace = RedrivePace::new(10.0, 5.0);
        let start = tokio::time::Instant::now();
        for _ in 0..5 {
            pace.take().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        for _ in 0..10 {
            pace.take().await;
        }
        let waited = start.elapsed().as_secs_f64();
        assert!(
            (0.99..1.1).contains(&waited),
            "10 more at 10/s took {waited}s"
        );
    }
}
