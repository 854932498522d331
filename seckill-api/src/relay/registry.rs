//! Which outbox streams the relay looks at: the registry, its safety scan, and retirement.
//!
//! The registry ([`RedisKeys::outbox_registry`]) is a sorted set of every stream a purchase
//! may write to, scored with the unix ms until which it may (its sale's end). It is written
//! before a bucket is loaded or its window moved ([`register`]), never from a purchase
//! script: in a cluster it lives in its own slot.
//!
//! The safety scan ([`scan`]) is how the relay finds entries nobody told it about (a
//! replica died between its purchase script and its publish): it reads the registry a page
//! at a time and probes each stream's length, all probes of a page in flight together (one
//! round trip per page on a single server; the cluster client spreads them over the
//! masters). A stream found empty whose sale ended more than [`RETIRE_GRACE`] ago can never
//! be written again unless it is registered again, so it leaves the registry — atomically
//! against such a registration (`retire.lua`) — and its idle consumers are pruned: the
//! streams of finished sales cost nothing from then on. Between scans the relay visits only
//! streams known to hold entries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use seckill_store::{RedisConn, RedisKeys};

/// Streams read from the registry per round trip, and probed together.
const PAGE: isize = 1_000;
/// How long after its sale's end an empty stream is retired: covers the clocks of the
/// relay and of the Redis servers running the purchase scripts, and scripts in flight.
pub const RETIRE_GRACE: Duration = Duration::from_secs(60);

static RETIRE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("retire.lua")));
static PRUNE: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("prune.lua")));

/// Registers `stream` as writable until `until_ms` (unix ms); only ever raises the bound.
pub async fn register<C: ConnectionLike + Send>(
    conn: &mut C,
    keys: &RedisKeys,
    stream: &str,
    until_ms: i64,
) -> redis::RedisResult<()> {
    redis::cmd("ZADD")
        .arg(keys.outbox_registry())
        .arg("GT")
        .arg(until_ms)
        .arg(stream)
        .exec_async(conn)
        .await
}

/// Deletes the consumers of `stream`'s relay group that hold no entry and have been idle
/// longer than `idle`, except `keep`; returns how many.
pub async fn prune_consumers<C: ConnectionLike + Send>(
    conn: &mut C,
    stream: &str,
    keep: &str,
    idle: Duration,
) -> redis::RedisResult<usize> {
    PRUNE
        .key(stream)
        .arg(super::GROUP)
        .arg(idle.as_millis() as u64)
        .arg(keep)
        .invoke_async(conn)
        .await
}

/// Redis work done by a relay, for tests and the `outbox_relay_redis_commands_total` metric.
#[derive(Debug, Default)]
pub struct RelayWork {
    /// Commands sent to Redis (a script call is one).
    pub commands: AtomicU64,
    /// Safety scans completed.
    pub scans: AtomicU64,
}

impl RelayWork {
    /// Commands sent so far.
    pub fn commands(&self) -> u64 {
        self.commands.load(Ordering::Relaxed)
    }

    /// Safety scans completed so far.
    pub fn scans(&self) -> u64 {
        self.scans.load(Ordering::Relaxed)
    }
}

/// A connection that counts the commands sent through it.
pub(super) struct Counted<'a> {
    conn: RedisConn,
    work: &'a RelayWork,
}

impl<'a> Counted<'a> {
    pub(super) fn new(conn: RedisConn, work: &'a RelayWork) -> Self {
        Self { conn, work }
    }

    fn count(&self, commands: usize) {
        self.work
            .commands
            .fetch_add(commands as u64, Ordering::Relaxed);
        metrics::counter!("outbox_relay_redis_commands_total").increment(commands as u64);
    }
}

impl ConnectionLike for Counted<'_> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.count(1);
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.count(pipeline.len());
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// What a safety scan found.
#[derive(Debug, Default)]
pub struct Scan {
    /// Streams holding entries.
    pub busy: Vec<String>,
    /// Entries over all registered streams.
    pub backlog: i64,
    /// Streams that left the registry.
    pub retired: usize,
}

/// The safety scan: probes every registered stream, retires the finished empty ones.
pub(super) async fn scan(
    redis: &seckill_store::Redis,
    work: &RelayWork,
    keys: &RedisKeys,
    consumer: &str,
    consumer_idle: Duration,
    now_ms: i64,
) -> anyhow::Result<Scan> {
    let mut conn = Counted::new(redis.get().await?, work);
    adopt_legacy(redis, work, keys, now_ms).await?;
    let mut found = Scan::default();
    let mut finished = Vec::new();
    let mut start = 0isize;
    loop {
        let page: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(keys.outbox_registry())
            .arg(start)
            .arg(start + PAGE - 1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        let lengths =
            futures_util::future::try_join_all(page.iter().map(|(stream, _)| async move {
                let mut conn = Counted::new(redis.get().await?, work);
                redis::cmd("XLEN")
                    .arg(stream)
                    .query_async::<i64>(&mut conn)
                    .await
            }))
            .await?;
        for ((stream, until_ms), length) in page.iter().zip(lengths) {
            found.backlog += length;
            if length > 0 {
                found.busy.push(stream.clone());
            } else if (*until_ms as i64).saturating_add(RETIRE_GRACE.as_millis() as i64) < now_ms {
                finished.push((stream.clone(), *until_ms as i64));
            }
        }
        if (page.len() as isize) < PAGE {
            break;
        }
        start += PAGE;
    }
    for (stream, until_ms) in finished {
        prune_consumers(&mut conn, &stream, consumer, consumer_idle).await?;
        let removed: i64 = RETIRE
            .key(keys.outbox_registry())
            .arg(&stream)
            .arg(until_ms)
            .invoke_async(&mut conn)
            .await?;
        found.retired += removed as usize;
    }
    work.scans.fetch_add(1, Ordering::Relaxed);
    Ok(found)
}

/// Moves a page of the legacy registry (a plain set, from earlier versions) into the
/// sorted one, each stream writable until its bucket's sale end (an hour from now if its
/// bucket is not loaded: a load registers it anew).
async fn adopt_legacy(
    redis: &seckill_store::Redis,
    work: &RelayWork,
    keys: &RedisKeys,
    now_ms: i64,
) -> anyhow::Result<()> {
    let mut conn = Counted::new(redis.get().await?, work);
    let (_, streams): (u64, Vec<String>) = redis::cmd("SSCAN")
        .arg(keys.legacy_outbox_registry())
        .arg(0)
        .arg("COUNT")
        .arg(PAGE)
        .query_async(&mut conn)
        .await?;
    if streams.is_empty() {
        return Ok(());
    }
    for stream in &streams {
        let end_ms: Option<i64> = match keys.stock_of_outbox(stream) {
            Some(stock) => {
                redis::cmd("HGET")
                    .arg(stock)
                    .arg("end_ms")
                    .query_async(&mut conn)
                    .await?
            }
            None => None,
        };
        let until_ms = end_ms.unwrap_or(now_ms + 3_600_000);
        register(&mut conn, keys, stream, until_ms).await?;
    }
    redis::cmd("SREM")
        .arg(keys.legacy_outbox_registry())
        .arg(&streams)
        .exec_async(&mut conn)
        .await?;
    tracing::info!(
        count = streams.len(),
        "moved outbox streams from the legacy registry"
    );
    Ok(())
}
