//! The products this replica remembers sold out, answered `410` from memory without Redis
//! or Lua.
//!
//! A purchase refused by the product's sold-out flag in Redis (the flag's generation in
//! hand) is remembered for `sold_out_local_ttl_ms` (at most
//! `seckill_config::MAX_SOLD_OUT_MEMORY`), and the product's next purchases on this replica
//! are answered `410` at once. It is forgotten sooner:
//! - when units of it go back on sale (a cancellation, a compensation): `reopen.lua`
//!   announces the product's new generation on Redis pub/sub, [`SoldOutMemory::follow`]
//!   hears it, drops the product and, for [`FLOOR_KEPT`], refuses to remember a decision of
//!   an older generation (one decided before the reopen, finishing after it);
//! - all of them whenever the subscription is (re)made or lost, when announcements may have
//!   been missed.
//!
//! The gateway keeps the same kind of memory at the edge (`gateway/src/sold_out.rs`), fed by
//! the `410`s whose flag this memory still stands behind ([`SoldOutMemory::remember`]).

use std::time::Duration;

use moka::future::Cache;
use tokio_util::sync::CancellationToken;

/// How long a reopened product's generation is kept: longer than any purchase decided
/// before the reopen takes to finish.
pub const FLOOR_KEPT: Duration = Duration::from_secs(60);

/// Products remembered at most (of each kind); the least used go first beyond it.
const CAPACITY: u64 = 10_000;

/// The sold-out products of this replica, and the generations they were last reopened at.
/// Cheap to clone: the clones share the memory.
#[derive(Clone, Debug)]
pub struct SoldOutMemory {
    /// Products seen flagged sold out in Redis recently, each for the memory's TTL.
    flags: Cache<i64, ()>,
    /// The generation each product was last announced reopened at, for [`FLOOR_KEPT`]: a
    /// sold-out decision of an older one predates the reopen and is neither remembered nor
    /// told to the gateway.
    floors: Cache<i64, u64>,
}

impl SoldOutMemory {
    /// An empty memory that keeps each sold-out product for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            flags: Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_live(ttl)
                .build(),
            floors: Cache::builder()
                .max_capacity(CAPACITY)
                .time_to_live(FLOOR_KEPT)
                .build(),
        }
    }

    /// Whether `product_id` is remembered sold out (its purchase is answered `410` at once).
    pub fn is_sold_out(&self, product_id: i64) -> bool {
        self.flags.contains_key(&product_id)
    }

    /// Remembers `product_id` sold out, as its flag read `generation`, unless a reopen of a
    /// later generation was announced since; whether it was (and so whether the flag may be
    /// told to the gateway).
    pub async fn remember(&self, product_id: i64, generation: u64) -> bool {
        if generation < self.floor(product_id).await {
            return false;
        }
        self.flags.insert(product_id, ()).await;
        // Announced between the check and the insert: the announcement's invalidation may
        // have run first.
        if generation < self.floor(product_id).await {
            self.flags.invalidate(&product_id).await;
            return false;
        }
        true
    }

    /// Units of `product_id` went back on sale as `generation`: it is forgotten, and no
    /// decision of an older generation is remembered for [`FLOOR_KEPT`]. The floor is raised
    /// before the flag drops.
    pub async fn reopened(&self, product_id: i64, generation: u64) {
        let floor = self.floor(product_id).await;
        self.floors.insert(product_id, floor.max(generation)).await;
        self.flags.invalidate(&product_id).await;
    }

    /// Forgets every sold-out product (announcements may have been missed).
    pub fn forget_all(&self) {
        self.flags.invalidate_all();
    }

    /// Follows the reopened announcements on `channel` until `cancel`, applying each in the
    /// order heard; `seckill_sold_out_following` is 1 while subscribed.
    pub async fn follow(self, urls: Vec<String>, channel: String, cancel: CancellationToken) {
        use seckill_store::reopened::Event;
        let following = metrics::gauge!(crate::metrics::SOLD_OUT_FOLLOWING);
        // Taken one at a time, in the order heard: a floor is raised before its flag drops.
        let (events, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let follower = seckill_store::reopened::follow(urls, channel, cancel, move |e| {
            let _ = events.send(e);
        });
        let apply = async move {
            while let Some(event) = heard.recv().await {
                match event {
                    Event::Reopened {
                        product_id,
                        generation,
                    } => self.reopened(product_id, generation).await,
                    Event::Subscribed => {
                        self.forget_all();
                        following.set(1.0);
                    }
                    Event::Lost => {
                        self.forget_all();
                        following.set(0.0);
                    }
                }
            }
        };
        tokio::join!(follower, apply);
    }

    /// The generation `product_id` was last announced reopened at, 0 if none recently.
    async fn floor(&self, product_id: i64) -> u64 {
        self.floors.get(&product_id).await.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_remembered_product_is_sold_out_and_others_are_not() {
        let memory = SoldOutMemory::new(LONG);
        assert!(memory.remember(7, 1).await);
        assert!(memory.is_sold_out(7));
        assert!(!memory.is_sold_out(8));
    }

    #[tokio::test]
    async fn a_product_is_forgotten_after_the_ttl() {
        let memory = SoldOutMemory::new(Duration::from_millis(50));
        assert!(memory.remember(7, 1).await);
        seckill_testkit::eventually("the flag expires", Duration::from_secs(5), || async {
            (!memory.is_sold_out(7)).then_some(())
        })
        .await;
    }

    #[tokio::test]
    async fn a_reopen_forgets_the_product_at_once() {
        let memory = SoldOutMemory::new(LONG);
        assert!(memory.remember(7, 1).await);
        memory.reopened(7, 2).await;
        assert!(!memory.is_sold_out(7));
    }

    #[tokio::test]
    async fn a_decision_older_than_the_reopen_is_not_remembered() {
        let memory = SoldOutMemory::new(LONG);
        memory.reopened(7, 3).await;
        assert!(!memory.remember(7, 2).await, "decided before the reopen");
        assert!(!memory.is_sold_out(7));
        assert!(memory.remember(7, 3).await, "sold out again after it");
        assert!(memory.is_sold_out(7));
    }

    #[tokio::test]
    async fn an_older_announcement_does_not_lower_the_floor() {
        let memory = SoldOutMemory::new(LONG);
        memory.reopened(7, 5).await;
        memory.reopened(7, 4).await;
        assert!(!memory.remember(7, 4).await);
    }

    #[tokio::test]
    async fn forgetting_all_drops_every_product() {
        let memory = SoldOutMemory::new(LONG);
        assert!(memory.remember(7, 1).await);
        assert!(memory.remember(8, 1).await);
        memory.forget_all();
        assert!(!memory.is_sold_out(7));
        assert!(!memory.is_sold_out(8));
    }
}
