//! Products: Postgres is the truth; a bloom filter, a Moka L1 and a Redis null cache keep the
//! hot path off it.
//!
//! A lookup asks, in order: the bloom filter (a "no" is a 404 from memory, no Redis, no
//! Postgres), Moka, the Redis null cache, Postgres. Every replica keeps the first two in step
//! with Postgres through the `product_changes` notifications (see [`crate::catalog_sync`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use moka::Expiry;
use moka::future::Cache;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

mod input;
mod waiting_room;

use input::WINDOW_RULE;
pub use input::{MAX_BUCKETS, NewProduct, ProductChanges};
pub use waiting_room::WaitingRoom;

use crate::bloom::ProductBloom;
use crate::null_cache::NullCache;

/// A product on sale, as every handler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Product {
    /// Its id.
    pub id: i64,
    /// Display name.
    pub name: String,
    /// Price per unit, in cents.
    pub price_cents: i64,
    /// Units put on sale.
    pub stock_total: i32,
    /// Redis buckets the stock is split into (fixed at creation).
    pub stock_buckets: i16,
    /// When the sale opens.
    pub start_at: DateTime<Utc>,
    /// When the sale closes.
    pub end_at: DateTime<Utc>,
    /// Whether buyers queue in a waiting room before they may buy (DESIGN.md §9).
    pub waiting_room: WaitingRoom,
}

impl Product {
    /// The bucket count as the key layout uses it (the column's CHECK keeps it 1–1024).
    pub fn buckets(&self) -> u16 {
        u16::try_from(self.stock_buckets).unwrap_or(1).max(1)
    }

    /// Whether `now` is inside the sale window `[start_at, end_at)`.
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        self.start_at <= now && now < self.end_at
    }
}

/// How an update ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Stored; the product as it is now.
    Applied(Product),
    /// No product has this id.
    NotFound,
    /// The changes would leave `end_at` at or before `start_at`; nothing was stored.
    Rejected(String),
}

/// Cache entries live for the configured TTL ±20 %, so entries loaded together do not all
/// expire together and stampede Postgres.
struct JitteredTtl(Duration);

impl Expiry<i64, Option<Product>> for JitteredTtl {
    fn expire_after_create(
        &self,
        _key: &i64,
        value: &Option<Product>,
        _created_at: Instant,
    ) -> Option<Duration> {
        // "No such product" is kept briefly: another replica may create it any moment.
        let ttl = if value.is_some() {
            self.0
        } else {
            NEGATIVE_TTL.min(self.0)
        };
        Some(ttl.mul_f64(rand::random_range(0.8..1.2)))
    }
}

/// Products by id, cached. Misses are cached too (as `None`: briefly in Moka, for the null
/// cache's TTL in Redis), so a flood of requests for an id the bloom filter wrongly lets
/// through reaches Postgres about once per TTL.
#[derive(Clone)]
pub struct Catalog {
    db: PgPool,
    cache: Cache<i64, Option<Product>>,
    bloom: Arc<ProductBloom>,
    missing: NullCache,
    /// Bumped by every invalidation. A Postgres read that began before a change may land in
    /// Moka after the change invalidated it; whoever started it sees the epoch moved and
    /// evicts the entry again, so a stale product lives microseconds, not a TTL.
    epoch: Arc<AtomicU64>,
}

impl std::fmt::Debug for Catalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Catalog").finish_non_exhaustive()
    }
}

const NEGATIVE_TTL: Duration = Duration::from_secs(1);

/// The columns of [`Product`], as a literal so queries stay static strings.
macro_rules! product_columns {
    () => {
        "id, name, price_cents, stock_total, stock_buckets, start_at, end_at, waiting_room"
    };
}

impl Catalog {
    /// A catalog over `db` whose Moka entries live about `ttl`. `bloom` must be filled (see
    /// [`crate::catalog_sync`]) before lookups are served: an empty filter answers 404 to all.
    pub fn new(db: PgPool, bloom: Arc<ProductBloom>, missing: NullCache, ttl: Duration) -> Self {
        let cache = Cache::builder()
            .max_capacity(100_000)
            .expire_after(JitteredTtl(ttl))
            .build();
        Self {
            db,
            cache,
            bloom,
            missing,
            epoch: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The database pool, for queries beyond products.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// The product-id filter.
    pub fn bloom(&self) -> &ProductBloom {
        &self.bloom
    }

    /// The product: `None` from the bloom filter without any I/O when the id was never seen,
    /// else from Moka, the null cache or Postgres. Concurrent Moka misses share one load.
    /// A failed load's error is shared by every lookup that waited on it.
    pub async fn get(&self, id: i64) -> Result<Option<Product>, Arc<sqlx::Error>> {
        if !self.bloom.might_contain(id) {
            metrics::counter!("seckill_bloom_checks_total", "result" => "miss").increment(1);
            return Ok(None);
        }
        metrics::counter!("seckill_bloom_checks_total", "result" => "maybe").increment(1);
        if let Some(cached) = self.cache.get(&id).await {
            metrics::counter!("seckill_product_cache_total", "result" => "hit").increment(1);
            return Ok(cached);
        }
        metrics::counter!("seckill_product_cache_total", "result" => "miss").increment(1);
        let epoch = self.epoch.load(Ordering::Acquire);
        let product = self.cache.try_get_with(id, self.load(id, epoch)).await?;
        if self.epoch.load(Ordering::Acquire) != epoch {
            self.cache.invalidate(&id).await;
        }
        Ok(product)
    }

    /// A Moka miss: the null cache, then Postgres (remembering a miss unless a change raced).
    async fn load(&self, id: i64, epoch: u64) -> Result<Option<Product>, sqlx::Error> {
        if self.missing.is_missing(id).await {
            return Ok(None);
        }
        let product = self.fetch(id).await?;
        if product.is_none() && self.epoch.load(Ordering::Acquire) == epoch {
            self.missing.remember(id).await;
        }
        Ok(product)
    }

    async fn fetch(&self, id: i64) -> Result<Option<Product>, sqlx::Error> {
        sqlx::query_as::<_, Product>(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products WHERE id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.db)
        .await
    }

    /// The most recent products, newest first.
    pub async fn list(&self, limit: i64) -> Result<Vec<Product>, sqlx::Error> {
        sqlx::query_as::<_, Product>(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products ORDER BY id DESC LIMIT $1"
        ))
        .bind(limit)
        .fetch_all(&self.db)
        .await
    }

    /// The products whose waiting room is on and whose sale has not ended, in one read: the
    /// rooms whose set-up [`crate::room`] keeps in Redis.
    pub async fn rooms_on(&self) -> Result<Vec<Product>, sqlx::Error> {
        sqlx::query_as::<_, Product>(concat!(
            "SELECT ",
            product_columns!(),
            " FROM products WHERE waiting_room <> 'open' AND end_at > now()"
        ))
        .fetch_all(&self.db)
        .await
    }

    /// Every product id, for rebuilding the bloom filter.
    pub async fn all_ids(&self) -> Result<Vec<i64>, sqlx::Error> {
        sqlx::query_scalar("SELECT id FROM products")
            .fetch_all(&self.db)
            .await
    }

    /// Inserts a product (with `default_buckets` unless it names its own) and makes it
    /// visible here at once; the insert trigger tells the other replicas.
    pub async fn create(
        &self,
        new: &NewProduct,
        default_buckets: i16,
    ) -> Result<Product, sqlx::Error> {
        let product = sqlx::query_as::<_, Product>(concat!(
            "INSERT INTO products ",
            "(name, price_cents, stock_total, stock_remaining, stock_buckets, start_at, end_at, ",
            "waiting_room) VALUES ($1, $2, $3, $3, $6, $4, $5, $7) RETURNING ",
            product_columns!()
        ))
        .bind(new.name.trim())
        .bind(new.price_cents)
        .bind(new.stock)
        .bind(new.start_at)
        .bind(new.end_at)
        .bind(new.buckets.unwrap_or(default_buckets))
        .bind(new.waiting_room.unwrap_or_default())
        .fetch_one(&self.db)
        .await?;
        self.publish(&product).await;
        Ok(product)
    }

    /// Applies `changes` in one statement (so the window is checked against the row as it is
    /// when written) and makes the result visible here at once; the update trigger tells the
    /// other replicas. The Redis stock window is the caller's to update.
    pub async fn update(&self, id: i64, changes: &ProductChanges) -> Result<Edit, sqlx::Error> {
        let updated = sqlx::query_as::<_, Product>(concat!(
            "UPDATE products SET name = COALESCE($2, name), ",
            "price_cents = COALESCE($3, price_cents), ",
            "start_at = COALESCE($4, start_at), end_at = COALESCE($5, end_at), ",
            "waiting_room = COALESCE($6, waiting_room) ",
            "WHERE id = $1 AND COALESCE($5, end_at) > COALESCE($4, start_at) RETURNING ",
            product_columns!()
        ))
        .bind(id)
        .bind(changes.name.as_deref().map(str::trim))
        .bind(changes.price_cents)
        .bind(changes.start_at)
        .bind(changes.end_at)
        .bind(changes.waiting_room)
        .fetch_optional(&self.db)
        .await?;
        if let Some(product) = updated {
            self.publish(&product).await;
            return Ok(Edit::Applied(product));
        }
        // Nothing written: either no such row, or the merged window was empty.
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM products WHERE id = $1)")
                .bind(id)
                .fetch_one(&self.db)
                .await?;
        Ok(if exists {
            Edit::Rejected(WINDOW_RULE.into())
        } else {
            Edit::NotFound
        })
    }

    /// This replica's view of `product` after it was written here.
    async fn publish(&self, product: &Product) {
        self.bloom.insert(product.id);
        // A false positive looked up before the insert may have left a null entry.
        self.missing.forget(product.id).await;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cache.insert(product.id, Some(product.clone())).await;
    }

    /// What Moka holds for `id` now, without loading (the change listener compares windows).
    pub async fn cached(&self, id: i64) -> Option<Option<Product>> {
        self.cache.get(&id).await
    }

    /// Re-reads `id` after a change notification: marks it as a product, clears its null
    /// entry, and replaces the Moka entry by what Postgres holds now.
    pub async fn reload(&self, id: i64) -> Result<Option<Product>, sqlx::Error> {
        self.bloom.insert(id);
        self.missing.forget(id).await;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cache.invalidate(&id).await;
        let product = self.fetch(id).await?;
        // A change committed after this read sends its own notification, handled after this.
        self.cache.insert(id, product.clone()).await;
        Ok(product)
    }

    /// Drops every Moka entry (after notifications may have been missed).
    pub fn invalidate_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.cache.invalidate_all();
    }
}

#[cfg(test)]
mod tests;
