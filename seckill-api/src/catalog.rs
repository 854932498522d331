//! Products: Postgres is the truth, a Moka cache keeps the hot path off it.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use moka::Expiry;
use moka::future::Cache;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// A product on sale, as every handler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, sqlx::FromRow)]
pub struct Product {
    /// Its id.
    pub id: i64,
    /// Display name.
    pub name: String,
    /// Price per unit, in cents.
    pub price_cents: i64,
    /// Units put on sale.
    pub stock_total: i32,
    /// When the sale opens.
    pub start_at: DateTime<Utc>,
    /// When the sale closes.
    pub end_at: DateTime<Utc>,
}

impl Product {
    /// Whether `now` is inside the sale window `[start_at, end_at)`.
    pub fn is_active(&self, now: DateTime<Utc>) -> bool {
        self.start_at <= now && now < self.end_at
    }
}

/// What an admin sends to create a product.
#[derive(Debug, Clone, Deserialize)]
pub struct NewProduct {
    /// Display name, 1–200 characters.
    pub name: String,
    /// Price per unit, in cents, ≥ 0.
    pub price_cents: i64,
    /// Units on sale, 0–10,000,000.
    pub stock: i32,
    /// When the sale opens.
    pub start_at: DateTime<Utc>,
    /// When the sale closes; after `start_at`.
    pub end_at: DateTime<Utc>,
}

impl NewProduct {
    /// Explains the first rule the request breaks.
    pub fn validate(&self) -> Result<(), String> {
        let name_len = self.name.trim().chars().count();
        if name_len == 0 || name_len > 200 {
            return Err("name must be 1-200 characters".into());
        }
        if self.price_cents < 0 {
            return Err("price_cents must not be negative".into());
        }
        if !(0..=10_000_000).contains(&self.stock) {
            return Err("stock must be between 0 and 10000000".into());
        }
        if self.end_at <= self.start_at {
            return Err("end_at must be after start_at".into());
        }
        Ok(())
    }
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

/// Products by id, cached. Misses are cached too (as `None`), so a flood of requests for
/// an unknown id reaches Postgres once per TTL.
#[derive(Clone)]
pub struct Catalog {
    db: PgPool,
    cache: Cache<i64, Option<Product>>,
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
        "id, name, price_cents, stock_total, start_at, end_at"
    };
}

impl Catalog {
    /// A catalog over `db` whose entries live about `ttl`.
    pub fn new(db: PgPool, ttl: Duration) -> Self {
        let cache = Cache::builder()
            .max_capacity(100_000)
            .expire_after(JitteredTtl(ttl))
            .build();
        Self { db, cache }
    }

    /// The database pool, for queries beyond products.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// The product, from the cache or Postgres. Concurrent misses share one query.
    pub async fn get(&self, id: i64) -> Result<Option<Product>, sqlx::Error> {
        let db = self.db.clone();
        self.cache
            .try_get_with(id, async move {
                sqlx::query_as::<_, Product>(concat!(
                    "SELECT ",
                    product_columns!(),
                    " FROM products WHERE id = $1"
                ))
                .bind(id)
                .fetch_optional(&db)
                .await
            })
            .await
            .map_err(|e| sqlx::Error::Protocol(e.to_string()))
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

    /// Inserts a product and caches it.
    pub async fn create(&self, new: &NewProduct) -> Result<Product, sqlx::Error> {
        let product = sqlx::query_as::<_, Product>(concat!(
            "INSERT INTO products (name, price_cents, stock_total, stock_remaining, start_at, end_at) ",
            "VALUES ($1, $2, $3, $3, $4, $5) RETURNING ",
            product_columns!()
        ))
        .bind(new.name.trim())
        .bind(new.price_cents)
        .bind(new.stock)
        .bind(new.start_at)
        .bind(new.end_at)
        .fetch_one(&self.db)
        .await?;
        // A cached "no such product" from before the insert must not hide it.
        self.cache.insert(product.id, Some(product.clone())).await;
        Ok(product)
    }
}
