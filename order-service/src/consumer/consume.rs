//! The consumer's loop: one connection at a time under a supervisor, paused while the
//! breaker refuses calls, gathering deliveries into batches that run concurrently.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use futures_util::{FutureExt, StreamExt};
use lapin::Channel;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use seckill_messaging::{CONFIRM_TIMEOUT, ConfirmedPublisher, Health, Supervised, Supervisor};

use super::OrderConsumer;
use super::delivery::Out;
use super::message::{Parts, Received};
use crate::ack_window::AckWindow;
use crate::breaker::State;
use crate::in_flight::{Holdings, REPORT_EVERY};

impl OrderConsumer {
    /// Runs until `cancel`, reconnecting with backoff when the broker goes away.
    pub async fn run(mut self, cancel: CancellationToken) -> anyhow::Result<()> {
        Supervisor::new("order consumer")
            .counting_failures("order_consumer_interruptions_total")
            .run(&mut self, &cancel)
            .await;
        Ok(())
    }

    /// One connection's life: declare, consume until cancelled or a failure, close.
    async fn consume(&self, health: &mut Health, cancel: &CancellationToken) -> anyhow::Result<()> {
        let connection =
            seckill_messaging::connect(&self.amqp_url, "order-service", Duration::ZERO).await?;
        let channel = connection.create_channel().await?;
        self.topology
            .declare(&channel)
            .await
            .context("declare topology")?;
        // Retries and dead letters are published with confirms, on a channel of their own
        // (confirm mode would also apply to nothing else here, but keeps the two apart).
        let publisher = ConfirmedPublisher::open(&connection, CONFIRM_TIMEOUT)
            .await
            .context("enable publisher confirms")?;
        // What this connection holds, reported for seckill-api's fence (`crate::in_flight`).
        let holdings = Arc::new(Holdings::new(&self.topology.queue));
        holdings
            .declare_alive(&channel)
            .await
            .context("declare the holder's queue")?;
        // Reported before anything can be delivered: a connection the fence cannot see
        // must never hold a delivery.
        holdings
            .report(&self.db)
            .await
            .context("report the deliveries in hand")?;
        let reporting = holdings.clone().report_until_dropped(self.db.clone());
        self.connected.store(true, Ordering::Relaxed);
        health.healthy();
        let out = Out {
            publisher: publisher.clone(),
            one_publish: Arc::new(tokio::sync::Mutex::new(())),
            acks: Arc::new(AckWindow::new(channel.clone())),
            holdings,
            parts: Arc::new(Parts::default()),
            writers: Arc::new(tokio::sync::Semaphore::new(
                (usize::from(self.prefetch) / self.batch_size.max(1)).max(1),
            )),
        };

        let mut in_flight = JoinSet::new();
        let mut changes = self.breaker.subscribe();
        let ended = loop {
            // Paused while the breaker refuses calls: nothing is taken from the queue.
            if self.breaker.state().pauses() {
                tracing::warn!("circuit breaker open: consumer paused");
                metrics::gauge!(crate::metrics::CONSUMER_PAUSED).set(1.0);
                while self.breaker.state().pauses() {
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = changes.changed() => {}
                    }
                }
                metrics::gauge!(crate::metrics::CONSUMER_PAUSED).set(0.0);
                if cancel.is_cancelled() {
                    break Ok(());
                }
                tracing::info!("consumer resumed");
            }
            // Half-open takes one batch at a time (its trial calls), not a full prefetch
            // that would mostly be handed back; prefetch applies to consumers created after.
            let trial = self.breaker.state() == State::HalfOpen;
            let prefetch = if trial {
                u16::try_from(self.batch_size).unwrap_or(u16::MAX)
            } else {
                self.prefetch
            };
            if let Err(e) = channel
                .basic_qos(prefetch, BasicQosOptions::default())
                .await
            {
                break Err(anyhow::Error::from(e).context("set prefetch"));
            }
            match self
                .consume_until_paused(&channel, &out, &mut in_flight, &mut changes, cancel)
                .await
            {
                Ok(Run::Paused | Run::Restart) => continue,
                Ok(Run::Stopped) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        while in_flight.join_next().await.is_some() {}
        self.connected.store(false, Ordering::Relaxed);
        if ended.is_ok() {
            // Everything was written, passed on or handed back: nothing held any more.
            reporting.stop().await;
        }
        publisher.close("order-service stopping").await;
        let _ = channel.close(200, "order-service stopping".into()).await;
        let _ = connection.close(200, "order-service stopping".into()).await;
        ended
    }

    /// Consumes (batching deliveries) until the breaker pauses it, `cancel`, or an error.
    /// On a pause or a stop the broker consumer is cancelled first; what the broker had
    /// already pushed is handed back to the queue (pause) or handled (stop), so a clean stop
    /// redelivers nothing and a pause keeps everything in the queue.
    async fn consume_until_paused(
        &self,
        channel: &Channel,
        out: &Out,
        in_flight: &mut JoinSet<()>,
        changes: &mut tokio::sync::watch::Receiver<crate::breaker::State>,
        cancel: &CancellationToken,
    ) -> anyhow::Result<Run> {
        let tag = format!("order-service-{}", uuid::Uuid::new_v4().simple());
        out.holdings.synced(std::time::Instant::now());
        let mut deliveries = channel
            .basic_consume(
                self.topology.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .context("start consuming")?;
        tracing::info!(queue = %self.topology.queue, prefetch = self.prefetch, "consuming");
        let mut batch = Gathering::default();
        // Far future while the batch is empty; first delivery + linger once it is not.
        let idle = || tokio::time::Instant::now() + Duration::from_secs(3600);
        let mut flush_at = idle();
        let trial = self.breaker.state() == State::HalfOpen;
        // The confirm channel can close on its own (a channel error, such as publishing to
        // an exchange deleted under us) while this one consumes on: every retry and dead
        // letter would then fail and be requeued, forever. Checked every second; reconnecting
        // declares the topology again.
        let mut publisher_check = tokio::time::interval(Duration::from_secs(1));
        let mut sync = tokio::time::interval(REPORT_EVERY);
        sync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let ended = loop {
            tokio::select! {
                _ = cancel.cancelled() => break Ok(Run::Stopped),
                _ = publisher_check.tick() => {
                    if !out.publisher.is_open() {
                        break Err(anyhow::anyhow!("the publisher channel closed"));
                    }
                }
                _ = changes.changed() => {
                    let state = self.breaker.state();
                    if state.pauses() {
                        break Ok(Run::Paused);
                    }
                    if trial != (state == State::HalfOpen) {
                        // Half-open ended (or began): consume again with the right prefetch.
                        break Ok(Run::Restart);
                    }
                }
                _ = sync.tick() => {
                    // Everything the broker sent before `started` is read once this returns.
                    let started = std::time::Instant::now();
                    if let Err(e) = Holdings::sync(channel, &self.topology.queue).await {
                        break Err(anyhow::Error::from(e).context("sync with the broker"));
                    }
                    let mut ended = None;
                    while let Some(next) = deliveries.next().now_or_never() {
                        match next {
                            Some(Ok(delivery)) => {
                                self.gather(delivery, &mut batch, &mut flush_at, in_flight, out).await;
                            }
                            Some(Err(e)) => {
                                ended = Some(anyhow::Error::from(e).context("delivery stream"));
                                break;
                            }
                            None => {
                                ended = Some(anyhow::anyhow!("delivery stream ended"));
                                break;
                            }
                        }
                    }
                    if let Some(e) = ended {
                        break Err(e);
                    }
                    out.holdings.synced(started);
                }
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        self.gather(delivery, &mut batch, &mut flush_at, in_flight, out).await;
                    }
                    Some(Err(e)) => break Err(anyhow::Error::from(e).context("delivery stream")),
                    None => break Err(anyhow::anyhow!("delivery stream ended")),
                },
                _ = tokio::time::sleep_until(flush_at), if !batch.deliveries.is_empty() => {
                    let due = std::mem::take(&mut batch).deliveries;
                    in_flight.spawn(self.clone().handle_even_on_panic(due, out.clone()));
                    flush_at = idle();
                }
                Some(done) = in_flight.join_next(), if !in_flight.is_empty() => {
                    if let Err(e) = done {
                        tracing::error!(error = %e, "delivery task panicked");
                    }
                }
            }
        };
        let mut ended = ended;
        if ended.is_ok() {
            // Stop new deliveries; the stream ends after those the broker already pushed.
            let _ = channel
                .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
                .await;
            let buffered = async {
                while let Some(Ok(delivery)) = deliveries.next().await {
                    let received = self.arrived(delivery, out).await;
                    batch.push(received);
                }
            };
            if tokio::time::timeout(Duration::from_secs(5), buffered)
                .await
                .is_err()
            {
                // Deliveries still unread are unknown to the ack window: on this channel the
                // next consumer's coalesced ack would cover them unprocessed. Ending with an
                // error closes the channel, and the broker requeues them.
                tracing::warn!("consumer did not end after cancel; closing its channel");
                ended = Err(anyhow::anyhow!(
                    "consumer did not end within 5 s of its cancel"
                ));
            } else {
                out.holdings.stopped_consuming();
            }
        }
        match ended {
            Ok(Run::Paused) => {
                for received in &batch.deliveries {
                    self.hand_back_delivery(out, &received.delivery).await;
                    out.holdings.released(&[received.tag()]);
                }
            }
            _ if !batch.deliveries.is_empty() => {
                in_flight.spawn(
                    self.clone()
                        .handle_even_on_panic(batch.deliveries, out.clone()),
                );
            }
            _ => {}
        }
        ended
    }
}

impl OrderConsumer {
    /// Takes in a delivery: known to the ack window, its purchases to the holdings, its
    /// parts (a batch's) to the part ledger.
    async fn arrived(&self, delivery: Delivery, out: &Out) -> Received {
        let received = Received::new(delivery);
        out.acks.delivered(received.tag()).await;
        let products = received
            .messages()
            .iter()
            .filter_map(|m| crate::in_flight::product_of(m.data))
            .collect();
        out.holdings.received(received.tag(), products);
        if received.part_count() > 0 {
            out.parts.open(received.tag(), received.part_count());
        }
        received
    }

    /// Takes a delivery into the batch being gathered; a batch holding `batch_size`
    /// purchases or more starts at once.
    async fn gather(
        &self,
        delivery: Delivery,
        batch: &mut Gathering,
        flush_at: &mut tokio::time::Instant,
        in_flight: &mut JoinSet<()>,
        out: &Out,
    ) {
        let received = self.arrived(delivery, out).await;
        if batch.deliveries.is_empty() {
            *flush_at = tokio::time::Instant::now() + self.batch_linger;
        }
        batch.push(received);
        if batch.purchases >= self.batch_size {
            let full = std::mem::take(batch).deliveries;
            in_flight.spawn(self.clone().handle_even_on_panic(full, out.clone()));
            *flush_at = tokio::time::Instant::now() + Duration::from_secs(3600);
        }
    }
}

/// The deliveries of the batch being gathered, and how many purchases they carry.
#[derive(Default)]
struct Gathering {
    deliveries: Vec<Received>,
    purchases: usize,
}

impl Gathering {
    fn push(&mut self, received: Received) {
        self.purchases += received.part_count().max(1);
        self.deliveries.push(received);
    }
}

impl Supervised for OrderConsumer {
    /// Connects and consumes until `cancel` or until the broker goes away.
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let consumed = self.consume(health, cancel).await;
        self.connected.store(false, Ordering::Relaxed);
        consumed
    }
}

/// How a consuming run ended.
enum Run {
    /// The breaker opened.
    Paused,
    /// The breaker left (or entered) half-open: consume again with its prefetch.
    Restart,
    /// Cancelled.
    Stopped,
}
