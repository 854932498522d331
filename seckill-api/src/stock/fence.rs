//! Redis lost a product's ledger: sell none of it until every purchase of it in flight has
//! landed.
//!
//! A product whose stock was once loaded (`products.ledger_loaded`) and whose buckets
//! are gone before its keys could have expired was wiped from Redis: a restart without
//! persistence, a flush, an evicted stock hash. (A failover to a replica that lagged but kept
//! the bucket hashes is not seen here; docs/DESIGN.md says what guards that.) Loading it again
//! at once would count only the purchases already in Postgres; those still on their way
//! (accepted, answered `202`) would be sold a second time, and their buyers could buy twice.
//! So such a load waits until none of the product's purchases is on its way, and until then
//! its purchases answer `503 ledger_rebuilding` with `Retry-After`. Landed means in Postgres
//! as an order or as a dead letter, where the rebuild counts it (`seckill_store::ledger`).
//!
//! A purchase on its way is in one of five places; the fence rules each out, in this order:
//! 1. **a publish begun before the loss**: the fence first stands for [`grace`] (the wait
//!    for a purchase's Redis copies, twice the publish timeout and half a second: a
//!    purchase publishes only once its `WAIT` returned). By then each such publish was
//!    confirmed (its message is in the queue) or noted in transit (step 5): the handlers'
//!    publisher notes a message still unconfirmed when its handler stops waiting
//!    (`crate::publisher`), the relay notes a round before publishing it (`crate::relay`);
//! 2. **the product's outbox streams**: they are empty (new purchases of the product are
//!    refused while the fence stands, so nothing is added to them);
//! 3. **the main queue**: a passive declare finds no ready message, answered fast (a quorum
//!    queue whose leader does not answer within 250 ms says "0 ready, 0 consumers"), with
//!    as many consumers as order-service's connections report consuming (so at least one:
//!    with order-service down the fence waits); `t` is read on Postgres' clock after the
//!    answer: every message published before it had been handed out, or settled;
//! 4. **an order-service consumer's hands**: every connection (`order_holders`, see
//!    `order_service::in_flight`) has reported, as of a moment [`DISPATCH_MARGIN`] after
//!    `t` at which it had read everything the broker had sent it, that it holds none of the
//!    product's deliveries and handed none back since 5 s before `t` (a return is applied
//!    after its nack is sent). A connection without such a report counts as holding, unless
//!    its exclusive queue is gone: the broker closed the connection and returns what it held,
//!    so its report is deleted and the reading starts again (the queue still counting the
//!    dead consumer makes the counts of step 3 disagree until the return is applied);
//! 5. **out of sight**: no purchase of the product noted in transit (`seckill_store::transit`:
//!    a publish whose confirm did not come, a relay round, a copy order-service passed on to
//!    a retry tier or the dead-letter exchange) is without an order or a dead letter yet —
//!    however late it comes, up to [`seckill_store::transit::HOLDS_FOR`], past which its
//!    copy is presumed lost and the fence logs its request id.
//!
//! So the fence is the product's: other products' deliveries, retries and dead letters
//! hold nothing, and a product whose purchases have all landed sells again within about
//! [`grace`] and a second of Redis answering. What it cannot tell apart is a backlog in the
//! main queue (a paused or overtaken consumer): those messages may be any product's, so a
//! backlog holds every fenced product until it is delivered.
//!
//! What it rests on is time, not proof, in four places: a handler's unconfirmed publish is
//! noted within the grace (its note is written once the handler stops waiting, at most a
//! publish timeout after it began, which leaves a publish timeout and half a second for
//! the write), a delivery handed out reaches its consumer within [`DISPATCH_MARGIN`], a
//! nack is applied within 5 s, a noted copy lands within
//! [`seckill_store::transit::HOLDS_FOR`]. Past them a purchase may land after the rebuild and its unit
//! be sold twice: Postgres still refuses to oversell, and the later of the two ends as a
//! failed result.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::{DateTime, Utc};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use sqlx::PgPool;

use seckill_messaging::SignatureError;

/// How long the fence stands at least: each publish begun before the loss has by then
/// been confirmed or noted in transit (a handler's job waits at most `publish_timeout` to
/// be taken, and is noted if unconfirmed when that wait ends; a relay round is noted before
/// it is published), with another `publish_timeout` and half a second for the note. A
/// purchase that waits for copies of its Redis write (`redis_wait_*`, up to `copy_wait`)
/// starts publishing only once that wait ends, so it adds to all of it.
pub fn grace(publish_timeout: Duration, copy_wait: Duration) -> Duration {
    copy_wait + 2 * publish_timeout + Duration::from_millis(500)
}

/// How long after a quiet reading the consumers' reports are read: long enough for each to
/// report as of [`DISPATCH_MARGIN`] after it (they report every 100 ms).
const REPORTS_AFTER: Duration = Duration::from_millis(800);

/// A hand-back is noted once its nack is sent; the broker acts on it later (a quorum
/// queue, once the return is committed: seconds when its disk or its leader stalls).
const HAND_BACK_MARGIN: Duration = Duration::from_secs(5);
/// A delivery the queue counted as handed out at `t` reaches its consumer's buffer a moment
/// later (the queue's effects, the channel's mailbox, the socket): a report counts only as
/// of this long after `t`.
const DISPATCH_MARGIN: Duration = Duration::from_millis(500);

/// Remembers each fenced product's readings and asks Postgres and the broker.
#[derive(Debug)]
pub struct Fence {
    amqp_url: String,
    /// The queue order-service consumes.
    queue: String,
    db: PgPool,
    grace: Duration,
    /// One connection for the fence's questions, opened when first needed.
    connection: tokio::sync::Mutex<Option<lapin::Connection>>,
    readings: Mutex<HashMap<i64, Readings>>,
}

#[derive(Debug, Clone, Copy)]
struct Readings {
    since: Instant,
    /// When the last check answered "not yet" (purchases meanwhile are refused at once).
    refused_at: Option<Instant>,
}

/// How long a "not yet" stands before the next purchase checks again.
const RECHECK_AFTER: Duration = Duration::from_millis(500);
/// A fence this long without a check has been left behind: another replica rebuilt the
/// ledger and purchases no longer come here. A later check starts a new fence, so an old
/// reading never speaks for a new loss.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(12);

/// What the consumers' reports say of a product.
#[derive(Debug, PartialEq, Eq)]
enum Holders {
    /// None holds it, none handed anything back, all reported after the reading.
    Clear,
    /// One holds it, handed something back, or has not reported since (and lives).
    Busy,
    /// These connections are closed: their reports are deleted, the reading is void.
    Gone(Vec<uuid::Uuid>),
}

impl Fence {
    /// A fence for the namespace's order queues on the broker at `amqp_url`, waiting
    /// [`grace`]`(publish_timeout, copy_wait)` at least (`copy_wait`: the longest a
    /// purchase waits for copies of its Redis write before it publishes; zero for none).
    pub fn new(
        amqp_url: &str,
        namespace: &str,
        db: PgPool,
        publish_timeout: Duration,
        copy_wait: Duration,
    ) -> Self {
        Self {
            amqp_url: amqp_url.to_string(),
            queue: seckill_messaging::Topology::new(namespace).queue,
            db,
            grace: grace(publish_timeout, copy_wait),
            connection: tokio::sync::Mutex::new(None),
            readings: Mutex::new(HashMap::new()),
        }
    }

    /// Whether none of the product's purchases is on its way any more, for a fenced
    /// product whose outbox streams hold `outbox` entries. The first call for a product
    /// starts its fence (so does one after the fence was left unchecked for
    /// [`FORGOTTEN_AFTER`]). A broker or database that cannot be asked means "not yet".
    pub async fn drained(&self, product_id: i64, outbox: i64) -> anyhow::Result<bool> {
        let now = Instant::now();
        let fresh = Readings {
            since: now,
            refused_at: Some(now),
        };
        let since = {
            let mut all = self.lock();
            let entry = all.entry(product_id).or_insert(fresh);
            if entry
                .refused_at
                .is_none_or(|at| now.duration_since(at) > FORGOTTEN_AFTER)
            {
                *entry = fresh;
            }
            entry.since
        };
        let drained = now.duration_since(since) >= self.grace
            && outbox == 0
            && match self.nothing_on_its_way(product_id).await {
                Ok(nothing) => nothing,
                Err(e) => {
                    tracing::debug!(error = %e, "fence could not tell what is on its way");
                    false
                }
            };
        if !drained && let Some(entry) = self.lock().get_mut(&product_id) {
            entry.refused_at = Some(now);
        }
        Ok(drained)
    }

    /// Steps 3 to 5: a quiet reading of the main queue, then (once every consumer has
    /// reported since) the consumers' reports and the transit notes.
    async fn nothing_on_its_way(&self, product_id: i64) -> anyhow::Result<bool> {
        let Some(quiet) = self.quiet_reading().await? else {
            return Ok(false);
        };
        tokio::time::sleep(REPORTS_AFTER).await;
        Ok(!self.held(product_id, quiet).await?)
    }

    /// Whether the product is fenced and was found not drained a moment ago: refuse without
    /// asking again.
    pub fn refused_recently(&self, product_id: i64) -> bool {
        self.lock()
            .get(&product_id)
            .and_then(|r| r.refused_at)
            .is_some_and(|at| at.elapsed() < RECHECK_AFTER)
    }

    /// The product's ledger was rebuilt: a later loss starts a new fence.
    pub fn lift(&self, product_id: i64) {
        self.lock().remove(&product_id);
    }

    /// Whether a fence stands for the product on this replica (checked recently).
    pub fn is_up(&self, product_id: i64) -> bool {
        self.lock()
            .get(&product_id)
            .and_then(|r| r.refused_at)
            .is_some_and(|at| at.elapsed() <= FORGOTTEN_AFTER)
    }

    /// Asks the broker for the main queue, then reads Postgres' clock: that time, if the
    /// queue had no ready message and exactly as many consumers as order-service's
    /// connections report consuming (so at least one: a quorum queue whose leader did not
    /// answer in time says "0 ready, 0 consumers"). The clock is read after the answer, so
    /// messages dispatched before the broker counted are older than `t`.
    async fn quiet_reading(&self) -> anyhow::Result<Option<DateTime<Utc>>> {
        let channel = self.channel().await?;
        let stat = seckill_messaging::queue_stat(&channel, &self.queue).await;
        let _ = channel.close(200, "fence reading done".into()).await;
        let stat = match stat {
            Ok(Some(stat)) => stat,
            // A slow "0, 0" (see `seckill_messaging::stat`) says nothing.
            Ok(None) => return Ok(None),
            // Not declared yet: nothing was ever published to it, nothing consumes it.
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(e).context("ask the broker for the main queue"),
        };
        let (at, consuming): (DateTime<Utc>, i64) = sqlx::query_as(
            "SELECT clock_timestamp(), (SELECT count(*) FROM order_holders WHERE consuming)",
        )
        .fetch_one(&self.db)
        .await
        .context("read the database's clock")?;
        let quiet =
            stat.messages == 0 && stat.consumers > 0 && i64::from(stat.consumers) == consuming;
        Ok(quiet.then_some(at))
    }

    /// Whether a purchase of the product may still be in a consumer's hands or passed on
    /// and not landed, judged against a quiet reading taken at `quiet` (Postgres' clock).
    async fn held(&self, product_id: i64, quiet: DateTime<Utc>) -> anyhow::Result<bool> {
        match self.holders(product_id, quiet).await? {
            Holders::Clear => {}
            Holders::Busy => return Ok(true),
            Holders::Gone(ids) => {
                sqlx::query("DELETE FROM order_holders WHERE id = ANY($1)")
                    .bind(&ids)
                    .execute(&self.db)
                    .await
                    .context("delete the reports of closed connections")?;
                tracing::info!(
                    connections = ids.len(),
                    "fence: order-service connections closed; their deliveries were returned"
                );
                return Ok(true);
            }
        }
        let unlanded =
            seckill_store::transit::unlanded(&self.db, product_id, &SignatureError::CODES)
                .await
                .context("read the purchases in transit")?;
        if !unlanded.expired.is_empty() {
            tracing::warn!(
                product_id,
                request_ids = ?unlanded.expired,
                "purchases noted in transit long ago never landed; presumed lost"
            );
        }
        Ok(unlanded.holding > 0)
    }

    /// What the consumers' reports say of the product since `quiet`.
    async fn holders(&self, product_id: i64, quiet: DateTime<Utc>) -> anyhow::Result<Holders> {
        let reports: Vec<(uuid::Uuid, String, bool, bool)> = sqlx::query_as(
            "SELECT id, alive_queue, as_of > $2 + make_interval(secs => $4), \
                    $1 = ANY(products) \
                    OR coalesce(requeued_at > $2 - make_interval(secs => $3), false) \
             FROM order_holders",
        )
        .bind(product_id)
        .bind(quiet)
        .bind(HAND_BACK_MARGIN.as_secs_f64())
        .bind(DISPATCH_MARGIN.as_secs_f64())
        .fetch_all(&self.db)
        .await
        .context("read the consumers' reports")?;
        if reports.iter().any(|(_, _, fresh, holds)| *fresh && *holds) {
            return Ok(Holders::Busy);
        }
        // Every silent one is asked, so the reports of closed connections all go at once.
        let (mut gone, mut silent) = (Vec::new(), false);
        for (id, alive_queue, fresh, _) in reports {
            if fresh {
                continue;
            }
            if self.is_closed(&alive_queue).await? {
                gone.push(id);
            } else {
                silent = true;
            }
        }
        Ok(match (gone.is_empty(), silent) {
            (false, _) => Holders::Gone(gone),
            (true, true) => Holders::Busy,
            (true, false) => Holders::Clear,
        })
    }

    /// Whether the broker deleted a consumer's exclusive queue (closed its connection).
    async fn is_closed(&self, alive_queue: &str) -> anyhow::Result<bool> {
        let channel = self.channel().await?;
        // Another connection's exclusive queue is refused as locked while it lives; either
        // refusal closes the channel.
        let asked = seckill_messaging::queue_stat(&channel, alive_queue).await;
        let _ = channel.close(200, "fence probe done".into()).await;
        Ok(matches!(asked, Err(e) if is_not_found(&e)))
    }

    /// A fresh channel on the fence's connection (a refused passive declare closes it).
    async fn channel(&self) -> anyhow::Result<lapin::Channel> {
        let mut connection = self.connection.lock().await;
        if let Some(open) = connection.as_ref()
            && open.status().connected()
            && let Ok(channel) = open.create_channel().await
        {
            return Ok(channel);
        }
        let opened =
            seckill_messaging::connect(&self.amqp_url, "seckill-api fence", Duration::ZERO)
                .await
                .context("connect to the broker")?;
        let channel = opened.create_channel().await?;
        *connection = Some(opened);
        Ok(channel)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Readings>> {
        self.readings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A refusal for a queue that does not exist (which closes the channel).
fn is_not_found(error: &lapin::Error) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(e)
            if matches!(e.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_grace_covers_the_wait_for_copies_before_the_publish_it_delays() {
        let publish = Duration::from_millis(1_000);
        assert_eq!(grace(publish, Duration::ZERO), Duration::from_millis(2_500));
        // A purchase waiting 3 s for its Redis copies starts its publish only then.
        assert_eq!(
            grace(publish, Duration::from_millis(3_000)),
            Duration::from_millis(5_500)
        );
    }
}
