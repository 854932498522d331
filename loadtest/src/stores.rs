//! Reading the stores: waiting for the system to go quiet, then gathering the facts the
//! verdict is judged on.

use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use seckill_store::RedisKeys;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

/// How often the wait for quiet looks at the stores.
const POLL_EVERY: Duration = Duration::from_millis(200);

/// Read-only handles on Postgres and Redis.
pub struct Probe {
    /// Orders and products.
    db: PgPool,
    /// Stock hashes and outbox streams.
    redis: seckill_store::Redis,
    /// The key layout of the namespace under test.
    keys: RedisKeys,
}

/// The store-side numbers of one product after the burst.
pub struct Observed {
    /// Live orders of the product.
    pub orders_in_db: i64,
    /// Distinct buyers among them.
    pub distinct_buyers: i64,
    /// `products.stock_total`.
    pub stock_total: i64,
    /// Redis `remaining`, 0 when the stock hash is missing.
    pub redis_remaining: i64,
    /// Accepted request ids with no order row.
    pub missing_orders: i64,
}

/// How the wait for quiet ended.
pub struct QuietWait {
    /// Time spent waiting.
    pub elapsed: Duration,
    /// False when the timeout hit before the condition held.
    pub quiet: bool,
}

impl Probe {
    /// Connects to both stores and checks they answer, so a dead dependency fails the run
    /// before any traffic is sent.
    pub async fn connect(
        database_url: &str,
        redis_url: &str,
        namespace: &str,
    ) -> anyhow::Result<Self> {
        let db = PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(database_url)
            .await
            .context("connecting to Postgres")?;
        let redis = seckill_store::Redis::new(redis_url, redis_url.contains(','), 2)
            .context("building the Redis pool")?;
        let mut conn = redis.get().await.context("connecting to Redis")?;
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .context("pinging Redis")?;
        Ok(Self {
            db,
            redis,
            keys: RedisKeys::new(namespace),
        })
    }

    /// The Postgres pool, for readers with questions of their own.
    pub fn db(&self) -> &PgPool {
        &self.db
    }

    /// `products.stock_total`, or `None` if the product does not exist.
    pub async fn stock_total(&self, product_id: i64) -> anyhow::Result<Option<i64>> {
        let total: Option<i32> =
            sqlx::query_scalar("SELECT stock_total FROM products WHERE id = $1")
                .bind(product_id)
                .fetch_optional(&self.db)
                .await
                .context("reading products.stock_total")?;
        Ok(total.map(i64::from))
    }

    /// Live orders of the product and how many distinct users hold them.
    async fn live_orders(&self, product_id: i64) -> anyhow::Result<(i64, i64)> {
        sqlx::query_as(
            "SELECT count(*), count(DISTINCT user_id) FROM orders \
             WHERE product_id = $1 AND status <> 'cancelled'",
        )
        .bind(product_id)
        .fetch_one(&self.db)
        .await
        .context("counting live orders")
    }

    /// Accepted request ids with no order row, whatever the order's status.
    async fn missing_orders(&self, accepted: &[Uuid]) -> anyhow::Result<i64> {
        sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::uuid[]) AS accepted(id) \
             WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.request_id = accepted.id)",
        )
        .bind(accepted)
        .fetch_one(&self.db)
        .await
        .context("looking up accepted request ids")
    }

    /// How many Redis buckets the product's stock is split into.
    async fn buckets(&self, product_id: i64) -> anyhow::Result<u16> {
        let buckets: i16 = sqlx::query_scalar("SELECT stock_buckets FROM products WHERE id = $1")
            .bind(product_id)
            .fetch_one(&self.db)
            .await
            .context("reading products.stock_buckets")?;
        Ok(u16::try_from(buckets).unwrap_or(1))
    }

    /// Entries still waiting in the product's outbox streams (XLEN of a missing key is 0).
    pub async fn outbox_len(&self, product_id: i64) -> anyhow::Result<i64> {
        let mut total = 0;
        for bucket in 0..self.buckets(product_id).await? {
            let mut conn = self.redis.get().await.context("connecting to Redis")?;
            let len: i64 = redis::cmd("XLEN")
                .arg(self.keys.outbox(product_id, bucket))
                .query_async(&mut conn)
                .await
                .context("reading the outbox length")?;
            total += len;
        }
        Ok(total)
    }

    /// The request ids of the entries in the product's outbox streams: the purchases taken
    /// and not yet confirmed by the broker (an entry without one is left out).
    pub async fn outbox_request_ids(&self, product_id: i64) -> anyhow::Result<Vec<Uuid>> {
        let mut ids = Vec::new();
        for bucket in 0..self.buckets(product_id).await? {
            let mut conn = self.redis.get().await.context("connecting to Redis")?;
            let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(self.keys.outbox(product_id, bucket))
                .arg("-")
                .arg("+")
                .query_async(&mut conn)
                .await
                .context("reading the outbox")?;
            ids.extend(
                entries
                    .ids
                    .iter()
                    .filter_map(|entry| entry.get::<String>("request_id"))
                    .filter_map(|id| id.parse::<Uuid>().ok()),
            );
        }
        Ok(ids)
    }

    /// The buckets' `remaining` fields added up (a missing bucket counts 0).
    pub async fn redis_remaining(&self, product_id: i64) -> anyhow::Result<i64> {
        let mut total = 0;
        for bucket in 0..self.buckets(product_id).await? {
            let mut conn = self.redis.get().await.context("connecting to Redis")?;
            let remaining: Option<i64> = redis::cmd("HGET")
                .arg(self.keys.stock(product_id, bucket))
                .arg("remaining")
                .query_async(&mut conn)
                .await
                .context("reading the Redis stock")?;
            total += remaining.unwrap_or(0);
        }
        Ok(total)
    }

    /// Waits until every accepted purchase has an order and the outbox is drained, or until
    /// `timeout`, going on across a store outage; a spinner shows the progress meanwhile.
    pub async fn wait_until_quiet(
        &self,
        product_id: i64,
        accepted: u64,
        timeout: Duration,
    ) -> anyhow::Result<QuietWait> {
        let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        spinner.set_style(
            ProgressStyle::with_template("{spinner} waiting for quiet [{elapsed}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        spinner.enable_steady_tick(Duration::from_millis(100));

        let started = Instant::now();
        let mut ticks = tokio::time::interval(POLL_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let quiet = loop {
            ticks.tick().await;
            // A store that does not answer (an outage the run is driving through) is a "not
            // yet": the wait goes on until it is back or the timeout ends it.
            let reading = async {
                let (orders, _) = self.live_orders(product_id).await?;
                anyhow::Ok((orders, self.outbox_len(product_id).await?))
            };
            match reading.await {
                Ok((orders, outbox)) => {
                    spinner.set_message(format!("orders {orders}/{accepted}, outbox {outbox}"));
                    if orders >= accepted as i64 && outbox == 0 {
                        break true;
                    }
                }
                Err(e) => spinner.set_message(format!("stores not answering: {e:#}")),
            }
            if started.elapsed() >= timeout {
                break false;
            }
        };
        spinner.finish_and_clear();
        Ok(QuietWait {
            elapsed: started.elapsed(),
            quiet,
        })
    }

    /// Reads every store-side number the verdict needs.
    pub async fn observe(&self, product_id: i64, accepted: &[Uuid]) -> anyhow::Result<Observed> {
        let (orders_in_db, distinct_buyers) = self.live_orders(product_id).await?;
        let stock_total = self
            .stock_total(product_id)
            .await?
            .with_context(|| format!("product {product_id} vanished from the database"))?;
        Ok(Observed {
            orders_in_db,
            distinct_buyers,
            stock_total,
            redis_remaining: self.redis_remaining(product_id).await?,
            missing_orders: self.missing_orders(accepted).await?,
        })
    }
}
