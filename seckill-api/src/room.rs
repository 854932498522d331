//! The waiting rooms' set-up in Redis (DESIGN.md §9), written from Postgres.
//!
//! The gateway runs a product's waiting room from the hash [`RedisKeys::room`]: seckill-api
//! writes its set-up fields — `mode`, `start_ms`, `end_ms`, `stock`, `buckets` — and the
//! gateway's scripts keep their counters in the other fields of the same hash. So the set-up
//! is written with `HSET` over the fields it owns, never by replacing the hash, and the hash
//! expires a day after the sale ends (`PEXPIREAT`). One script (`room_setup.lua`) does both
//! at once, on the one key, whose tag (the product's, `{p<id>}`) keeps it in one slot of a
//! Redis Cluster.
//!
//! The write that creates a room's hash also names its line (`line`, a random number, never
//! changed after): a room whose hash Redis lost starts a new line, in which the gateway's
//! tickets and passes of the old one do not verify. It also sets the seed of the room's
//! draw (`seed`, 32 random bytes in hex, never changed after), used when the mode is `raffle`:
//! the gateway publishes its hash before the sale and the seed once entry closes.
//!
//! A product whose room is on always has its set-up written. One whose room is off (`open`)
//! has it written only where its hash exists: a room turned off then says `mode open`, and
//! the products that never had a room get no hash at all.
//!
//! Who writes it:
//! - the replica that created or changed the product, right after the Postgres write
//!   ([`RoomSetup::write_after_edit`]; a failure is logged and left to the others), so a
//!   room is set up by the time the admin's answer says the product is;
//! - [`RoomSync`] on every replica, every `room_sync_ms`, for every product whose room is
//!   on and whose sale has not ended (one `SELECT`), so a Redis that lost a room (a restart,
//!   a failover) has it back within that, whoever wrote it first;
//! - [`RoomSync`] on every replica again for each product change its change listener
//!   ([`crate::catalog_sync`]) hears of, as re-read after the change committed. A round that
//!   read a product before a change may write the old set-up after the change's own write;
//!   the listener's write comes after that round on the same task, so the last write of
//!   every replica is of the product as changed. This is what turns a room off for good: the
//!   rounds never write an `open` product again.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Script;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use seckill_store::RedisKeys;

use crate::catalog::{Catalog, Product};

/// How long a room's hash outlives its sale.
const KEEP_AFTER_END: Duration = Duration::from_secs(24 * 60 * 60);

/// Writes rooms' set-up into Redis.
#[derive(Clone)]
pub struct RoomSetup {
    redis: seckill_store::Redis,
    keys: RedisKeys,
    script: std::sync::Arc<Script>,
}

impl std::fmt::Debug for RoomSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomSetup").finish_non_exhaustive()
    }
}

impl RoomSetup {
    /// Writes through `redis`, under the namespace of `keys`.
    pub fn new(redis: seckill_store::Redis, keys: RedisKeys) -> Self {
        Self {
            redis,
            keys,
            script: std::sync::Arc::new(Script::new(include_str!("room_setup.lua"))),
        }
    }

    /// Writes `product`'s room set-up and the hash's expiry (see the module docs: for a
    /// room that is off, only where its hash exists); the gateway's fields stay as they
    /// are. Whether anything was written.
    pub async fn write(&self, product: &Product) -> redis::RedisResult<bool> {
        let end_ms = product.end_at.timestamp_millis();
        let keep = i64::try_from(KEEP_AFTER_END.as_millis()).unwrap_or(i64::MAX);
        let only_if_exists = if product.waiting_room.is_on() {
            "0"
        } else {
            "1"
        };
        let mut conn = self.redis.get().await?;
        let written: i64 = self
            .script
            .key(self.keys.room(product.id))
            .arg(only_if_exists)
            .arg(product.waiting_room.as_str())
            .arg(product.start_at.timestamp_millis())
            .arg(end_ms)
            .arg(product.stock_total)
            .arg(product.stock_buckets)
            .arg(end_ms.saturating_add(keep))
            // Kept only if this write creates the room: see room_setup.lua.
            .arg(rand::random::<u64>() >> 11)
            .arg(seed())
            .invoke_async(&mut conn)
            .await?;
        Ok(written == 1)
    }

    /// [`Self::write`] after an admin's create or change: a failure is logged, not answered
    /// (Postgres holds the product; every replica's sync writes the room soon).
    pub async fn write_after_edit(&self, product: &Product) {
        if let Err(e) = self.write(product).await {
            tracing::warn!(
                product_id = product.id,
                error = %e,
                "could not write the waiting room's set-up; the sync will"
            );
        }
    }
}

/// A raffle's seed: 32 random bytes in lower-case hex (see room_setup.lua).
fn seed() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes
        .iter()
        .fold(String::with_capacity(64), |mut text, byte| {
            use std::fmt::Write;
            let _ = write!(text, "{byte:02x}");
            text
        })
}

/// Where the change listener hands the products it re-read to [`RoomSync`].
pub type Changed = mpsc::UnboundedSender<Product>;

/// The background task that keeps the rooms' set-up in Redis; see the module docs.
#[derive(Debug)]
pub struct RoomSync {
    catalog: Catalog,
    setup: RoomSetup,
    every: Duration,
    changed: mpsc::UnboundedReceiver<Product>,
}

impl RoomSync {
    /// A sync reading from `catalog`, writing with `setup`, a round every `every`; the
    /// sender is the change listener's.
    pub fn new(catalog: Catalog, setup: RoomSetup, every: Duration) -> (Self, Changed) {
        let (sender, changed) = mpsc::unbounded_channel();
        let sync = Self {
            catalog,
            setup,
            every,
            changed,
        };
        (sync, sender)
    }

    /// Writes every room that is on every `every`, and each changed product as it comes,
    /// until `cancel`. A failed write (Postgres or Redis away) is logged; the next round
    /// tries again, the changed products whose write failed included (a room turned off is
    /// in no round otherwise).
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Changed products not written yet, the latest change of each.
        let mut unwritten: BTreeMap<i64, Product> = BTreeMap::new();
        loop {
            let written = tokio::select! {
                () = cancel.cancelled() => return,
                Some(product) = self.changed.recv() => {
                    unwritten.insert(product.id, product);
                    self.write_changed(&mut unwritten).await
                }
                _ = tick.tick() => tokio::select! {
                    () = cancel.cancelled() => return,
                    round = async {
                        // First: the round's own read is the fresher one.
                        let changed = self.write_changed(&mut unwritten).await;
                        let round = self.round().await;
                        changed.and(round)
                    } => round,
                },
            };
            if let Err(e) = written {
                tracing::warn!(error = format!("{e:#}"), "could not sync a waiting room");
            }
        }
    }

    /// Writes the changed products, keeping those whose write failed for the next round.
    async fn write_changed(&self, unwritten: &mut BTreeMap<i64, Product>) -> anyhow::Result<()> {
        let mut failed = None;
        let products = std::mem::take(unwritten);
        for (id, product) in products {
            if let Err(e) = self.setup.write(&product).await {
                failed = Some(anyhow::Error::from(e).context(format!("room of product {id}")));
                unwritten.insert(id, product);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// One round: reads the products whose room is on, writes each (all of them, even after
    /// one failed; the last failure is returned).
    pub async fn round(&self) -> anyhow::Result<()> {
        let products = self.catalog.rooms_on().await?;
        let mut failed = None;
        for product in &products {
            if let Err(e) = self.setup.write(product).await {
                failed =
                    Some(anyhow::Error::from(e).context(format!("room of product {}", product.id)));
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
