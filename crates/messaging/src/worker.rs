//! Supervised background workers: the reconnect loop, written once.
//!
//! A worker (the outbox relay, the order consumer, the dead-letter recorder, the product
//! change listener, the compensation relay) implements [`Supervised`]: one *cycle* connects
//! and works until it is cancelled or something fails. A [`Supervisor`] runs cycles until
//! the service's cancellation token fires: after a failure it logs the error once, with the
//! worker's name, and waits out an exponential backoff with jitter (on `backon`), so
//! replicas that lost the same broker do not all come back in the same instant. A cycle
//! that reports itself healthy (connected, or a round done) starts the backoff over. The
//! wait is cut short by the token; a running cycle is not — it gets the token and decides
//! itself how to finish (the consumer drains what it holds).
//!
//! Nothing here knows AMQP: the listener and the compensation relay work on Postgres and
//! Redis. The module lives in this crate because every service with workers depends on it.

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio_util::sync::CancellationToken;

/// The shortest wait before a cycle runs again (jitter adds up to as much again).
pub const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// The longest wait before a cycle runs again, before jitter (which at most doubles it).
pub const RECONNECT_MAX: Duration = Duration::from_millis(2_500);

/// A background worker a [`Supervisor`] runs.
pub trait Supervised: Send {
    /// One cycle: connect, then work until `cancel` (`Ok`) or a failure (`Err`, and the
    /// cycle runs again after a backoff). Mark `health` once the cycle works, so that its
    /// eventual failure starts the backoff over.
    fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// What a cycle says about itself: whether it got to work before it ended.
#[derive(Debug, Default)]
pub struct Health {
    healthy: bool,
}

impl Health {
    /// The cycle is working (connected, or a round went well): the next failure is a new
    /// outage, to be retried soon, not one more failure of a long one.
    pub fn healthy(&mut self) {
        self.healthy = true;
    }
}

/// How a supervised worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The cancellation token stopped it.
    Cancelled,
    /// A cycle returned `Ok` with the token not cancelled: the worker had nothing more to do.
    Finished,
}

/// Runs a [`Supervised`] worker's cycles until cancelled; see the module docs.
#[derive(Debug, Clone)]
pub struct Supervisor {
    /// The worker's name in logs.
    name: &'static str,
    /// Waits between failed cycles.
    backoff: ExponentialBuilder,
    /// A counter of failed cycles, for workers that export one.
    failures: Option<&'static str>,
}

impl Supervisor {
    /// A supervisor for the worker called `name`, waiting [`RECONNECT_MIN`] up to
    /// [`RECONNECT_MAX`] (each plus jitter) between failed cycles.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            backoff: backoff(RECONNECT_MIN, RECONNECT_MAX),
            failures: None,
        }
    }

    /// Waits from `min` up to `max` between failed cycles, doubling; jitter adds up to as
    /// much again to each wait.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.backoff = backoff(min, max);
        self
    }

    /// Counts each failed cycle in the counter `metric`.
    pub fn counting_failures(mut self, metric: &'static str) -> Self {
        self.failures = Some(metric);
        self
    }

    /// Runs `worker`'s cycles until `cancel` (or a cycle finishes); reports how it ended.
    pub async fn run<W: Supervised>(&self, worker: &mut W, cancel: &CancellationToken) -> Ended {
        let mut waits = self.backoff.build();
        let ended = loop {
            if cancel.is_cancelled() {
                break Ended::Cancelled;
            }
            let mut health = Health::default();
            let outcome = worker.cycle(&mut health, cancel).await;
            if health.healthy {
                waits = self.backoff.build();
            }
            let error = match outcome {
                Ok(()) if cancel.is_cancelled() => break Ended::Cancelled,
                Ok(()) => break Ended::Finished,
                Err(error) => error,
            };
            // Never `None`: the backoff has no limit on tries or total time.
            let wait = waits.next().unwrap_or(RECONNECT_MAX);
            tracing::warn!(
                worker = self.name,
                error = format!("{error:#}"),
                ?wait,
                "worker interrupted"
            );
            if let Some(metric) = self.failures {
                metrics::counter!(metric).increment(1);
            }
            tokio::select! {
                () = cancel.cancelled() => break Ended::Cancelled,
                () = tokio::time::sleep(wait) => {}
            }
        };
        tracing::info!(worker = self.name, ?ended, "worker stopped");
        ended
    }
}

fn backoff(min: Duration, max: Duration) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max.max(min))
        .with_factor(2.0)
        .without_max_times()
        .with_total_delay(None)
        .with_jitter()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails `failures` times (healthy on the cycles listed), then finishes or waits for
    /// the token.
    struct Flaky {
        cycles: u32,
        failures: u32,
        healthy_on: Vec<u32>,
        finish: bool,
        started: Vec<tokio::time::Instant>,
    }

    impl Flaky {
        fn new(failures: u32, finish: bool) -> Self {
            Self {
                cycles: 0,
                failures,
                healthy_on: Vec::new(),
                finish,
                started: Vec::new(),
            }
        }
    }

    impl Supervised for Flaky {
        async fn cycle(
            &mut self,
            health: &mut Health,
            cancel: &CancellationToken,
        ) -> anyhow::Result<()> {
            self.started.push(tokio::time::Instant::now());
            self.cycles += 1;
            if self.healthy_on.contains(&self.cycles) {
                health.healthy();
            }
            if self.cycles <= self.failures {
                anyhow::bail!("cycle {} failed", self.cycles);
            }
            if !self.finish {
                cancel.cancelled().await;
            }
            Ok(())
        }
    }

    fn gaps(started: &[tokio::time::Instant]) -> Vec<Duration> {
        started.windows(2).map(|w| w[1] - w[0]).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failed_cycles_run_again_after_growing_jittered_waits() {
        let mut worker = Flaky::new(5, true);
        let supervisor = Supervisor::new("flaky")
            .with_backoff(Duration::from_millis(100), Duration::from_millis(400));
        let ended = supervisor.run(&mut worker, &CancellationToken::new()).await;
        assert_eq!(ended, Ended::Finished);
        assert_eq!(worker.cycles, 6);
        let gaps = gaps(&worker.started);
        let bounds = [(100, 200), (200, 400), (400, 800), (400, 800), (400, 800)];
        for (gap, (low, high)) in gaps.iter().zip(bounds) {
            // The jitter adds up to (not quite) one more delay, and tokio's timer rounds a
            // sleep up to the next millisecond: a jitter a hair under the delay waits the
            // full double, so the upper bound is inclusive.
            let range = Duration::from_millis(low)..=Duration::from_millis(high);
            assert!(range.contains(gap), "{gap:?} outside {range:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_healthy_cycle_starts_the_backoff_over() {
        let mut worker = Flaky::new(4, true);
        worker.healthy_on = vec![3];
        let supervisor = Supervisor::new("flaky")
            .with_backoff(Duration::from_millis(100), Duration::from_secs(10));
        supervisor.run(&mut worker, &CancellationToken::new()).await;
        let gaps = gaps(&worker.started);
        assert!(gaps[1] >= Duration::from_millis(200), "{gaps:?}");
        assert!(gaps[2] < Duration::from_millis(200), "reset: {gaps:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn cancelling_cuts_the_wait_short() {
        let mut worker = Flaky::new(u32::MAX, true);
        let supervisor =
            Supervisor::new("flaky").with_backoff(Duration::from_secs(60), Duration::from_secs(60));
        let cancel = CancellationToken::new();
        let started = tokio::time::Instant::now();
        let stopper = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stopper.cancel();
        });
        let ended = supervisor.run(&mut worker, &cancel).await;
        assert_eq!(ended, Ended::Cancelled);
        assert_eq!(worker.cycles, 1);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cycle_that_returns_on_cancel_ends_cancelled() {
        let mut worker = Flaky::new(0, false);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let ended = Supervisor::new("flaky").run(&mut worker, &cancel).await;
        assert_eq!(ended, Ended::Cancelled);
        assert_eq!(worker.cycles, 0, "not started once cancelled");
    }
}
