//! A circuit breaker around the database, with resilience4j's semantics.
//!
//! - **Closed**: calls pass; each outcome (failure, and slow if it took longer than
//!   `slow_call_duration`) enters a sliding window, count-based (the last N calls) or
//!   time-based (the calls of the last N seconds). Once the window holds at least
//!   `minimum_calls`, a failure rate or a slow-call rate at or above its threshold opens it.
//! - **Open**: calls are refused for `wait_in_open`; then it is half-open.
//! - **Half-open**: `permitted_in_half_open` calls pass (others are refused); when they have
//!   all finished, their rates decide: over a threshold → open again, else closed.
//! - **Forced open / forced closed**: an operator's override (shared by every replica through
//!   Redis, see `forced`), which holds until the operator returns the breaker to automatic.
//!
//! While it refuses calls the consumer pauses (see `consumer`): it stops taking messages, so
//! they wait in the queue, neither acked nor dead-lettered. Every transition is logged and
//! exported (`order_breaker_state`, `order_breaker_transitions_total`).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::metrics as names;

/// Where the breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BreakerState)]
pub enum State {
    /// Calls pass.
    Closed,
    /// Calls are refused until the wait is over.
    Open,
    /// A few trial calls pass.
    HalfOpen,
    /// Refused by an operator.
    ForcedOpen,
    /// Passed by an operator, whatever happens.
    ForcedClosed,
}

impl State {
    /// Whether the consumer should stop taking messages.
    pub fn pauses(self) -> bool {
        matches!(self, Self::Open | Self::ForcedOpen)
    }

    /// The state as a metric label (`closed`, `half_open`, `forced_open`…).
    pub fn label(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
            Self::ForcedOpen => "forced_open",
            Self::ForcedClosed => "forced_closed",
        }
    }

    fn gauge(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::Open => 1.0,
            Self::HalfOpen => 2.0,
            Self::ForcedOpen => 3.0,
            Self::ForcedClosed => 4.0,
        }
    }
}

/// The transitions the breaker makes on its own (an operator's force adds others): their
/// counters exist from start-up, at zero.
pub const AUTOMATIC_TRANSITIONS: [(State, State); 4] = [
    (State::Closed, State::Open),
    (State::Open, State::HalfOpen),
    (State::HalfOpen, State::Open),
    (State::HalfOpen, State::Closed),
];

/// Registers the counters of [`AUTOMATIC_TRANSITIONS`] at zero, so the alert on an opening
/// breaker has a series to read before the first one.
pub fn register_transition_counters() {
    for (from, to) in AUTOMATIC_TRANSITIONS {
        metrics::counter!(names::BREAKER_TRANSITIONS, "from" => from.label(), "to" => to.label())
            .increment(0);
    }
}

/// How the window is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// The last N calls.
    Count(usize),
    /// The calls of the last duration.
    Time(Duration),
}

/// The breaker's settings.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The sliding window.
    pub window: Window,
    /// Calls the window must hold before the rates count.
    pub minimum_calls: usize,
    /// Failure rate (percent) that opens the breaker.
    pub failure_rate_threshold: f64,
    /// Slow-call rate (percent) that opens the breaker.
    pub slow_call_rate_threshold: f64,
    /// A call slower than this is slow.
    pub slow_call_duration: Duration,
    /// How long the breaker stays open before trying again.
    pub wait_in_open: Duration,
    /// Trial calls in half-open.
    pub permitted_in_half_open: usize,
}

/// The right to make one call; report how it went with [`CircuitBreaker::record`].
///
/// A trial call's permit dropped without an outcome (the batch held nothing to write, or
/// its handler panicked) gives its trial back: otherwise half-open would wait forever for
/// an outcome that never comes, refusing every call.
#[derive(Debug)]
#[must_use = "record the call's outcome"]
pub struct Permit<'a> {
    breaker: &'a CircuitBreaker,
    started: Instant,
    /// The half-open round this is a trial call of, if any.
    trial_of: Option<u64>,
    recorded: bool,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if let (false, Some(round)) = (self.recorded, self.trial_of) {
            self.breaker.give_back_trial(round);
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Call {
    at: Instant,
    failed: bool,
    slow: bool,
}

#[derive(Debug)]
struct Inner {
    state: State,
    window: VecDeque<Call>,
    opened_at: Instant,
    half_open_started: usize,
    half_open_calls: Vec<Call>,
    /// Counts the times the breaker went half-open: a trial's outcome counts only in its
    /// own round.
    half_open_round: u64,
    /// The state to go back to when a force is lifted.
    forced: Option<State>,
}

/// The breaker; share it behind an `Arc`.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: Config,
    inner: Mutex<Inner>,
    changes: watch::Sender<State>,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: Config) -> Self {
        metrics::gauge!(names::BREAKER_STATE).set(State::Closed.gauge());
        Self {
            config,
            inner: Mutex::new(Inner {
                state: State::Closed,
                window: VecDeque::new(),
                opened_at: Instant::now(),
                half_open_started: 0,
                half_open_calls: Vec::new(),
                half_open_round: 0,
                forced: None,
            }),
            changes: watch::channel(State::Closed).0,
        }
    }

    /// The current state (an open breaker whose wait is over reads as half-open).
    pub fn state(&self) -> State {
        let mut inner = self.lock();
        self.expire_open(&mut inner);
        inner.state
    }

    /// Notified on every transition.
    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.changes.subscribe()
    }

    /// A permit for one call, or `None` when the breaker refuses it.
    pub fn try_acquire(&self) -> Option<Permit<'_>> {
        let mut inner = self.lock();
        self.expire_open(&mut inner);
        let trial_of = match inner.state {
            State::Closed | State::ForcedClosed => None,
            State::HalfOpen if inner.half_open_started < self.config.permitted_in_half_open => {
                inner.half_open_started += 1;
                Some(inner.half_open_round)
            }
            State::HalfOpen | State::Open | State::ForcedOpen => return None,
        };
        Some(Permit {
            breaker: self,
            started: Instant::now(),
            trial_of,
            recorded: false,
        })
    }

    /// Reports a call's outcome.
    pub fn record(&self, mut permit: Permit<'_>, failed: bool) {
        permit.recorded = true;
        let now = Instant::now();
        let call = Call {
            at: now,
            failed,
            slow: now.duration_since(permit.started) >= self.config.slow_call_duration,
        };
        let mut inner = self.lock();
        match inner.state {
            State::Closed => {
                inner.window.push_back(call);
                self.trim(&mut inner.window, now);
                if self.over_threshold(inner.window.iter()) {
                    self.open(&mut inner, "threshold exceeded");
                }
            }
            State::HalfOpen if permit.trial_of == Some(inner.half_open_round) => {
                inner.half_open_calls.push(call);
                if inner.half_open_calls.len() >= self.config.permitted_in_half_open {
                    let calls = std::mem::take(&mut inner.half_open_calls);
                    if self.rates_exceeded(calls.iter()) {
                        self.open(&mut inner, "trial calls failed");
                    } else {
                        inner.window.clear();
                        self.transition(&mut inner, State::Closed, "trial calls passed");
                    }
                }
            }
            // Forced states ignore outcomes; a late outcome of an earlier state is stale.
            _ => {}
        }
    }

    /// An operator's override: `Some(ForcedOpen | ForcedClosed)` forces, `None` returns to
    /// automatic (closed, with an empty window). Other states are ignored.
    pub fn force(&self, forced: Option<State>) {
        let mut inner = self.lock();
        match forced {
            Some(state @ (State::ForcedOpen | State::ForcedClosed)) if inner.state != state => {
                if inner.forced.is_none() {
                    inner.forced = Some(inner.state);
                }
                self.transition(&mut inner, state, "forced by an operator");
            }
            None if inner.forced.is_some() => {
                inner.forced = None;
                inner.window.clear();
                self.transition(&mut inner, State::Closed, "returned to automatic");
            }
            _ => {}
        }
    }

    /// A trial call of half-open round `round` ended without an outcome: another may run.
    fn give_back_trial(&self, round: u64) {
        let mut inner = self.lock();
        if inner.state == State::HalfOpen && inner.half_open_round == round {
            inner.half_open_started = inner.half_open_started.saturating_sub(1);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn expire_open(&self, inner: &mut Inner) {
        if inner.state == State::Open && inner.opened_at.elapsed() >= self.config.wait_in_open {
            inner.half_open_started = 0;
            inner.half_open_calls.clear();
            inner.half_open_round += 1;
            self.transition(inner, State::HalfOpen, "wait in open is over");
        }
    }

    fn open(&self, inner: &mut Inner, why: &'static str) {
        inner.opened_at = Instant::now();
        inner.window.clear();
        self.transition(inner, State::Open, why);
    }

    fn transition(&self, inner: &mut Inner, to: State, why: &'static str) {
        let from = inner.state;
        inner.state = to;
        tracing::warn!(?from, ?to, why, "circuit breaker transition");
        metrics::gauge!(names::BREAKER_STATE).set(to.gauge());
        metrics::counter!(names::BREAKER_TRANSITIONS, "from" => from.label(), "to" => to.label())
            .increment(1);
        self.changes.send_replace(to);
        // A timer wakes waiters when the open wait is over, so a paused consumer resumes
        // without polling.
        if to == State::Open {
            let wait = self.config.wait_in_open;
            let changes = self.changes.clone();
            let opened_at = inner.opened_at;
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                changes.send_if_modified(|state| {
                    // Only nudge subscribers; `state()` performs the transition itself.
                    *state == State::Open && opened_at.elapsed() >= wait
                });
            });
        }
    }

    fn trim(&self, window: &mut VecDeque<Call>, now: Instant) {
        match self.config.window {
            Window::Count(size) => {
                while window.len() > size {
                    window.pop_front();
                }
            }
            Window::Time(span) => {
                while window
                    .front()
                    .is_some_and(|c| now.duration_since(c.at) > span)
                {
                    window.pop_front();
                }
            }
        }
    }

    fn over_threshold<'a>(&self, calls: impl ExactSizeIterator<Item = &'a Call> + Clone) -> bool {
        calls.len() >= self.config.minimum_calls && self.rates_exceeded(calls)
    }

    fn rates_exceeded<'a>(&self, calls: impl ExactSizeIterator<Item = &'a Call> + Clone) -> bool {
        let total = calls.len();
        if total == 0 {
            return false;
        }
        let failed = calls.clone().filter(|c| c.failed).count();
        let slow = calls.filter(|c| c.slow).count();
        let rate = |n: usize| n as f64 * 100.0 / total as f64;
        rate(failed) >= self.config.failure_rate_threshold
            || rate(slow) >= self.config.slow_call_rate_threshold
    }
}

/// An operator's choice, as kept in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = BreakerMode)]
pub enum Mode {
    /// Forced open: the consumers of every replica pause.
    Open,
    /// Forced closed: every replica consumes whatever the database does.
    Closed,
    /// The breaker decides.
    Auto,
}

impl Mode {
    fn forced_state(self) -> Option<State> {
        match self {
            Self::Open => Some(State::ForcedOpen),
            Self::Closed => Some(State::ForcedClosed),
            Self::Auto => None,
        }
    }
}

/// Reads the operator's mode from Redis (absent = automatic).
pub async fn read_mode(redis: &seckill_store::Redis, key: &str) -> redis::RedisResult<Mode> {
    let mut conn = redis.get().await?;
    let stored: Option<String> = redis::cmd("GET").arg(key).query_async(&mut conn).await?;
    Ok(match stored.as_deref() {
        Some("open") => Mode::Open,
        Some("closed") => Mode::Closed,
        _ => Mode::Auto,
    })
}

/// Stores the operator's mode in Redis, where every replica reads it.
pub async fn write_mode(
    redis: &seckill_store::Redis,
    key: &str,
    mode: Mode,
) -> redis::RedisResult<()> {
    let mut conn = redis.get().await?;
    match mode {
        Mode::Auto => redis::cmd("DEL").arg(key).query_async(&mut conn).await,
        Mode::Open => {
            redis::cmd("SET")
                .arg(key)
                .arg("open")
                .query_async(&mut conn)
                .await
        }
        Mode::Closed => {
            redis::cmd("SET")
                .arg(key)
                .arg("closed")
                .query_async(&mut conn)
                .await
        }
    }
}

impl CircuitBreaker {
    /// Applies an operator's mode.
    pub fn apply(&self, mode: Mode) {
        self.force(mode.forced_state());
    }

    /// Keeps this replica in step with the mode in Redis until `cancel`: reads it now and
    /// every `every` (a Redis outage leaves the last mode in place).
    pub async fn follow_mode(
        self: std::sync::Arc<Self>,
        redis: seckill_store::Redis,
        key: String,
        every: Duration,
        cancel: tokio_util::sync::CancellationToken,
    ) {
        loop {
            match read_mode(&redis, &key).await {
                Ok(mode) => self.apply(mode),
                Err(e) => tracing::debug!(error = %e, "could not read the breaker mode"),
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            window: Window::Count(10),
            minimum_calls: 5,
            failure_rate_threshold: 50.0,
            slow_call_rate_threshold: 100.0,
            slow_call_duration: Duration::from_secs(60),
            wait_in_open: Duration::from_millis(50),
            permitted_in_half_open: 2,
        }
    }

    fn call(breaker: &CircuitBreaker, failed: bool) {
        let permit = breaker.try_acquire().expect("permitted");
        breaker.record(permit, failed);
    }

    #[tokio::test]
    async fn failures_below_the_minimum_calls_do_not_open_it() {
        let breaker = CircuitBreaker::new(config());
        for _ in 0..4 {
            call(&breaker, true);
        }
        assert_eq!(breaker.state(), State::Closed);
        call(&breaker, true);
        assert_eq!(breaker.state(), State::Open, "5 calls, 100 % failed");
        assert!(breaker.try_acquire().is_none());
    }

    #[tokio::test]
    async fn a_failure_rate_under_the_threshold_keeps_it_closed() {
        let breaker = CircuitBreaker::new(config());
        for i in 0..20 {
            call(&breaker, i % 3 == 0); // a third fail
        }
        assert_eq!(breaker.state(), State::Closed);
    }

    #[tokio::test]
    async fn the_count_window_forgets_old_calls() {
        let breaker = CircuitBreaker::new(config());
        for _ in 0..10 {
            call(&breaker, false);
        }
        for _ in 0..4 {
            call(&breaker, true);
        }
        assert_eq!(breaker.state(), State::Closed, "4 of the last 10 failed");
        // One more: 5 of the last 10 (the early successes left the window; counted over
        // every call it would be 5 in 15).
        call(&breaker, true);
        assert_eq!(breaker.state(), State::Open);
    }

    #[tokio::test]
    async fn slow_calls_open_it_too() {
        let breaker = CircuitBreaker::new(Config {
            slow_call_rate_threshold: 60.0,
            slow_call_duration: Duration::ZERO,
            ..config()
        });
        for _ in 0..5 {
            call(&breaker, false);
        }
        assert_eq!(breaker.state(), State::Open);
    }

    #[tokio::test]
    async fn half_open_permits_a_few_trials_and_their_verdict_decides() {
        let breaker = CircuitBreaker::new(config());
        for _ in 0..5 {
            call(&breaker, true);
        }
        assert_eq!(breaker.state(), State::Open);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(breaker.state(), State::HalfOpen);
        let (a, b) = (breaker.try_acquire(), breaker.try_acquire());
        assert!(a.is_some() && b.is_some());
        assert!(breaker.try_acquire().is_none(), "only two trials");
        breaker.record(a.expect("a"), false);
        breaker.record(b.expect("b"), true);
        assert_eq!(breaker.state(), State::Open, "50 % of the trials failed");
        tokio::time::sleep(Duration::from_millis(60)).await;
        call(&breaker, false);
        call(&breaker, false);
        assert_eq!(breaker.state(), State::Closed);
    }

    #[tokio::test]
    async fn a_trial_dropped_without_an_outcome_gives_its_place_back() {
        let breaker = CircuitBreaker::new(config());
        for _ in 0..5 {
            call(&breaker, true);
        }
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(breaker.state(), State::HalfOpen);
        let kept = breaker.try_acquire().expect("first trial");
        // A batch with nothing to write, or a handler that panicked: no outcome.
        drop(breaker.try_acquire().expect("second trial"));
        let again = breaker
            .try_acquire()
            .expect("the dropped trial's place is free again");
        assert!(breaker.try_acquire().is_none(), "still only two at once");
        breaker.record(kept, false);
        breaker.record(again, false);
        assert_eq!(breaker.state(), State::Closed, "both trials passed");
    }

    #[tokio::test]
    async fn a_trial_of_an_earlier_round_does_not_decide_the_next() {
        let breaker = CircuitBreaker::new(config());
        let open_then_half_open = || async {
            for _ in 0..5 {
                call(&breaker, true);
            }
            tokio::time::sleep(Duration::from_millis(60)).await;
            assert_eq!(breaker.state(), State::HalfOpen);
        };
        open_then_half_open().await;
        let late = breaker.try_acquire().expect("a trial of round 1");
        // Round 1 ends without it (an operator's force and back), and round 2 begins.
        breaker.force(Some(State::ForcedOpen));
        breaker.force(None);
        open_then_half_open().await;
        let trial = breaker.try_acquire().expect("a trial of round 2");
        breaker.record(late, false);
        call(&breaker, false);
        assert_eq!(
            breaker.state(),
            State::HalfOpen,
            "round 1's late outcome is not one of round 2's two"
        );
        breaker.record(trial, false);
        assert_eq!(breaker.state(), State::Closed);
    }

    #[tokio::test]
    async fn a_forced_state_holds_until_returned_to_automatic() {
        let breaker = CircuitBreaker::new(config());
        breaker.force(Some(State::ForcedOpen));
        assert!(breaker.try_acquire().is_none());
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(
            breaker.state(),
            State::ForcedOpen,
            "no wait-in-open for a force"
        );
        breaker.force(Some(State::ForcedClosed));
        for _ in 0..10 {
            call(&breaker, true);
        }
        assert_eq!(breaker.state(), State::ForcedClosed, "failures ignored");
        breaker.force(None);
        assert_eq!(breaker.state(), State::Closed);
        call(&breaker, true);
        assert_eq!(breaker.state(), State::Closed, "the window starts empty");
    }

    #[tokio::test]
    async fn subscribers_hear_of_transitions() {
        let breaker = CircuitBreaker::new(config());
        let mut changes = breaker.subscribe();
        for _ in 0..5 {
            call(&breaker, true);
        }
        changes.changed().await.expect("changed");
        assert_eq!(*changes.borrow_and_update(), State::Open);
        // The wait's end nudges subscribers; reading the state completes the transition.
        tokio::time::timeout(Duration::from_secs(1), changes.changed())
            .await
            .expect("nudged")
            .expect("changed");
        assert_eq!(breaker.state(), State::HalfOpen);
    }
}
