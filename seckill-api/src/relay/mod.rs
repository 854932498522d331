//! The outbox relay: Redis streams → RabbitMQ, with publisher confirms.
//!
//! Each bucket's accepted purchases sit in its outbox stream (written by the purchase Lua).
//! The relay reads them through a consumer group, publishes everything it read in one round
//! (persistent, `mandatory`, all confirms in flight at once, across streams; up to
//! `publish_batch_max` purchases per message, `seckill_messaging::batch`), waits for the
//! broker's confirms, and only then `XACK`s and `XDEL`s the confirmed entries. Anything
//! unconfirmed stays pending: after a reconnect the relay first replays its own pending
//! entries, and entries left pending by a replica that died are taken over with
//! `XAUTOCLAIM` once idle long enough (a cursor per stream, so each pass goes on where the
//! last one stopped). Delivery is therefore at-least-once; order-service makes it
//! exactly-once in effect.
//!
//! Which streams to read: the purchase handler hints the stream it left an entry in, so the
//! relay reads the streams that have news; it revisits the streams it knows hold entries
//! every [`REVISIT_EVERY`], and drops them from that set once empty (pruning their group's
//! idle consumers, the names of dead replicas). Every `scan_every` a safety scan
//! ([`registry`]) probes every registered stream's length in batches, which picks up
//! entries another replica wrote and did not relay (it died between the script and its
//! publish), and retires the streams of finished sales once empty. So a pass costs Redis
//! work in proportion to the streams holding entries; only the safety scan touches the
//! streams of sales still running, a page per round trip, and those of finished ones not at
//! all. [`RelayWork`] counts the commands.
//!
//! Behind handlers that publish their own purchases (`publish_on_accept`, the default), the
//! relay is the safety net: a handler deletes its entry once the broker confirmed it, so the
//! relay publishes only entries still pending `reclaim_idle` after it first read them (the
//! handler's publish failed or timed out, or its process died), through the reclaim.
//!
//! Each round is noted in transit in Postgres (`seckill_store::transit`) before it is
//! published: a copy the broker takes only after Redis lost the outbox entry is then still
//! waited for by the ledger fence (`crate::stock::fence`). A round that cannot be noted is
//! not published (it stays pending, and the relay reconnects).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use redis::aio::ConnectionLike;
use redis::streams::{StreamAutoClaimReply, StreamId, StreamReadReply};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use seckill_messaging::batch::{self, Outgoing, Purchase};
use seckill_messaging::{
    ConfirmedPublisher, Health, NotTaken, OrderSigner, PublishError, Supervised, Supervisor,
    Topology,
};
use seckill_store::RedisKeys;
use seckill_telemetry::TraceParent;

#[cfg(feature = "failpoints")]
use crate::failpoints::redis_lost;
use crate::metrics as names;

pub mod age;
pub mod registry;

pub use age::OutboxAge;
use registry::Counted;
pub use registry::{RelayWork, prune_consumers, register};

/// The consumer group every replica's relay joins.
pub const GROUP: &str = "relay";

/// Creates the relay's consumer group on `stream` (and the stream), if missing.
pub async fn create_group<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
) -> redis::RedisResult<()> {
    let created: redis::RedisResult<()> = redis::cmd("XGROUP")
        .arg("CREATE")
        .arg(stream)
        .arg(GROUP)
        .arg("0")
        .arg("MKSTREAM")
        .query_async(conn)
        .await;
    match created {
        Err(e) if e.code() == Some("BUSYGROUP") => Ok(()),
        other => other,
    }
}

/// Removes published entries from `stream` and from every consumer's pending list.
pub async fn ack_and_delete<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    ids: &[impl redis::ToRedisArgs],
) -> redis::RedisResult<()> {
    // Same key, so one slot: fine as a transaction on a cluster too.
    redis::pipe()
        .atomic()
        .cmd("XACK")
        .arg(stream)
        .arg(GROUP)
        .arg(ids)
        .ignore()
        .cmd("XDEL")
        .arg(stream)
        .arg(ids)
        .ignore()
        .query_async(conn)
        .await
}

/// [`ack_and_delete`] for entries of several streams: in one pipeline (one round trip) on a
/// single server; stream by stream on a cluster, whose pipelines must stay in one slot. Not
/// atomic across streams, nor needs to be: an entry left behind is published once more.
pub async fn ack_and_delete_streams<C, I>(
    conn: &mut C,
    entries: &[(&str, Vec<I>)],
    cluster: bool,
) -> redis::RedisResult<()>
where
    C: ConnectionLike + Send,
    I: redis::ToRedisArgs,
{
    if cluster {
        for (stream, ids) in entries {
            ack_and_delete(conn, stream, ids).await?;
        }
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for (stream, ids) in entries {
        pipe.cmd("XACK").arg(*stream).arg(GROUP).arg(ids).ignore();
        pipe.cmd("XDEL").arg(*stream).arg(ids).ignore();
    }
    pipe.query_async(conn).await
}

/// Tells the relay which streams have new entries; shared by the handlers and the relay.
#[derive(Debug, Default)]
pub struct RelayHints {
    streams: Mutex<BTreeSet<String>>,
    wakeup: Notify,
}

impl RelayHints {
    /// `stream` has a new entry: read it soon.
    pub fn hint(&self, stream: String) {
        self.streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(stream);
        self.wakeup.notify_one();
    }

    fn take(&self) -> BTreeSet<String> {
        std::mem::take(
            &mut *self
                .streams
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// What the relay needs; see the module docs for how it works.
#[derive(Clone)]
pub struct Relay {
    /// Where the outbox streams are.
    pub redis: seckill_store::Redis,
    /// Key names.
    pub keys: RedisKeys,
    /// Broker to publish to.
    pub amqp_url: String,
    /// Exchange and routing key.
    pub topology: Topology,
    /// Signs each message, so order-service knows it comes from here.
    pub signer: OrderSigner,
    /// Where each round is noted in transit before it is published.
    pub db: sqlx::PgPool,
    /// Entries per stream per round.
    pub batch: usize,
    /// Purchases one message carries at most (`publish_batch_max`).
    pub batch_max: usize,
    /// Entries idle this long on another consumer are taken over.
    pub reclaim_idle: Duration,
    /// Streams the purchase handler wrote to, so the relay does not wait for its tick.
    pub hints: Arc<RelayHints>,
    /// True while a confirmed channel is open (read by `/readyz`).
    pub connected: Arc<AtomicBool>,
    /// This replica's consumer name in the group.
    pub consumer: String,
    /// Whether the purchase handlers publish their own entries (`crate::publisher`): then
    /// a new entry is most likely being published by its handler right now, so the relay
    /// leaves it pending and publishes it only if it is still there `reclaim_idle` later.
    pub handlers_publish: bool,
    /// How often the safety scan probes every registered stream (see [`registry`]).
    pub scan_every: Duration,
    /// Consumers of the group holding no entry and idle this long are deleted.
    pub consumer_idle: Duration,
    /// Redis commands this relay sent, and its safety scans.
    pub work: Arc<RelayWork>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("consumer", &self.consumer)
            .finish_non_exhaustive()
    }
}

const IDLE_TICK: Duration = Duration::from_millis(50);
/// Longest the relay waits for each confirm of a round before it reconnects (entries stay).
pub const CONFIRM_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the streams known to hold entries are read again, hinted or not.
pub const REVISIT_EVERY: Duration = Duration::from_secs(1);
/// The default `scan_every`: how long an entry nobody hinted (its replica died right after
/// writing it) may wait to be found.
pub const SCAN_EVERY: Duration = Duration::from_secs(5);
/// The default `consumer_idle`: a replica silent this long with nothing pending is gone (a
/// live one that is deleted anyway joins again on its next read, losing nothing).
pub const CONSUMER_IDLE: Duration = Duration::from_secs(600);
/// How often one stream's group is pruned at most.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
const RECLAIM_EVERY: Duration = Duration::from_secs(5);
/// How often entries are reclaimed when the handlers publish: the reclaim is then how the
/// relay publishes what they left behind.
const RECLAIM_EVERY_BEHIND_HANDLERS: Duration = Duration::from_secs(1);

impl Relay {
    /// Runs until `cancel`: (re)connects to the broker with backoff and pumps the outbox.
    pub async fn run(mut self, cancel: CancellationToken) -> anyhow::Result<()> {
        Supervisor::new("outbox relay")
            .counting_failures("outbox_relay_interruptions_total")
            .run(&mut self, &cancel)
            .await;
        Ok(())
    }

    async fn open_publisher(&self) -> anyhow::Result<(lapin::Connection, ConfirmedPublisher)> {
        let connection =
            seckill_messaging::connect(&self.amqp_url, "seckill-api relay", Duration::ZERO).await?;
        let channel = connection.create_channel().await?;
        self.topology
            .declare(&channel)
            .await
            .context("declare topology")?;
        // Bounded: a confirm that never comes would stall the relay.
        let publisher = ConfirmedPublisher::new(channel, CONFIRM_TIMEOUT)
            .await
            .context("enable publisher confirms")?;
        Ok((connection, publisher))
    }

    /// Publishes until cancelled or until the broker or Redis fails.
    async fn pump(
        &self,
        publisher: &ConfirmedPublisher,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        // After a (re)connect, replay our own pending entries first: they may have been
        // published without a confirm reaching us. They are in streams holding entries,
        // which the first pass's safety scan finds.
        let mut replay_own = true;
        let mut last_scan = Instant::now();
        let mut last_revisit = Instant::now();
        let reclaim_every = if self.handlers_publish {
            RECLAIM_EVERY_BEHIND_HANDLERS
        } else {
            RECLAIM_EVERY
        };
        let mut last_reclaim = Instant::now() - reclaim_every;
        // Streams known to hold entries, with their reclaim cursors.
        let mut busy: HashMap<String, String> = HashMap::new();
        let mut pruned: HashMap<String, Instant> = HashMap::new();
        loop {
            if cancel.is_cancelled() {
                return Ok(());
            }
            let mut conn = Counted::new(self.redis.get().await?, &self.work);
            let scan = replay_own || last_scan.elapsed() >= self.scan_every;
            let reclaim = last_reclaim.elapsed() >= reclaim_every;
            let mut streams = self.hints.take();
            if scan {
                let found = registry::scan(
                    &self.redis,
                    &self.work,
                    &self.keys,
                    &self.consumer,
                    self.consumer_idle,
                    unix_ms(),
                )
                .await?;
                metrics::gauge!(names::OUTBOX_BACKLOG).set(found.backlog as f64);
                for stream in found.busy {
                    busy.entry(stream).or_insert_with(|| "0-0".into());
                }
                pruned.retain(|_, at| at.elapsed() < PRUNE_EVERY);
                last_scan = Instant::now();
            }
            if scan || reclaim || last_revisit.elapsed() >= REVISIT_EVERY {
                streams.extend(busy.keys().cloned());
                last_revisit = Instant::now();
            }
            let mut round = Vec::new();
            for stream in &streams {
                let read = self
                    .read(&mut conn, stream, if replay_own { "0" } else { ">" })
                    .await?;
                // Read, the entries are pending on this relay: the reclaim finds those
                // their handlers did not publish and delete.
                let mut entries = if self.handlers_publish && !replay_own {
                    Vec::new()
                } else {
                    read
                };
                if reclaim {
                    let cursor = busy.entry(stream.clone()).or_insert_with(|| "0-0".into());
                    entries.extend(self.reclaim(&mut conn, stream, cursor).await?);
                }
                if !entries.is_empty() {
                    round.push((stream.clone(), entries));
                }
            }
            if reclaim {
                last_reclaim = Instant::now();
            }
            replay_own = false;
            seckill_http::failpoint!("relay::after_read", Err(redis_lost()));
            let moved = self.publish(publisher, &mut conn, round).await?;
            for stream in streams {
                let length: i64 = redis::cmd("XLEN")
                    .arg(&stream)
                    .query_async(&mut conn)
                    .await?;
                if length > 0 {
                    busy.entry(stream).or_insert_with(|| "0-0".into());
                } else if busy.remove(&stream).is_some() && !pruned.contains_key(&stream) {
                    // Drained: dead replicas' names in its group hold nothing any more.
                    prune_consumers(&mut conn, &stream, &self.consumer, self.consumer_idle).await?;
                    pruned.insert(stream, Instant::now());
                }
            }
            drop(conn);
            if moved == 0 {
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = self.hints.wakeup.notified() => {}
                    _ = tokio::time::sleep(IDLE_TICK) => {}
                }
            }
        }
    }

    async fn read<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        stream: &str,
        from: &str,
    ) -> anyhow::Result<Vec<StreamId>> {
        let reply: redis::RedisResult<Option<StreamReadReply>> = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(GROUP)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(self.batch)
            .arg("STREAMS")
            .arg(stream)
            .arg(from)
            .query_async(conn)
            .await;
        let reply = match reply {
            // The stream or group vanished (Redis restarted without data): recreate, retry later.
            Err(e) if e.code() == Some("NOGROUP") => {
                create_group(conn, stream).await?;
                return Ok(Vec::new());
            }
            other => other?,
        };
        Ok(reply
            .map(|r| r.keys.into_iter().flat_map(|k| k.ids).collect())
            .unwrap_or_default())
    }

    async fn reclaim<C: ConnectionLike + Send>(
        &self,
        conn: &mut C,
        stream: &str,
        cursor: &mut String,
    ) -> anyhow::Result<Vec<StreamId>> {
        let reply: redis::RedisResult<StreamAutoClaimReply> = redis::cmd("XAUTOCLAIM")
            .arg(stream)
            .arg(GROUP)
            .arg(&self.consumer)
            .arg(self.reclaim_idle.as_millis() as u64)
            .arg(cursor.as_str())
            .arg("COUNT")
            .arg(self.batch)
            .query_async(conn)
            .await;
        match reply {
            Ok(reply) => {
                // "0-0" once the whole pending list was walked: the next pass starts over.
                *cursor = reply.next_stream_id.clone();
                if !reply.claimed.is_empty() {
                    tracing::info!(
                        stream,
                        count = reply.claimed.len(),
                        "reclaimed outbox entries"
                    );
                    metrics::counter!("outbox_reclaimed_total")
                        .increment(reply.claimed.len() as u64);
                }
                Ok(reply.claimed)
            }
            Err(e) if e.code() == Some("NOGROUP") => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes every entry of the round with all confirms in flight together, then acks
    /// and deletes them, stream by stream, if every one was confirmed and routed. Returns
    /// how many; fails (keeping all of them pending) if any was not.
    async fn publish<C: ConnectionLike + Send>(
        &self,
        publisher: &ConfirmedPublisher,
        conn: &mut C,
        round: Vec<(String, Vec<StreamId>)>,
    ) -> anyhow::Result<usize> {
        if round.is_empty() {
            return Ok(0);
        }
        if !crate::transit::note(&self.db, &purchases(&round)).await {
            anyhow::bail!("could not note the round in transit: it stays in the outbox");
        }
        seckill_http::failpoint!("relay::after_note", Err(redis_lost()));
        let started = Instant::now();
        let prepared: Vec<(usize, Prepared)> = round
            .iter()
            .enumerate()
            .flat_map(|(index, (_, entries))| entries.iter().map(move |e| (index, e)))
            .map(|(index, entry)| (index, Prepared::from_entry(entry)))
            .collect();
        let mut pending = Vec::new();
        for message in batch::group(&prepared, self.batch_max, |(_, p)| &p.purchase) {
            let orders: Vec<Outgoing<'_>> =
                message.iter().map(|(_, p)| p.purchase.outgoing()).collect();
            metrics::histogram!(names::ORDERS_PER_MESSAGE).record(orders.len() as f64);
            let confirm = publisher
                .send_orders(&self.signer, &self.topology, &orders)
                .await
                .context("publish")?;
            let ids: Vec<(usize, String)> = message
                .iter()
                .map(|(index, p)| (*index, p.entry_id.clone()))
                .collect();
            pending.push((ids, confirm));
        }
        metrics::counter!(names::OUTBOX_PUBLISHED).increment(prepared.len() as u64);
        let mut confirmed: Vec<Vec<String>> = vec![Vec::new(); round.len()];
        let mut failed = 0usize;
        let mut returned = 0usize;
        for (ids, confirm) in pending {
            let confirmed_one = publisher.confirmed(confirm).await;
            if let Err(e) = &confirmed_one {
                metrics::counter!(names::OUTBOX_CONFIRM_FAILURES,
                    "reason" => names::confirm_failure_reason(e))
                .increment(ids.len() as u64);
            }
            match confirmed_one {
                Ok(()) => {
                    for (index, id) in ids {
                        confirmed[index].push(id);
                    }
                }
                // Routed nowhere: the queue is missing. Keep the entries; the reconnect that
                // follows re-declares the topology and replays them.
                Err(PublishError::NotTaken(NotTaken::Returned)) => returned += ids.len(),
                Err(PublishError::NotTaken(NotTaken::Nacked | NotTaken::NotConfirmed)) => {
                    failed += ids.len()
                }
                Err(e @ PublishError::TimedOut(_)) => {
                    return Err(e).context("no confirm within the relay's timeout");
                }
                Err(e @ PublishError::Channel(_)) => return Err(e).context("await confirm"),
            }
        }
        // Each entry's publish span ends with its round's confirms.
        drop(prepared);
        metrics::histogram!(names::OUTBOX_CONFIRM_SECONDS).record(started.elapsed().as_secs_f64());
        if failed + returned > 0 {
            // lapin pairs a returned message with whichever confirm resolves next, so which
            // entry was lost is unknowable: keep the whole round for replay (order-service
            // absorbs the duplicates this causes).
            metrics::counter!("outbox_returned_total").increment(returned as u64);
            metrics::counter!("outbox_nacked_total").increment(failed as u64);
            anyhow::bail!(
                "{} outbox entries were not confirmed by the broker ({returned} returned)",
                failed + returned
            );
        }
        seckill_http::failpoint!("relay::after_publish", Err(redis_lost()));
        let done: Vec<(&str, Vec<_>)> = round
            .iter()
            .zip(confirmed)
            .filter(|(_, ids)| !ids.is_empty())
            .map(|((stream, _), ids)| (stream.as_str(), ids))
            .collect();
        let moved = done.iter().map(|(_, ids)| ids.len()).sum::<usize>();
        ack_and_delete_streams(conn, &done, self.redis.is_cluster()).await?;
        seckill_http::failpoint!("relay::after_delete", Err(redis_lost()));
        metrics::counter!(names::OUTBOX_CONFIRMED).increment(moved as u64);
        Ok(moved)
    }
}

/// An outbox entry ready to publish: its fields, and the publish span its message's trace
/// headers name.
struct Prepared {
    entry_id: String,
    purchase: Purchase,
    /// Open until the round's confirms came.
    _span: tracing::Span,
}

impl Prepared {
    fn from_entry(entry: &StreamId) -> Self {
        let payload: Vec<u8> = entry.get("payload").unwrap_or_default();
        let request_id: String = entry.get("request_id").unwrap_or_default();
        let http_request_id: String = entry.get("http_request_id").unwrap_or_default();
        // The purchase's trace, stored with the entry: this publish joins it however late
        // it comes and whichever replica makes it. An entry of an older version has none.
        let stored: Option<String> = entry.get("traceparent");
        let stored = stored.as_deref().and_then(TraceParent::parse_str);
        let tracestate: String = entry.get("tracestate").unwrap_or_default();
        let span = tracing::info_span!(
            "outbox.publish",
            service = "seckill-api",
            request_id = %request_id,
            trace_id = tracing::field::Empty,
        );
        let onwards = stored.map(|stored| {
            seckill_telemetry::continue_trace(&span, Some(&stored), Some(&tracestate)).header()
        });
        let (traceparent, tracestate) = match onwards {
            Some(header) => (header.as_str().to_string(), tracestate),
            None => (String::new(), String::new()),
        };
        Self {
            entry_id: entry.id.clone(),
            purchase: Purchase {
                request_id,
                http_request_id,
                payload,
                traceparent,
                tracestate,
            },
            _span: span,
        }
    }
}

impl Supervised for Relay {
    /// Connects, then pumps the outbox until cancelled or until the broker or Redis fails.
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        let (connection, publisher) = self.open_publisher().await?;
        self.connected.store(true, Ordering::Relaxed);
        health.healthy();
        let pumped = self.pump(&publisher, cancel).await;
        self.connected.store(false, Ordering::Relaxed);
        publisher.close("relay stopping").await;
        let _ = connection.close(200, "relay stopping".into()).await;
        pumped
    }
}

/// The round's purchases (request id, product), for their transit note; an entry that names
/// none is left out (order-service dead-letters it).
fn purchases(round: &[(String, Vec<StreamId>)]) -> Vec<(uuid::Uuid, i64)> {
    round
        .iter()
        .flat_map(|(_, entries)| entries)
        .filter_map(|entry| {
            let payload: Vec<u8> = entry.get("payload")?;
            let msg: seckill_messaging::OrderMessage = serde_json::from_slice(&payload).ok()?;
            Some((msg.request_id, msg.product_id))
        })
        .collect()
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
