//! What of the order flow this replica has in hand, told to Postgres for seckill-api's fence
//! (`seckill_api::stock::fence`): after Redis lost a product's ledger, the product sells
//! again only once none of its accepted purchases can still reach Postgres, and other
//! products' purchases must not hold it.
//!
//! Two records, in the tables of migration `0010_in_flight.sql`:
//! - [`Holdings`] — per consuming connection, the products of the deliveries it holds
//!   (received, not yet written, passed on or handed back) and when it last handed one back
//!   to the queue, rewritten every [`REPORT_EVERY`] into `order_holders` *as of* a moment
//!   at which it had read everything the broker had sent it. That moment is a sync point: a
//!   passive declare on the consuming channel, whose answer the broker sends after every
//!   delivery it sent that channel before (a channel's frames keep their order), followed by
//!   reading every delivery already buffered. A connection that consumes nothing holds
//!   nothing new, so its report is as of the moment it is written. Each connection also owns
//!   an exclusive queue that the broker deletes when it closes the connection — which is
//!   when it returns the connection's unacked deliveries to the queue — so the fence can
//!   tell a dead holder from a slow one.
//! - a purchase passed on to a retry tier or to the dead-letter exchange is noted in transit
//!   (`seckill_store::transit`) *before* its copy is published (if that note fails, the
//!   delivery is handed back instead; `crate::consumer`'s `note_passing_on`): the copy is in
//!   flight until an order or a dead letter with its request id exists. Forgeries are never
//!   noted: only a message whose signature verifies names a purchase. This replica deletes
//!   the notes of landed purchases every minute.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::Channel;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use serde::Deserialize;
use sqlx::PgPool;
use uuid::Uuid;

/// How often a consuming connection syncs with the broker and reports what it holds.
pub const REPORT_EVERY: Duration = Duration::from_millis(100);

/// How often landed purchases are cleared from `order_transit`.
const CLEAR_LANDED_EVERY: Duration = Duration::from_secs(60);

/// What one consuming connection holds; shared by its loop, its batches and its reporter.
#[derive(Debug)]
pub struct Holdings {
    id: Uuid,
    alive_queue: String,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Delivery tag → the products of the purchases it carries (none for a body that names
    /// no product).
    held: HashMap<u64, Vec<i64>>,
    /// When a delivery was last handed back to the queue (a nack or a fresh copy).
    handed_back_at: Option<Instant>,
    /// While a broker consumer exists: the start of the last sync (everything sent before
    /// it has been read). None: no consumer, nothing can arrive.
    synced_at: Option<Instant>,
}

impl Holdings {
    /// Holdings of a new connection consuming `queue`.
    pub fn new(queue: &str) -> Self {
        let id = Uuid::new_v4();
        Self {
            id,
            alive_queue: format!("{queue}.holder.{}", id.simple()),
            state: Mutex::new(State::default()),
        }
    }

    /// Declares the connection's exclusive queue, which lives exactly as long as it.
    pub async fn declare_alive(&self, channel: &Channel) -> lapin::Result<()> {
        let options = QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(
                self.alive_queue.as_str().into(),
                options,
                FieldTable::default(),
            )
            .await
            .map(|_| ())
    }

    /// The sync point: returns once the broker answered a passive declare of `queue` on the
    /// consuming channel, so every delivery it sent before is in the consumer's buffer.
    pub async fn sync(channel: &Channel, queue: &str) -> lapin::Result<()> {
        seckill_messaging::queue_stat(channel, queue)
            .await
            .map(|_| ())
    }

    /// Everything the broker sent before `started` has been read (or a broker consumer is
    /// about to start, so nothing it delivers can precede `started`).
    pub fn synced(&self, started: Instant) {
        self.lock().synced_at = Some(started);
    }

    /// The broker consumer ended and every delivery it sent has been read.
    pub fn stopped_consuming(&self) {
        self.lock().synced_at = None;
    }

    /// A delivery arrived, carrying purchases of `products`.
    pub fn received(&self, tag: u64, products: Vec<i64>) {
        self.lock().held.insert(tag, products);
    }

    /// Deliveries are done: written, passed on with their transit noted, or handed back.
    pub fn released(&self, tags: &[u64]) {
        let mut state = self.lock();
        for tag in tags {
            state.held.remove(tag);
        }
    }

    /// A delivery went back to the queue (its nack or its fresh copy is sent).
    pub fn handed_back(&self) {
        self.lock().handed_back_at = Some(Instant::now());
    }

    /// Writes the report, its times on Postgres' clock, each erring on the safe side: the
    /// clock is read first, so `as_of` is no later than the sync it stands for (the write's
    /// own delay cannot move it forward) and a hand-back no earlier than it was sent. Older
    /// reports never overwrite newer.
    pub async fn report(&self, db: &PgPool) -> Result<(), sqlx::Error> {
        let before = Instant::now();
        let clock: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(db)
            .await?;
        let after = Instant::now();
        // `clock` was read between `before` and `after`.
        let at = |instant: Instant, anchor: Instant| {
            let delta = |d: Duration| chrono::Duration::from_std(d).unwrap_or_default();
            if instant >= anchor {
                clock + delta(instant - anchor)
            } else {
                clock - delta(anchor - instant)
            }
        };
        let (as_of, consuming, handed_back, products) = {
            let state = self.lock();
            let as_of = state
                .synced_at
                .map_or(clock, |synced| at(synced.min(after), after));
            let handed_back = state.handed_back_at.map(|sent| at(sent, before));
            let mut products: Vec<i64> = state.held.values().flatten().copied().collect();
            products.sort_unstable();
            products.dedup();
            (as_of, state.synced_at.is_some(), handed_back, products)
        };
        sqlx::query(
            "INSERT INTO order_holders (id, alive_queue, as_of, consuming, requeued_at, products) \
             VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET as_of = EXCLUDED.as_of, \
               consuming = EXCLUDED.consuming, requeued_at = EXCLUDED.requeued_at, \
               products = EXCLUDED.products \
             WHERE order_holders.as_of < EXCLUDED.as_of",
        )
        .bind(self.id)
        .bind(&self.alive_queue)
        .bind(as_of)
        .bind(consuming)
        .bind(handed_back)
        .bind(&products)
        .execute(db)
        .await?;
        Ok(())
    }

    /// Reports every [`REPORT_EVERY`] until the returned guard is stopped or dropped; only
    /// [`Reporting::stop`] deletes the report (a dropped one's queue goes with its
    /// connection, and the fence deletes the report then).
    pub fn report_until_dropped(self: Arc<Self>, db: PgPool) -> Reporting {
        let holdings = self.clone();
        let pool = db.clone();
        let task = tokio::spawn(async move {
            let mut every = tokio::time::interval(REPORT_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            let mut cleared = Instant::now();
            loop {
                every.tick().await;
                match holdings.report(&pool).await {
                    Ok(()) => failing = false,
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "could not report the deliveries in hand");
                    }
                    Err(_) => {}
                }
                if cleared.elapsed() >= CLEAR_LANDED_EVERY {
                    cleared = Instant::now();
                    if let Err(e) = seckill_store::transit::clear_landed(&pool).await {
                        tracing::debug!(error = %e, "could not clear landed transit notes");
                    }
                }
            }
        });
        Reporting {
            task,
            holdings: self,
            db,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A connection's reporter; [`Reporting::stop`] ends it and deletes the report.
#[derive(Debug)]
pub struct Reporting {
    task: tokio::task::JoinHandle<()>,
    holdings: Arc<Holdings>,
    db: PgPool,
}

impl Reporting {
    /// Ends the reporter and deletes the connection's report (it holds nothing any more).
    pub async fn stop(self) {
        self.task.abort();
        let deleted = sqlx::query("DELETE FROM order_holders WHERE id = $1")
            .bind(self.holdings.id)
            .execute(&self.db)
            .await;
        if let Err(e) = deleted {
            // Left behind, the row names a queue that is gone with the connection: the fence
            // deletes it.
            tracing::debug!(error = %e, "could not delete the holder's report");
        }
    }
}

impl Drop for Reporting {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The product a message body names, read without the rest of it.
pub fn product_of(data: &[u8]) -> Option<i64> {
    #[derive(Deserialize)]
    struct Named {
        product_id: i64,
    }
    serde_json::from_slice::<Named>(data)
        .ok()
        .map(|named| named.product_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_reports_the_products_in_hand_until_they_are_released() {
        let holdings = Holdings::new("ns.orders.created");
        let products = |bodies: &[&[u8]]| bodies.iter().filter_map(|b| product_of(b)).collect();
        holdings.received(
            1,
            products(&[br#"{"request_id":"x","product_id":7,"user_id":1}"#]),
        );
        holdings.received(2, products(&[br#"{"product_id":7}"#, b"not json"]));
        holdings.received(3, products(&[b"not json"]));
        holdings.received(4, products(&[br#"{"product_id":9}"#]));
        let held = |holdings: &Holdings| {
            let mut products: Vec<i64> = holdings.lock().held.values().flatten().copied().collect();
            products.sort_unstable();
            products
        };
        assert_eq!(held(&holdings), [7, 7, 9]);
        holdings.released(&[1, 4]);
        assert_eq!(held(&holdings), [7]);
        holdings.released(&[2, 3]);
        assert!(held(&holdings).is_empty());
        assert!(
            holdings
                .alive_queue
                .starts_with("ns.orders.created.holder.")
        );
    }
}
