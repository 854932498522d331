//! The Redis stock engine: sharded buckets, the purchase step, lazy loading under a lock.
//!
//! # Buckets
//! A product's stock is split into N buckets (`products.stock_buckets`), each a few keys
//! with its own hash tag, so one product's load spreads over a Redis Cluster and no script
//! ever touches two slots. Every buyer has a **home bucket** (`home_bucket(user, N)`), which
//! holds their purchase marker and their result. That is what keeps "one unit per user"
//! exact: whichever bucket the unit comes from, the decision that this user may buy is made
//! in one place.
//!
//! # The purchase
//! 1. `purchase.lua` on the home bucket: window, marker, and if the home bucket has a unit,
//!    deduct + marker + outbox entry + result, atomically. This is the whole hot path.
//! 2. If the home bucket is dry, a **sweep**: read the product's sold-out flag (and its
//!    generation), reserve the marker in the home bucket (`reserve.lua`), then visit every
//!    bucket (from a random start, so sweeping buyers do not pile onto one donor) with
//!    `take.lua`, which deducts one unit and writes the outbox entry in *that* bucket's slot.
//!    The first unit found is the buyer's; `settle.lua` turns the reservation into a marker
//!    that says where it came from. If every bucket was dry, the reservation is released,
//!    the flag is raised (unless the generation moved) and the answer is sold out.
//!
//! Why this and not moving stock between buckets: a transfer takes units out of one slot
//! and puts them into another in two steps, so a crash or a concurrent sweep can strand
//! units in transit and turn a buyer away while stock exists. A sweep never moves stock:
//! a unit leaves a bucket only inside the script that also writes its outbox entry. Units
//! only decrease during a sale, so a sweep that found every bucket dry proves the product
//! was sold out when it finished: **no buyer hears `sold_out` while a bucket holds stock**.
//! (A unit put back by a cancellation is bumped through the generation, see
//! `sold_out.lua`.) The price is a few extra round trips for buyers whose home ran dry,
//! which only happens near the end of a sale; the flags then keep late requests off Lua.
//!
//! # Abandoned reservations
//! A replica can die between `reserve` and `settle`. `take.lua` refuses a reservation older
//! than `sweep_fence_ms` (Redis' clock), so once a reservation is older than the fence plus
//! a clock-skew margin, no sweep can still take a unit for it. The next purchase by that
//! user then finds the marker stale, looks for a unit taken under that reservation in
//! every bucket's `takers` hash, and either settles the marker (the user holds a unit: 409)
//! or releases it and buys normally.
//!
//! # Loading
//! Stock is not preloaded. A purchase that finds its bucket missing takes the product's load
//! lock (`SET NX PX` with a random token, TTL shorter than the request deadline), reads one
//! Postgres snapshot (the product's ledger version and every purchase holding a unit: live
//! orders, and dead letters not given up), and fills each missing bucket with a script that
//! refuses to overwrite a loaded one, then releases the lock by compare-and-delete. Others
//! wait with jittered backoff, bounded by `load_wait_ms`. A bucket gets its share of the
//! total less the purchases whose unit came from it, so a load that died half-way is
//! finished later without counting one bucket's sales against another; units given back
//! after the snapshot are added from the bucket's returns hash (`seckill_store::ledger`
//! has the argument). Bucket keys expire an hour after the sale ends plus a random spread
//! (no expiry storm), the product's state hash no earlier than its buckets; the outbox never
//! expires.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use redis::Script;
use sqlx::PgPool;
use uuid::Uuid;

use seckill_messaging::OrderMessage;
use seckill_store::{Redis, RedisConn, RedisKeys, WaitFor, home_bucket};

pub mod fence;
mod snapshot;

use crate::catalog::Product;
use crate::error::ApiError;
use fence::Fence;
use snapshot::Snapshot;

/// How one purchase attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A unit was reserved and the order intent is in the outbox of `bucket`.
    Accepted {
        /// The bucket whose outbox holds the order intent.
        bucket: u16,
        /// The intent as written, unless the script's answer was lost (it ran, but which
        /// entry it wrote is unknown: the relay publishes it).
        intent: Option<Intent>,
    },
    /// No units left.
    SoldOut {
        /// The product's sold-out flag is up in Redis, so a replica may remember it for a
        /// moment. False when a unit went back on sale during the sweep (the flag refused).
        flagged: bool,
    },
    /// This user already holds a unit.
    AlreadyPurchased,
    /// Outside the sale window.
    NotActive,
}

/// What a buyer's marker says of one purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// It was accepted and holds the buyer's unit.
    Accepted,
    /// Its sweep reserved the buyer's marker and has not settled (it may or may not have
    /// taken a unit: a later purchase finds out once the reservation is past its fence).
    Reserved,
    /// The marker is another purchase's, or there is none.
    No,
}

/// An order intent the purchase wrote to an outbox stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The stream entry's id.
    pub entry_id: String,
    /// The order message body.
    pub payload: String,
}

/// One purchase to decide.
#[derive(Debug)]
pub struct PurchaseRequest<'a> {
    /// The product, as the catalog knows it.
    pub product: &'a Product,
    /// The buyer.
    pub user_id: i64,
    /// The purchase id.
    pub request_id: Uuid,
    /// The order message to put in the outbox (its bucket is set where the unit is taken).
    pub message: &'a OrderMessage,
    /// The HTTP request id, kept with the intent for tracing.
    pub http_request_id: &'a str,
}

/// The engine's timing settings.
#[derive(Debug, Clone, Copy)]
pub struct Timings {
    /// Lazy-load lock lifetime.
    pub lock_ttl: Duration,
    /// How long a request waits for another loader.
    pub load_wait: Duration,
    /// How long after its reservation a sweep may take a unit.
    pub sweep_fence: Duration,
    /// Extra age before an abandoned reservation is resolved (clock skew between nodes).
    pub skew_margin: Duration,
}

struct Scripts {
    purchase: Script,
    reserve: Script,
    take: Script,
    settle: Script,
    sold_out: Script,
    load: Script,
    window: Script,
    extend: Script,
    unlock: Script,
}

/// Deducts stock in Redis; cheap to clone.
#[derive(Clone)]
pub struct StockEngine {
    redis: Redis,
    db: PgPool,
    keys: RedisKeys,
    scripts: std::sync::Arc<Scripts>,
    timings: Timings,
    /// Tells when a product whose ledger Redis lost may be loaded again; `None`: never
    /// automatically (such a product stays refused).
    fence: Option<std::sync::Arc<Fence>>,
    /// Copies (replicas, local AOF) an accepted purchase's write waits for; `None`: none.
    wait: Option<WaitFor>,
}

impl std::fmt::Debug for StockEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StockEngine")
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

/// What the home bucket said.
enum Home {
    Accepted(Option<Intent>),
    Dry,
    AlreadyPurchased,
    NotActive,
    NotLoaded,
    Abandoned(String),
}

/// Bucket keys expire this long after the sale ends, plus up to [`EXPIRY_SPREAD`].
const EXPIRY_GRACE: Duration = Duration::from_secs(3600);
const EXPIRY_SPREAD: Duration = Duration::from_secs(600);

impl StockEngine {
    /// An engine over these stores.
    pub fn new(redis: Redis, db: PgPool, keys: RedisKeys, timings: Timings) -> Self {
        Self {
            redis,
            db,
            keys,
            scripts: std::sync::Arc::new(Scripts {
                purchase: Script::new(include_str!("purchase.lua")),
                reserve: Script::new(include_str!("reserve.lua")),
                take: Script::new(include_str!("take.lua")),
                settle: Script::new(include_str!("settle.lua")),
                sold_out: Script::new(include_str!("sold_out.lua")),
                load: Script::new(include_str!("load.lua")),
                window: Script::new(include_str!("window.lua")),
                extend: Script::new(include_str!("extend.lua")),
                unlock: Script::new(include_str!("unlock.lua")),
            }),
            timings,
            fence: None,
            wait: None,
        }
    }

    /// The same engine, waiting for `wait`'s copies of every accepted purchase's write.
    pub fn with_wait(mut self, wait: Option<WaitFor>) -> Self {
        self.wait = wait;
        self
    }

    /// Waits for the copies asked for of the purchase just written through `conn` to a
    /// bucket of `product_id`. The purchase stands either way (its unit is taken and its
    /// intent recorded); a short count means a failover or a crash of this Redis could still
    /// lose it, so it is logged and counted for the operator. Without a wait asked for, it
    /// costs nothing (not even the key).
    async fn await_copies(&self, conn: &mut RedisConn, product_id: i64, bucket: u16) {
        let Some(wait) = self.wait else {
            return;
        };
        let key = self.keys.stock(product_id, bucket);
        let short = match conn.wait_for(&key, wait).await {
            Ok(all_there) => !all_there,
            Err(e) => {
                tracing::warn!(error = %e, "waiting for copies of a purchase failed");
                true
            }
        };
        if short {
            metrics::counter!("seckill_redis_wait_short_total").increment(1);
            tracing::warn!(
                replicas = wait.replicas,
                local_aof = wait.local_aof,
                "an accepted purchase has fewer Redis copies than asked for"
            );
        }
    }

    /// The same engine, telling lost ledgers apart with `fence` (see [`fence`]).
    pub fn with_fence(mut self, fence: Fence) -> Self {
        self.fence = Some(std::sync::Arc::new(fence));
        self
    }

    /// Another replica rebuilt the product's ledger: this one's fence for it is done.
    fn lift_fence(&self, product_id: i64) {
        if let Some(fence) = &self.fence {
            fence.lift(product_id);
        }
    }

    /// Whether this replica holds a product's sales for a ledger Redis lost.
    pub fn is_fenced(&self, product_id: i64) -> bool {
        self.fence.as_ref().is_some_and(|f| f.is_up(product_id))
    }

    /// Decides one purchase, loading the product's stock first if Redis does not have it.
    pub async fn purchase(&self, req: &PurchaseRequest<'_>) -> Result<Decision, ApiError> {
        let home = home_bucket(req.user_id, req.product.buckets());
        for _ in 0..4 {
            match self.try_home(req, home).await? {
                Home::Accepted(intent) => {
                    return Ok(Decision::Accepted {
                        bucket: home,
                        intent,
                    });
                }
                Home::AlreadyPurchased => return Ok(Decision::AlreadyPurchased),
                Home::NotActive => return Ok(Decision::NotActive),
                Home::Dry => return self.sweep(req, home).await,
                Home::NotLoaded => self.ensure_loaded(req.product).await?,
                Home::Abandoned(marker) => {
                    if self.resolve_abandoned(req, home, &marker).await? {
                        return Ok(Decision::AlreadyPurchased);
                    }
                }
            }
        }
        Err(ApiError::Unavailable("stock did not load".into()))
    }

    async fn try_home(&self, req: &PurchaseRequest<'_>, home: u16) -> Result<Home, ApiError> {
        let id = req.product.id;
        let started = Instant::now();
        let stale = self.timings.sweep_fence + self.timings.skew_margin;
        let payload = payload(req, home)?;
        let mut conn = self.redis.get().await?;
        let invoked: redis::RedisResult<(i64, String)> = self
            .scripts
            .purchase
            .key(self.keys.stock(id, home))
            .key(self.keys.buyers(id, home))
            .key(self.keys.outbox(id, home))
            .key(self.keys.results(id, home))
            .arg(req.user_id)
            .arg(req.request_id.to_string())
            .arg(&payload)
            .arg(req.http_request_id)
            .arg(stale.as_millis() as u64)
            .invoke_async(&mut conn)
            .await;
        if matches!(invoked, Ok((1, _))) {
            self.await_copies(&mut conn, id, home).await;
        }
        // Give the connection back before a load or a check, which need connections of
        // their own: holding one while waiting for another starves the pool in a burst.
        drop(conn);
        let (code, detail) = match invoked {
            Ok(answer) => answer,
            Err(e) => {
                // A timeout or a dropped connection loses the answer, not necessarily the
                // effect: if the script ran, this purchase holds a unit and must get 202.
                let marker = format!("h:{}", req.request_id);
                if self
                    .field_is(&self.keys.buyers(id, home), req.user_id, &marker)
                    .await
                {
                    tracing::warn!(error = %e, "purchase script answer lost, but it ran");
                    return Ok(Home::Accepted(None));
                }
                return Err(e.into());
            }
        };
        record_lua("purchase", started);
        Ok(match code {
            1 => Home::Accepted(Some(Intent {
                entry_id: detail,
                payload,
            })),
            0 => Home::Dry,
            -1 => Home::AlreadyPurchased,
            -2 => Home::NotActive,
            -3 => Home::NotLoaded,
            -5 => Home::Abandoned(detail),
            other => {
                return Err(ApiError::Internal(anyhow::anyhow!(
                    "purchase script returned {other}"
                )));
            }
        })
    }

    /// The home bucket is dry: look for a unit in every bucket (see the module docs).
    async fn sweep(&self, req: &PurchaseRequest<'_>, home: u16) -> Result<Decision, ApiError> {
        let product = req.product;
        let id = product.id;
        let mut conn = self.redis.get().await?;
        let (sold_out, generation): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys.product_state(id))
            .arg("sold_out")
            .arg("gen")
            .query_async(&mut conn)
            .await?;
        if sold_out.is_some() {
            metrics::counter!("seckill_sold_out_flag_hits_total", "flag" => "redis").increment(1);
            return Ok(Decision::SoldOut { flagged: true });
        }
        metrics::counter!("seckill_bucket_sweeps_total").increment(1);
        let started = Instant::now();
        let reserved_at: i64 = self
            .scripts
            .reserve
            .key(self.keys.buyers(id, home))
            .key(self.keys.stock(id, home))
            .arg(req.user_id)
            .arg(req.request_id.to_string())
            .invoke_async(&mut conn)
            .await?;
        drop(conn);
        record_lua("reserve", started);
        if reserved_at < 0 {
            return Ok(Decision::AlreadyPurchased);
        }
        let reservation = format!("r:{reserved_at}:{}", req.request_id);
        let buckets = product.buckets();
        let start = rand::random_range(0..buckets);
        // A bucket that cannot be loaded now (Redis lost it: see [`fence`]) is passed over,
        // so the others still sell; but then "every bucket was dry" proves nothing.
        let mut unknown: Option<ApiError> = None;
        for step in 0..buckets {
            let bucket = (start + step) % buckets;
            let payload = payload(req, bucket)?;
            let mut taken = self.take(req, bucket, reserved_at, &payload).await;
            if matches!(taken, Ok((-3, _))) {
                // A load that died half-way left this bucket out: finish it, then retry.
                if let Err(e) = self.ensure_loaded(product).await {
                    unknown = Some(e);
                    continue;
                }
                taken = self.take(req, bucket, reserved_at, &payload).await;
            }
            match taken {
                Ok((1, entry_id)) => {
                    metrics::counter!("seckill_bucket_takes_total").increment(1);
                    let marker = format!("t{bucket}:{}", req.request_id);
                    let result = format!("queued:{}", req.request_id);
                    if let Err(e) = self
                        .settle(id, home, req.user_id, &reservation, &marker, &result)
                        .await
                    {
                        // The unit and its outbox entry stand; the reservation is resolved
                        // later from the takers hash.
                        tracing::warn!(error = %e, "could not settle a swept purchase");
                    }
                    let intent = entry_id.map(|entry_id| Intent { entry_id, payload });
                    return Ok(Decision::Accepted { bucket, intent });
                }
                Ok((0, _)) => {}
                Ok((-2, _)) => {
                    self.release(id, home, req.user_id, &reservation).await?;
                    return Ok(Decision::NotActive);
                }
                Ok((-4, _)) => {
                    self.release(id, home, req.user_id, &reservation).await?;
                    return Err(ApiError::Unavailable("purchase took too long".into()));
                }
                Ok((other, _)) => {
                    return Err(ApiError::Internal(anyhow::anyhow!(
                        "take script returned {other}"
                    )));
                }
                // The take may or may not have run: keep the reservation, which a later
                // purchase resolves once it is past the fence.
                Err(e) => return Err(e),
            }
        }
        self.release(id, home, req.user_id, &reservation).await?;
        if let Some(e) = unknown {
            return Err(e);
        }
        let flagged = self
            .raise_sold_out(product, generation.unwrap_or_default())
            .await?;
        Ok(Decision::SoldOut { flagged })
    }

    /// One sweep step on `bucket`: the script's code, and the outbox entry it wrote (none
    /// when its lost answer was recovered from the takers hash).
    async fn take(
        &self,
        req: &PurchaseRequest<'_>,
        bucket: u16,
        reserved_at: i64,
        payload: &str,
    ) -> Result<(i64, Option<String>), ApiError> {
        let id = req.product.id;
        let started = Instant::now();
        let mut conn = self.redis.get().await?;
        let invoked: redis::RedisResult<(i64, String)> = self
            .scripts
            .take
            .key(self.keys.stock(id, bucket))
            .key(self.keys.takers(id, bucket))
            .key(self.keys.outbox(id, bucket))
            .arg(req.user_id)
            .arg(req.request_id.to_string())
            .arg(payload)
            .arg(req.http_request_id)
            .arg(reserved_at)
            .arg(self.timings.sweep_fence.as_millis() as u64)
            .invoke_async(&mut conn)
            .await;
        if matches!(invoked, Ok((1, _))) {
            self.await_copies(&mut conn, id, bucket).await;
        }
        drop(conn);
        match invoked {
            Ok((code, entry_id)) => {
                record_lua("take", started);
                Ok((code, (code == 1).then_some(entry_id)))
            }
            Err(e) => {
                let mine = format!("{reserved_at}:{}", req.request_id);
                if self
                    .field_is(&self.keys.takers(id, bucket), req.user_id, &mine)
                    .await
                {
                    tracing::warn!(error = %e, "take script answer lost, but it ran");
                    return Ok((1, None));
                }
                Err(e.into())
            }
        }
    }

    async fn settle(
        &self,
        product_id: i64,
        home: u16,
        user_id: i64,
        reservation: &str,
        marker: &str,
        result: &str,
    ) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        let settled: i64 = self
            .scripts
            .settle
            .key(self.keys.buyers(product_id, home))
            .key(self.keys.results(product_id, home))
            .arg(user_id)
            .arg(reservation)
            .arg(marker)
            .arg(result)
            .invoke_async(&mut conn)
            .await?;
        Ok(settled == 1)
    }

    async fn release(
        &self,
        product_id: i64,
        home: u16,
        user_id: i64,
        reservation: &str,
    ) -> Result<bool, ApiError> {
        self.settle(product_id, home, user_id, reservation, "", "")
            .await
    }

    /// A reservation past the fence: did its sweep take a unit? Settles the marker
    /// accordingly; returns whether the user holds a unit.
    async fn resolve_abandoned(
        &self,
        req: &PurchaseRequest<'_>,
        home: u16,
        reservation: &str,
    ) -> Result<bool, ApiError> {
        let id = req.product.id;
        // `r:<ms>:<request id>` (see seckill_store::ledger); the takers hash holds `<ms>:<id>`.
        let reserved_at = reservation
            .trim_start_matches("r:")
            .split(':')
            .next()
            .unwrap_or_default();
        let prefix = format!("{reserved_at}:");
        metrics::counter!("seckill_abandoned_reservations_total").increment(1);
        for bucket in 0..req.product.buckets() {
            let mut conn = self.redis.get().await?;
            let taken: Option<String> = redis::cmd("HGET")
                .arg(self.keys.takers(id, bucket))
                .arg(req.user_id)
                .query_async(&mut conn)
                .await?;
            drop(conn);
            if let Some(request_id) = taken.as_deref().and_then(|t| t.strip_prefix(&prefix)) {
                let marker = format!("t{bucket}:{request_id}");
                let result = format!("queued:{request_id}");
                self.settle(id, home, req.user_id, reservation, &marker, &result)
                    .await?;
                tracing::info!(
                    user_id = req.user_id,
                    bucket,
                    "abandoned reservation held a unit"
                );
                return Ok(true);
            }
        }
        self.release(id, home, req.user_id, reservation).await?;
        tracing::info!(user_id = req.user_id, "abandoned reservation released");
        Ok(false)
    }

    /// Raises the sold-out flag unless a unit went back on sale since `generation` was read;
    /// whether it is up.
    async fn raise_sold_out(
        &self,
        product: &Product,
        generation: String,
    ) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        let raised: i64 = self
            .scripts
            .sold_out
            .key(self.keys.product_state(product.id))
            .arg(generation)
            .arg(expire_at_ms(product))
            .invoke_async(&mut conn)
            .await?;
        if raised == 1 {
            tracing::info!(product_id = product.id, "product sold out");
            metrics::counter!("seckill_sold_out_flags_raised_total").increment(1);
        }
        Ok(raised == 1)
    }

    /// Whether `HGET key field` equals `expected` (false when Redis cannot tell).
    async fn field_is(&self, key: &str, field: i64, expected: &str) -> bool {
        let Ok(mut conn) = self.redis.get().await else {
            return false;
        };
        let stored: Option<String> = redis::cmd("HGET")
            .arg(key)
            .arg(field)
            .query_async(&mut conn)
            .await
            .unwrap_or(None);
        stored.as_deref() == Some(expected)
    }

    /// Units left in Redis over all buckets, or `None` when no bucket is loaded.
    pub async fn remaining(&self, product: &Product) -> Result<Option<i64>, ApiError> {
        let mut total = None;
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            let remaining: Option<i64> = redis::cmd("HGET")
                .arg(self.keys.stock(product.id, bucket))
                .arg("remaining")
                .query_async(&mut conn)
                .await?;
            if let Some(units) = remaining {
                total = Some(total.unwrap_or(0) + units);
            }
        }
        Ok(total)
    }

    /// What the buyer's marker says of purchase `request_id`.
    pub async fn holding(
        &self,
        product: &Product,
        user_id: i64,
        request_id: Uuid,
    ) -> Result<Holding, ApiError> {
        let home = home_bucket(user_id, product.buckets());
        let mut conn = self.redis.get().await?;
        let marker: Option<String> = redis::cmd("HGET")
            .arg(self.keys.buyers(product.id, home))
            .arg(user_id)
            .query_async(&mut conn)
            .await?;
        Ok(match marker {
            Some(m) if seckill_store::ledger::names(&m, request_id) => {
                if m.starts_with("r:") {
                    Holding::Reserved
                } else {
                    Holding::Accepted
                }
            }
            _ => Holding::No,
        })
    }

    /// Whether the product's sold-out flag is up in Redis.
    pub async fn is_flagged_sold_out(&self, product_id: i64) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        let flag: Option<String> = redis::cmd("HGET")
            .arg(self.keys.product_state(product_id))
            .arg("sold_out")
            .query_async(&mut conn)
            .await?;
        Ok(flag.is_some())
    }

    /// Applies a changed sale window to the buckets already loaded (the others load with
    /// the new one).
    pub async fn update_window(&self, product: &Product) -> Result<(), ApiError> {
        let id = product.id;
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            // Before the window opens further: the relay must not retire a stream that
            // purchases can write to again (see `relay::registry`).
            crate::relay::register(
                &mut conn,
                &self.keys,
                &self.keys.outbox(id, bucket),
                product.end_at.timestamp_millis(),
            )
            .await?;
            let _: i64 = self
                .scripts
                .window
                .key(self.keys.stock(id, bucket))
                .key(self.keys.buyers(id, bucket))
                .key(self.keys.takers(id, bucket))
                .key(self.keys.results(id, bucket))
                .key(self.keys.returns(id, bucket))
                .arg(product.start_at.timestamp_millis())
                .arg(product.end_at.timestamp_millis())
                .arg(expire_at_ms(product))
                .invoke_async(&mut conn)
                .await?;
        }
        self.extend_state(product).await
    }

    /// Makes the product's state hash live at least as long as its buckets may.
    async fn extend_state(&self, product: &Product) -> Result<(), ApiError> {
        let mut conn = self.redis.get().await?;
        let _: i64 = self
            .scripts
            .extend
            .key(self.keys.product_state(product.id))
            .arg(expire_at_ms(product) + EXPIRY_SPREAD.as_millis() as i64)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Makes sure every bucket of the product is in Redis, loading under the product's lock.
    async fn ensure_loaded(&self, product: &Product) -> Result<(), ApiError> {
        if let Some(fence) = &self.fence
            && fence.refused_recently(product.id)
        {
            return Err(ApiError::LedgerRebuilding(
                "purchases still in flight".into(),
            ));
        }
        let lock = self.keys.load_lock(product.id);
        let token = Uuid::new_v4().to_string();
        let deadline = Instant::now() + self.timings.load_wait;
        let mut delay = Duration::from_millis(5);
        loop {
            let mut conn = self.redis.get().await?;
            let acquired: Option<String> = redis::cmd("SET")
                .arg(&lock)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(self.timings.lock_ttl.as_millis() as u64)
                .query_async(&mut conn)
                .await?;
            if acquired.is_some() {
                drop(conn);
                // Another loader may have finished between this request's miss and its lock:
                // then nothing is missing, and nothing was lost.
                let loaded = match self.all_buckets_loaded(product).await {
                    Ok(true) => {
                        self.lift_fence(product.id);
                        Ok(())
                    }
                    Ok(false) => match self.check_fence(product).await {
                        Ok(()) => self.load(product).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                };
                let mut conn = self.redis.get().await?;
                let _: i64 = self
                    .scripts
                    .unlock
                    .key(&lock)
                    .arg(&token)
                    .invoke_async(&mut conn)
                    .await?;
                return loaded;
            }
            let loaded: Option<String> = redis::cmd("HGET")
                .arg(self.keys.product_state(product.id))
                .arg("loaded")
                .query_async(&mut conn)
                .await?;
            drop(conn);
            if loaded.is_some() && self.all_buckets_loaded(product).await? {
                self.lift_fence(product.id);
                return Ok(());
            }
            if Instant::now() + delay > deadline {
                return Err(ApiError::Unavailable("stock load in progress".into()));
            }
            metrics::counter!("seckill_load_lock_waits_total").increment(1);
            tokio::time::sleep(delay.mul_f64(rand::random_range(0.5..1.5))).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    /// Before a load: if the product's ledger was in Redis and is gone although its keys
    /// cannot have expired yet, Redis lost it, and the load waits until everything in
    /// flight has landed (see [`fence`]).
    async fn check_fence(&self, product: &Product) -> Result<(), ApiError> {
        let was_loaded: Option<bool> =
            sqlx::query_scalar("SELECT ledger_loaded FROM products WHERE id = $1")
                .bind(product.id)
                .fetch_optional(&self.db)
                .await?;
        let may_have_expired = Utc::now()
            > product.end_at + chrono::Duration::from_std(EXPIRY_GRACE).unwrap_or_default();
        if !was_loaded.unwrap_or(false) || may_have_expired {
            return Ok(());
        }
        let Some(fence) = &self.fence else {
            return Err(ApiError::LedgerRebuilding(
                "redis lost the ledger and no fence can tell when in-flight purchases landed"
                    .into(),
            ));
        };
        if !fence.is_up(product.id) {
            tracing::error!(
                product_id = product.id,
                "redis lost this product's stock ledger: sales paused until every purchase \
                 in flight has landed, then rebuilt from postgres"
            );
            metrics::counter!("seckill_ledger_losses_total").increment(1);
        }
        let outbox = self.outbox_len(product).await?;
        match fence.drained(product.id, outbox).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::LedgerRebuilding(format!(
                "purchases still in flight ({outbox} in the outbox)"
            ))),
            Err(e) => Err(ApiError::LedgerRebuilding(format!("{e:#}"))),
        }
    }

    /// Entries in the product's outbox streams.
    async fn outbox_len(&self, product: &Product) -> Result<i64, ApiError> {
        let mut total = 0;
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            let len: i64 = redis::cmd("XLEN")
                .arg(self.keys.outbox(product.id, bucket))
                .query_async(&mut conn)
                .await?;
            total += len;
        }
        Ok(total)
    }

    async fn all_buckets_loaded(&self, product: &Product) -> Result<bool, ApiError> {
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            let exists: bool = redis::cmd("EXISTS")
                .arg(self.keys.stock(product.id, bucket))
                .query_async(&mut conn)
                .await?;
            if !exists {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Loads every missing bucket from Postgres. Called under the lock.
    async fn load(&self, product: &Product) -> Result<(), ApiError> {
        let started = Instant::now();
        let snapshot = Snapshot::read(&self.db, product).await?;
        let loaded_now = self.fill(product, &snapshot).await?;
        // Every bucket is in: from now on a missing bucket means Redis lost it.
        sqlx::query("UPDATE products SET ledger_loaded = true WHERE id = $1 AND NOT ledger_loaded")
            .bind(product.id)
            .execute(&self.db)
            .await?;
        if let Some(fence) = &self.fence
            && fence.is_up(product.id)
        {
            fence.lift(product.id);
            tracing::warn!(
                product_id = product.id,
                held = snapshot.held.len(),
                "stock ledger rebuilt from postgres after redis lost it: sales resume"
            );
            metrics::counter!("seckill_ledger_rebuilds_total").increment(1);
        }
        if loaded_now > 0 {
            self.catch_up_window(product).await?;
            tracing::info!(
                product_id = product.id,
                held = snapshot.held.len(),
                version = snapshot.version,
                loaded_now,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "stock loaded into redis"
            );
            metrics::counter!("seckill_stock_loads_total").increment(1);
        }
        Ok(())
    }

    /// Writes every bucket not yet in Redis from `snapshot`; returns how many it wrote.
    async fn fill(&self, product: &Product, snapshot: &Snapshot) -> Result<i64, ApiError> {
        let mut conn = self.redis.get().await?;
        let mut loaded_now = 0;
        for bucket in 0..product.buckets() {
            // Register the outbox (and its consumer group) before any unit can be sold, so
            // the relay knows every stream that can hold an accepted purchase.
            let outbox = self.keys.outbox(product.id, bucket);
            crate::relay::register(
                &mut conn,
                &self.keys,
                &outbox,
                product.end_at.timestamp_millis(),
            )
            .await?;
            crate::relay::create_group(&mut conn, &outbox).await?;
            let mut invocation = self.scripts.load.prepare_invoke();
            invocation
                .key(self.keys.stock(product.id, bucket))
                .key(self.keys.buyers(product.id, bucket))
                .key(self.keys.results(product.id, bucket))
                .key(self.keys.returns(product.id, bucket))
                .arg(snapshot.units(bucket))
                .arg(product.start_at.timestamp_millis())
                .arg(product.end_at.timestamp_millis())
                .arg(expire_at_ms(product))
                .arg(snapshot.version);
            for held in snapshot.homed_in(bucket) {
                invocation
                    .arg(held.user_id)
                    .arg(held.request_id.to_string())
                    .arg(held.result());
            }
            let loaded: i64 = invocation.invoke_async(&mut conn).await?;
            loaded_now += loaded;
        }
        let _: () = redis::cmd("HSET")
            .arg(self.keys.product_state(product.id))
            .arg("loaded")
            .arg("1")
            .query_async(&mut conn)
            .await?;
        drop(conn);
        self.extend_state(product).await?;
        Ok(loaded_now)
    }

    /// After a load from `product`, a snapshot that may predate an edit of its window: the
    /// edit's own [`StockEngine::update_window`] (run once the edit is committed) reached
    /// only the buckets loaded before it. Re-reading the window after the load closes the
    /// gap: either this read sees the edit, or the edit committed later and its update saw
    /// these buckets. Without it a bucket could keep the old expiry and, the sale extended,
    /// expire and reload mid-sale on top of its earlier share.
    async fn catch_up_window(&self, product: &Product) -> Result<(), ApiError> {
        let window: Option<(DateTime<Utc>, DateTime<Utc>)> =
            sqlx::query_as("SELECT start_at, end_at FROM products WHERE id = $1")
                .bind(product.id)
                .fetch_optional(&self.db)
                .await?;
        match window {
            Some((start_at, end_at))
                if (start_at, end_at) != (product.start_at, product.end_at) =>
            {
                let edited = Product {
                    start_at,
                    end_at,
                    ..product.clone()
                };
                self.update_window(&edited).await
            }
            _ => Ok(()),
        }
    }
}

/// Bucket `bucket`'s share of `remaining` units over `buckets` buckets: as even as possible.
pub fn share(remaining: i64, buckets: u16, bucket: u16) -> i64 {
    let n = i64::from(buckets.max(1));
    remaining / n + i64::from(i64::from(bucket) < remaining % n)
}

/// When a product's bucket keys expire: an hour after the sale, spread over ten minutes.
fn expire_at_ms(product: &Product) -> i64 {
    let spread = rand::random_range(0..EXPIRY_SPREAD.as_millis() as i64);
    product.end_at.timestamp_millis() + EXPIRY_GRACE.as_millis() as i64 + spread
}

/// The order message body for a unit taken from `bucket`.
fn payload(req: &PurchaseRequest<'_>, bucket: u16) -> Result<String, ApiError> {
    let message = OrderMessage {
        bucket: Some(bucket),
        ..req.message.clone()
    };
    Ok(serde_json::to_string(&message).map_err(anyhow::Error::from)?)
}

fn record_lua(script: &'static str, started: Instant) {
    metrics::histogram!("seckill_lua_seconds", "script" => script)
        .record(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests;
