//! What to do with a message that failed, and how much retrying the service allows itself.
//!
//! Three kinds of failure, three answers:
//! - **permanent** (no valid signature, unparseable body, unknown product, no database
//!   stock): dead-letter at once, with the reason in the `x-error-code` header; retrying
//!   cannot help;
//! - **transient, this message** (a lock wait that timed out, a deadlock, a serialization
//!   failure): publish it to the next retry tier (a queue whose TTL dead-letters it back to
//!   the main exchange), `x-attempt` + 1; after `max_attempts` it is dead-lettered as
//!   `retries_exhausted`;
//! - **infrastructure** (the database or Redis unreachable): requeue after a delay without
//!   counting an attempt. An outage is not the message's fault, and counting it would push
//!   every message of a long outage into the dead-letter queue.
//!
//! A [`RetryBudget`] keeps a storm of failures from multiplying the load: retries may add
//! at most `ratio` of the traffic (plus a small floor); past it a message still gets its
//! retry, but in the longest tier, so load is delayed rather than multiplied.

use std::sync::Mutex;
use std::time::Instant;

/// Where a failed message goes next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Publish to the retry tier waiting `delay_ms`, as attempt `attempt`.
    Retry {
        /// The tier's delay.
        delay_ms: u64,
        /// The attempt number the message will carry.
        attempt: u32,
    },
    /// Give up: dead-letter it.
    GiveUp,
}

/// The retry policy: tiers, cap and budget.
#[derive(Debug)]
pub struct RetryPolicy {
    tiers_ms: Vec<u64>,
    max_attempts: u32,
    budget: RetryBudget,
}

impl RetryPolicy {
    /// Tiers shortest first (at least one); `max_attempts` counts the first delivery too.
    pub fn new(tiers_ms: Vec<u64>, max_attempts: u32, budget: RetryBudget) -> Self {
        assert!(!tiers_ms.is_empty(), "at least one retry tier");
        Self {
            tiers_ms,
            max_attempts,
            budget,
        }
    }

    /// Counts a first delivery: it earns the budget its share of retries.
    pub fn record_first_attempts(&self, count: usize) {
        self.budget.deposit(count);
    }

    /// Where a message that failed on attempt `attempt` (0 = first delivery) goes next:
    /// tier `attempt` (exponential tiers), sometimes one tier later (jitter, so messages
    /// that failed together do not come back together), the last tier when the budget is
    /// spent, nowhere past the cap.
    pub fn next(&self, attempt: u32) -> Next {
        let attempt = attempt + 1;
        if attempt >= self.max_attempts {
            return Next::GiveUp;
        }
        let last = self.tiers_ms.len() - 1;
        let mut tier = (attempt as usize - 1).min(last);
        if tier < last && rand::random_bool(0.25) {
            tier += 1;
        }
        if !self.budget.try_withdraw() {
            metrics::counter!("orders_retry_budget_exhausted_total").increment(1);
            tier = last;
        }
        Next::Retry {
            delay_ms: self.tiers_ms[tier],
            attempt,
        }
    }
}

/// A token bucket of retries: `ratio` tokens per first delivery, `min_per_sec` more per
/// second; it starts with one second's floor and saves up at most ten seconds' floor plus a
/// thousand first deliveries' worth.
#[derive(Debug)]
pub struct RetryBudget {
    ratio: f64,
    min_per_sec: f64,
    cap: f64,
    state: Mutex<(f64, Instant)>,
}

impl RetryBudget {
    /// A budget holding one second's floor (at least one retry).
    pub fn new(ratio: f64, min_per_sec: f64) -> Self {
        let cap = (min_per_sec * 10.0).max(1.0) + ratio * 1000.0;
        Self {
            ratio,
            min_per_sec,
            cap,
            state: Mutex::new((min_per_sec.max(1.0), Instant::now())),
        }
    }

    fn deposit(&self, first_attempts: usize) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 = (state.0 + self.ratio * first_attempts as f64).min(self.cap);
    }

    fn try_withdraw(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(state.1).as_secs_f64() * self.min_per_sec;
        state.0 = (state.0 + refill).min(self.cap);
        state.1 = now;
        if state.0 >= 1.0 {
            state.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_climb_the_tiers_and_stop_at_the_cap() {
        let policy = RetryPolicy::new(vec![10, 100, 1000], 4, RetryBudget::new(1.0, 1000.0));
        for _ in 0..50 {
            let Next::Retry { delay_ms, attempt } = policy.next(0) else {
                panic!("first failure retries");
            };
            assert_eq!(attempt, 1);
            assert!(delay_ms == 10 || delay_ms == 100, "tier 0 or, jittered, 1");
            let Next::Retry { delay_ms, attempt } = policy.next(2) else {
                panic!("third failure retries");
            };
            assert_eq!(attempt, 3);
            assert_eq!(delay_ms, 1000, "capped at the last tier");
        }
        assert_eq!(policy.next(3), Next::GiveUp);
    }

    #[test]
    fn a_spent_budget_sends_retries_to_the_longest_tier() {
        // No floor, 10 % of traffic: 100 first deliveries earn 10 retries beyond the start.
        let budget = RetryBudget::new(0.1, 0.0);
        let policy = RetryPolicy::new(vec![10, 20, 30_000], 10, budget);
        let mut longest = 0;
        for _ in 0..100 {
            if let Next::Retry {
                delay_ms: 30_000, ..
            } = policy.next(0)
            {
                longest += 1;
            }
        }
        // The starting budget allows one; jitter never reaches tier 2 from tier 0.
        assert_eq!(longest, 99);
        policy.record_first_attempts(100);
        let earned = (0..20)
            .filter(|_| {
                !matches!(
                    policy.next(0),
                    Next::Retry {
                        delay_ms: 30_000,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(earned, 10);
    }
}
