//! Publishing accepted purchases from the request path, so that a `202` means "RabbitMQ has
//! it", not "Redis has it".
//!
//! The purchase script still records the order intent in the bucket's outbox stream in the
//! same atomic step that takes the unit (a crash right after it loses nothing). Then the
//! handler publishes the intent itself with a publisher confirm, bounded by
//! `publish_timeout_ms`, and only once the broker confirmed it (and the outbox entry is
//! deleted) answers `202`. If the broker is unreachable, slow or refuses the message, the handler
//! answers `202` anyway and leaves the entry to the relay (`crate::relay`), which publishes
//! whatever the handlers left behind once it is older than the relay's grace: then, and only
//! then, the `202`'s durability is Redis' own (`SECKILL_API_REQUIRE_DURABLE_REDIS` checks
//! Redis' persistence at start).
//!
//! Group commit: handlers hand their purchases to publishing workers, one channel each
//! (`publish_channels`, one by default). A worker takes every purchase waiting for it (after
//! waiting up to `publish_linger_us` for more, 0 by default), publishes them as batch
//! messages of up to `publish_batch_max` purchases each (`seckill_messaging::batch`: every
//! purchase signed on its own, so order-service can still retry or dead-letter each alone),
//! waits for all their confirms, deletes their outbox entries in one round trip, and only
//! then answers each handler. Purchases that arrive
//! while a batch waits for its confirms form the next batch: the busier the path, the more
//! one message, one fsync share, one confirm, one delivery and one ack carry. lapin attaches
//! a `mandatory` message the broker returned to whichever confirm it resolves next, so which
//! message of a batch came back is unknowable: if any did (or any was nacked), the whole
//! batch counts as not published and each handler leaves its entry to the relay (a duplicate
//! at worst, which order-service absorbs).
//! A batch whose confirms do not all come within the timeout ends its worker's channel at
//! once: nothing more is published on it (a late confirm or return would be taken for the
//! next batch's), and what waits for the worker fails fast, for the relay.
//!
//! A handler waits until its job's deadline (`publish_timeout_ms` after it hands the job
//! over, the wait for room in the worker's queue included) and then answers `202` resting on
//! the outbox. Its job is then withdrawn: the worker skips a job whose handler stopped waiting
//! (its answer's receiver is gone, also when the request itself went away) or whose deadline
//! passed, since the relay publishes that entry, and a second publish would only duplicate
//! it. A job taken before its deadline may still be confirmed after its handler gave up;
//! that one goes out twice (order-service absorbs the copy: same request id).
//!
//! A message published and not confirmed may still reach the queue much later (a
//! connection the broker blocks for an alarm is read again only once the alarm clears),
//! after Redis may have lost its outbox entry: then that late copy is the purchase's only
//! one. So when the first handler of a batch stops waiting with confirms still due (or the
//! batch fails in a way that leaves its fate unknown), the worker notes the whole batch in
//! transit (`seckill_store::transit`) before it goes on: the ledger fence
//! (`crate::stock::fence`) then waits for those purchases to land.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use lapin::Connection;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use seckill_messaging::batch::{self, Outgoing, Purchase};
use seckill_messaging::{
    ConfirmedPublisher, Health, NotTaken, OrderSigner, Supervised, Supervisor, Topology,
    TraceHeaders,
};

/// Messages a worker publishes in one go at most.
const MAX_BATCH: usize = 512;
/// How soon a transit note that failed is tried again.
const NOTE_RETRY_AFTER: Duration = Duration::from_millis(50);

/// How the handlers' purchases are published.
#[derive(Debug, Clone, Copy)]
pub struct PublishOptions {
    /// Longest a request waits for its confirm.
    pub timeout: Duration,
    /// Workers (and channels) per connection.
    pub channels: usize,
    /// Purchases one message carries at most.
    pub batch_max: usize,
    /// How long a worker waits for more purchases before it publishes a batch not full.
    pub linger: Duration,
}

/// Publishes order messages with a confirm, from any request; cheap to clone.
#[derive(Clone)]
pub struct OrderPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    amqp_url: String,
    topology: Topology,
    /// Signs each message, so order-service knows it comes from here.
    signer: OrderSigner,
    /// Where unconfirmed publishes are noted in transit.
    db: PgPool,
    /// Where the outbox entries of confirmed purchases are deleted.
    redis: seckill_store::Redis,
    /// Longest a request waits for its confirm.
    timeout: Duration,
    /// Workers (and channels) per connection.
    channels: usize,
    /// Purchases one message carries at most.
    batch_max: usize,
    /// How long a worker waits for more purchases before it publishes a batch not full.
    linger: Duration,
    /// The workers' queues; empty while the broker is unreachable.
    workers: RwLock<Vec<mpsc::Sender<Job>>>,
    /// Round-robin over the workers.
    next: AtomicUsize,
    /// True while connected (read by `/readyz`).
    connected: Arc<AtomicBool>,
}

/// An accepted purchase's outbox entry, deleted once the broker confirmed its message.
#[derive(Debug, Clone)]
pub struct OutboxEntry {
    /// The bucket's outbox stream.
    pub stream: String,
    /// The entry's id in it.
    pub entry_id: String,
}

/// One message to publish, and where to say how it went.
struct Job {
    purchase: Purchase,
    product_id: i64,
    /// Deleted by the worker once the purchase's message is confirmed.
    entry: OutboxEntry,
    /// When its handler stops waiting.
    deadline: Instant,
    done: oneshot::Sender<Result<(), PublishError>>,
}

impl Job {
    /// Whether its handler has stopped waiting for it (or will have by the time a confirm
    /// could come): its purchase is the relay's, from the outbox.
    fn withdrawn(&self, now: Instant) -> bool {
        self.done.is_closed() || now >= self.deadline
    }
}

impl std::fmt::Debug for OrderPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderPublisher")
            .field("timeout", &self.inner.timeout)
            .field("channels", &self.inner.channels)
            .finish_non_exhaustive()
    }
}

/// Why a publish did not get a plain confirm: the handler leaves the intent to the relay.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PublishError {
    /// No connection to the broker right now.
    #[error("not connected to the broker")]
    NotConnected,
    /// No confirm within the timeout.
    #[error("no confirm within the timeout")]
    TimedOut,
    /// The broker nacked or returned a message of the batch (which one is unknowable).
    #[error("a message of the batch was {0}")]
    Refused(NotTaken),
    /// The channel failed.
    #[error("channel: {0}")]
    Channel(String),
}

impl PublishError {
    /// Whether a message of the batch may still reach the queue later (no confirm came,
    /// the channel failed after it was written, or it went out on a channel not
    /// confirming). Not when it was never sent, nor when a message was nacked or returned:
    /// those did not reach the queue, and the batch's others are in it already.
    pub fn fate_unknown(&self) -> bool {
        matches!(
            self,
            PublishError::TimedOut
                | PublishError::Channel(_)
                | PublishError::Refused(NotTaken::NotConfirmed)
        )
    }

    /// Its `reason` label on `outbox_confirm_failures_total`.
    pub fn reason(&self) -> &'static str {
        use crate::metrics::confirm_failure;
        match self {
            PublishError::NotConnected => confirm_failure::NOT_CONNECTED,
            PublishError::TimedOut => confirm_failure::TIMED_OUT,
            PublishError::Refused(NotTaken::Returned) => confirm_failure::RETURNED,
            PublishError::Refused(NotTaken::Nacked) => confirm_failure::NACKED,
            PublishError::Refused(NotTaken::NotConfirmed) => confirm_failure::NOT_CONFIRMED,
            PublishError::Channel(_) => confirm_failure::CHANNEL,
        }
    }
}

impl OrderPublisher {
    /// A publisher to `amqp_url`; it connects once [`OrderPublisher::run`] runs.
    pub fn new(
        amqp_url: String,
        topology: Topology,
        signer: OrderSigner,
        db: PgPool,
        redis: seckill_store::Redis,
        options: PublishOptions,
        connected: Arc<AtomicBool>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                amqp_url,
                topology,
                signer,
                db,
                redis,
                timeout: options.timeout,
                channels: options.channels.max(1),
                batch_max: options.batch_max.max(1),
                linger: options.linger,
                workers: RwLock::new(Vec::new()),
                next: AtomicUsize::new(0),
                connected,
            }),
        }
    }

    /// Publishes one order message (purchase `request_id` of `product_id`), with the trace
    /// context `trace` in its headers, and waits for the broker's confirm (bounded). Once
    /// confirmed, its outbox `entry` is deleted (with its batch's, before the answer).
    pub async fn publish(
        &self,
        request_id: &str,
        product_id: i64,
        http_request_id: &str,
        payload: &[u8],
        trace: TraceHeaders<'_>,
        entry: OutboxEntry,
    ) -> Result<(), PublishError> {
        let worker = {
            let workers = self
                .inner
                .workers
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if workers.is_empty() {
                return Err(PublishError::NotConnected);
            }
            let index = self.inner.next.fetch_add(1, Ordering::Relaxed) % workers.len();
            workers[index].clone()
        };
        let deadline = Instant::now() + self.inner.timeout;
        let (done, answer) = oneshot::channel();
        let job = Job {
            purchase: Purchase {
                request_id: request_id.to_string(),
                http_request_id: http_request_id.to_string(),
                payload: payload.to_vec(),
                traceparent: trace.traceparent.to_string(),
                tracestate: trace.tracestate.to_string(),
            },
            product_id,
            entry,
            deadline,
            done,
        };
        let outcome = async {
            worker
                .send(job)
                .await
                .map_err(|_| PublishError::NotConnected)?;
            // An error: the worker went away with the job (its connection died).
            answer.await.unwrap_or(Err(PublishError::NotConnected))
        };
        // Past the deadline the answer's receiver is dropped with `outcome`: the worker then
        // leaves the job alone if it has not taken it yet.
        tokio::time::timeout_at(deadline, outcome)
            .await
            .unwrap_or(Err(PublishError::TimedOut))
    }

    /// Keeps a connection and its workers up until `cancel`, reconnecting with backoff.
    pub async fn run(mut self, cancel: CancellationToken) -> anyhow::Result<()> {
        Supervisor::new("order publisher")
            .run(&mut self, &cancel)
            .await;
        Ok(())
    }

    /// One worker: publishes whatever waits for it, batch after batch, until `lost` — never
    /// another batch once its channel is lost.
    async fn work(
        self,
        publisher: ConfirmedPublisher,
        mut jobs: mpsc::Receiver<Job>,
        lost: CancellationToken,
    ) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            tokio::select! {
                // A lost channel wins over jobs waiting: nothing more goes out on it.
                biased;
                _ = lost.cancelled() => break,
                got = jobs.recv_many(&mut batch, MAX_BATCH) => if got == 0 { break },
            }
            if !self.inner.linger.is_zero() && batch.len() < self.inner.batch_max {
                // Wait a little for more, but never past a full message.
                let until = Instant::now() + self.inner.linger;
                while batch.len() < self.inner.batch_max {
                    let room = self.inner.batch_max - batch.len();
                    match tokio::time::timeout_at(until, jobs.recv_many(&mut batch, room)).await {
                        Ok(got) if got > 0 => {}
                        _ => break,
                    }
                }
            }
            let now = Instant::now();
            let (withdrawn, taken): (Vec<Job>, Vec<Job>) =
                batch.drain(..).partition(|job| job.withdrawn(now));
            if !withdrawn.is_empty() {
                metrics::counter!(crate::metrics::PUBLISH_WITHDRAWN)
                    .increment(withdrawn.len() as u64);
            }
            for job in withdrawn {
                let _ = job.done.send(Err(PublishError::TimedOut));
            }
            if taken.is_empty() {
                continue;
            }
            let outcome = self.publish_batch(&publisher, &taken).await;
            metrics::histogram!("seckill_publish_batch_size").record(taken.len() as f64);
            if outcome.is_ok() {
                self.forget(&taken).await;
            }
            for job in taken {
                let _ = job.done.send(outcome.clone());
            }
            // A late confirm (or return) would be credited to the next batch: after a timeout
            // this channel is done. After another failure, it is if it closed.
            let channel_lost = match &outcome {
                Ok(()) => false,
                Err(PublishError::TimedOut) => true,
                Err(_) => !publisher.is_open(),
            };
            if channel_lost {
                // The connection loop notices and reconnects; the queued jobs fail fast.
                lost.cancel();
                break;
            }
        }
        jobs.close();
        while let Ok(job) = jobs.try_recv() {
            let _ = job.done.send(Err(PublishError::NotConnected));
        }
        publisher.close("publisher worker stopping").await;
    }

    /// Publishes a batch and waits for every confirm; `Ok` only if each was a plain ack.
    /// Notes the batch in transit once its first handler stops waiting with confirms due,
    /// or if it fails with its messages' fate unknown.
    async fn publish_batch(
        &self,
        publisher: &ConfirmedPublisher,
        batch: &[Job],
    ) -> Result<(), PublishError> {
        let started = Instant::now();
        let publish_all = async {
            let messages = batch::group(batch, self.inner.batch_max, |job| &job.purchase);
            let mut confirms = Vec::with_capacity(messages.len());
            for jobs in messages {
                metrics::histogram!(crate::metrics::ORDERS_PER_MESSAGE).record(jobs.len() as f64);
                let orders: Vec<Outgoing<'_>> =
                    jobs.iter().map(|job| job.purchase.outgoing()).collect();
                let confirm = publisher
                    .send_orders(&self.inner.signer, &self.inner.topology, &orders)
                    .await?;
                confirms.push(confirm);
            }

            // Every confirm is awaited, so none is left to be credited to the next batch; one
            // timeout bounds them all, and the whole batch.
            let mut refused = Ok(());
            for confirm in confirms {
                match confirm.outcome().await {
                    Ok(()) => {}
                    Err(seckill_messaging::PublishError::NotTaken(not_taken)) => {
                        refused = Err(PublishError::Refused(not_taken));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            refused
        };
        tokio::pin!(publish_all);
        let batch_deadline = started + self.inner.timeout;
        let first_deadline = batch
            .iter()
            .map(|job| job.deadline)
            .min()
            .map_or(batch_deadline, |first| first.min(batch_deadline));
        match tokio::time::timeout_at(first_deadline, &mut publish_all).await {
            Ok(outcome) => {
                if outcome.as_ref().is_err_and(PublishError::fate_unknown) {
                    self.note_in_transit(batch).await;
                }
                outcome
            }
            Err(_) => {
                // A handler answers `202` on the outbox now, and the broker may take the
                // batch much later.
                self.note_in_transit(batch).await;
                if Instant::now() >= batch_deadline {
                    // Past the bound with confirms still due when it passed: the channel
                    // ends, whatever came in while the note was written.
                    return Err(PublishError::TimedOut);
                }
                tokio::time::timeout_at(batch_deadline, &mut publish_all)
                    .await
                    .unwrap_or(Err(PublishError::TimedOut))
            }
        }
    }

    /// Deletes the outbox entries of a confirmed batch, all in one round trip (on a single
    /// server): the relay need not publish them again. An entry left behind (Redis busy or
    /// gone) is published once more later, which order-service absorbs.
    async fn forget(&self, batch: &[Job]) {
        seckill_http::failpoint!("purchase::after_publish", ());
        let mut by_stream: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for job in batch {
            by_stream
                .entry(job.entry.stream.as_str())
                .or_default()
                .push(job.entry.entry_id.as_str());
        }
        let streams: Vec<(&str, Vec<&str>)> = by_stream.into_iter().collect();
        let forgotten = match self.inner.redis.get().await {
            Ok(mut conn) => {
                crate::relay::ack_and_delete_streams(
                    &mut conn,
                    &streams,
                    self.inner.redis.is_cluster(),
                )
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = forgotten {
            tracing::warn!(error = %e, count = batch.len(),
                "could not delete published outbox entries; the relay publishes them again");
        }
    }

    /// Notes the batch's purchases in transit, trying again (a note is idempotent) for up
    /// to a publish timeout: the fence's grace leaves the note that long.
    async fn note_in_transit(&self, batch: &[Job]) {
        let purchases: Vec<(uuid::Uuid, i64)> = batch
            .iter()
            .filter_map(|job| {
                let request_id = uuid::Uuid::parse_str(&job.purchase.request_id).ok()?;
                Some((request_id, job.product_id))
            })
            .collect();
        let give_up = Instant::now() + self.inner.timeout;
        loop {
            let noted =
                tokio::time::timeout_at(give_up, crate::transit::note(&self.inner.db, &purchases))
                    .await;
            match noted {
                Ok(true) => return,
                Ok(false) if Instant::now() + NOTE_RETRY_AFTER < give_up => {
                    tokio::time::sleep(NOTE_RETRY_AFTER).await;
                }
                _ => {
                    tracing::error!(
                        count = purchases.len(),
                        "could not note unconfirmed publishes in transit: a ledger rebuild \
                         may not wait for them"
                    );
                    return;
                }
            }
        }
    }

    fn set(&self, workers: Vec<mpsc::Sender<Job>>) {
        self.inner
            .connected
            .store(!workers.is_empty(), Ordering::Relaxed);
        *self
            .inner
            .workers
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = workers;
    }

    /// A connection with the topology declared and one confirming channel per worker.
    async fn connect(&self) -> anyhow::Result<(Connection, Vec<ConfirmedPublisher>)> {
        let connection = seckill_messaging::connect(
            &self.inner.amqp_url,
            "seckill-api publisher",
            Duration::ZERO,
        )
        .await?;
        let declare = connection.create_channel().await?;
        self.inner
            .topology
            .declare(&declare)
            .await
            .context("declare topology")?;
        let _ = declare.close(200, "declared".into()).await;
        let mut publishers = Vec::with_capacity(self.inner.channels);
        for _ in 0..self.inner.channels {
            let publisher = ConfirmedPublisher::open(&connection, self.inner.timeout)
                .await
                .context("enable publisher confirms")?;
            publishers.push(publisher);
        }
        Ok((connection, publishers))
    }
}

impl Supervised for OrderPublisher {
    /// Connects and runs one worker per channel until `cancel` or until the connection (or
    /// a worker's channel) is lost.
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let (connection, publishers) = self.connect().await?;
        health.healthy();
        tracing::info!("order publisher connected");
        let lost = CancellationToken::new();
        let mut senders = Vec::with_capacity(publishers.len());
        let mut tasks = Vec::with_capacity(publishers.len());
        for publisher in publishers {
            let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
            senders.push(tx);
            tasks.push(tokio::spawn(self.clone().work(publisher, rx, lost.clone())));
        }
        self.set(senders);
        // A worker ends only with its channel (`lost`), or by a panic: then its handlers got
        // no answer, and no purchase would reach it any more; reconnect.
        while connection.status().connected()
            && !lost.is_cancelled()
            && !tasks.iter().any(tokio::task::JoinHandle::is_finished)
        {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = lost.cancelled() => break,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        self.set(Vec::new());
        lost.cancel();
        for task in tasks {
            if let Err(e) = task.await {
                tracing::error!(error = %e, "a publishing worker died; its purchases are the relay's");
            }
        }
        let _ = connection.close(200, "publisher stopping".into()).await;
        if cancel.is_cancelled() {
            return Ok(());
        }
        anyhow::bail!("the order publisher lost its connection")
    }
}

impl From<seckill_messaging::PublishError> for PublishError {
    fn from(error: seckill_messaging::PublishError) -> Self {
        use seckill_messaging::PublishError as Failed;
        match error {
            Failed::Channel(e) => Self::Channel(e.to_string()),
            Failed::TimedOut(_) => Self::TimedOut,
            Failed::NotTaken(not_taken) => Self::Refused(not_taken),
        }
    }
}

#[cfg(test)]
mod tests;
