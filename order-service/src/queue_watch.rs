//! The queues' depth and consumers as metrics: every `every`, a passive declare of each
//! queue of the topology (main, retry tiers, dead letters) on a connection of its own.
//!
//! A passive declare only reads: it creates nothing, changes no argument, and touches no
//! consumer, so the watch cannot disturb the consumer (which has its own connection). So
//! that a first start on a fresh broker asks for no queue before it exists, the watch
//! declares the topology once per connection, as every other part does (the same
//! arguments, from the same settings). A queue that does not exist all the same (deleted
//! by hand) answers 404, which closes the channel: the watch opens another and goes on
//! with the next queue. The gauges (`amqp_queue_messages`,
//! `amqp_queue_consumers`, labelled by `queue` and `role`) keep their last value while the
//! broker is unreachable. The parking lot is a Postgres table, not a queue: its inflow is
//! `orders_parked_total`.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use seckill_messaging::{Health, Supervised, Supervisor, Topology};

use crate::metrics::{self as names, role};

/// The default interval between two polls.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);

/// Polls the topology's queues; see the module docs.
#[derive(Debug, Clone)]
pub struct QueueWatch {
    /// Broker.
    pub amqp_url: String,
    /// Which queues.
    pub topology: Topology,
    /// Interval between polls.
    pub every: Duration,
}

/// One queue's reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Depth {
    /// Messages ready (not those delivered and unacked).
    pub messages: u32,
    /// Consumers attached.
    pub consumers: u32,
}

impl QueueWatch {
    /// Runs until `cancel`, reconnecting with backoff.
    pub async fn run(mut self, cancel: CancellationToken) {
        Supervisor::new("queue watch").run(&mut self, &cancel).await;
    }

    /// Each queue with its role: the main queue, the retry tiers, the dead-letter queue.
    pub fn queues(&self) -> Vec<(String, &'static str)> {
        let topology = &self.topology;
        let mut queues = vec![(topology.queue.clone(), role::MAIN)];
        queues.extend(
            topology
                .retry_tiers_ms
                .iter()
                .map(|&ms| (topology.retry_queue(ms), role::RETRY)),
        );
        queues.push((topology.dead_letter_queue.clone(), role::DEAD_LETTER));
        queues
    }
}

/// Reads one queue by a passive declare; `None` if it does not exist or the channel failed
/// (which closes the channel), or if the answer cannot be believed (a quorum queue's slow
/// "0, 0": see [`seckill_messaging::stat`]), in which case the gauges keep their value.
pub async fn depth(channel: &lapin::Channel, queue: &str) -> Option<Depth> {
    match seckill_messaging::queue_stat(channel, queue).await {
        Ok(Some(found)) => Some(Depth {
            messages: found.messages,
            consumers: found.consumers,
        }),
        Ok(None) => {
            tracing::debug!(queue, "a slow empty answer, not believed");
            None
        }
        Err(e) => {
            tracing::debug!(error = %e, queue, "passive declare failed");
            None
        }
    }
}

impl Supervised for QueueWatch {
    /// Connects, then polls until `cancel` or until the connection fails.
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let connection =
            seckill_messaging::connect(&self.amqp_url, "order-service queue watch", Duration::ZERO)
                .await?;
        let mut channel = connection.create_channel().await?;
        self.topology
            .declare(&channel)
            .await
            .map_err(|e| anyhow::Error::from(e).context("declare the topology"))?;
        health.healthy();
        let queues = self.queues();
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Ok(()),
                _ = tick.tick() => {}
            }
            for (queue, kind) in &queues {
                if !channel.status().connected() {
                    // A 404 closed the last one; a dead connection fails here.
                    match connection.create_channel().await {
                        Ok(fresh) => channel = fresh,
                        Err(e) => return Err(anyhow::Error::from(e).context("reopen channel")),
                    }
                }
                let Some(found) = depth(&channel, queue).await else {
                    continue;
                };
                let labels = [("queue", queue.clone()), ("role", kind.to_string())];
                metrics::gauge!(names::AMQP_QUEUE_MESSAGES, &labels).set(found.messages);
                metrics::gauge!(names::AMQP_QUEUE_CONSUMERS, &labels).set(found.consumers);
                if *kind == role::MAIN && found.messages == 0 {
                    // Nothing waits: whatever the last batch's lag was, it is over.
                    metrics::gauge!(names::ORDERS_CONSUMER_LAG).set(0.0);
                }
            }
        };
        let _ = connection.close(200, "queue watch stopping".into()).await;
        ended
    }
}
