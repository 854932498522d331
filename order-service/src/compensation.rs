//! Giving purchases up: the payment window, cancellations, and putting units back on sale.
//!
//! Whatever gives a purchase up changes Postgres first, in one transaction: the order (if
//! any) becomes `cancelled` (a purchase that never became one gets a cancelled order in its
//! name: an ignored dead letter, a second purchase of a buyer already holding the product's
//! live order), the product's DB stock goes up again for a unit it had taken, its ledger
//! version moves on, and a row stamped with that version is added to the `compensations`
//! outbox. The [`Compensator`] then relays each row to Redis
//! (`seckill_store::ledger::give_back`: the buyer's marker is cleared and their result becomes
//! `failed:<reason>` — or, when they still hold a live order of the product from another
//! purchase, marker and result become that order's — and the unit goes back into the bucket
//! it came from unless a load already counted it), once per event id however often it runs,
//! and marks it done. Rows are claimed with `FOR UPDATE SKIP LOCKED`, so any number of
//! replicas relay without doing one twice at the same time, and a failed one waits out an
//! exponential backoff — unless its unit may already be back in its bucket under the
//! product's sold-out flag (the reopen failed after the restock): that flag must come down
//! within its bound, so such a row is due again at once and the relay comes back to it after
//! [`REOPEN_RETRY`]. Nothing waits on Redis inside the request or the sweep that decided it,
//! and nothing is lost if Redis is down: the row waits.
//!
//! The payment window needs no timer message: the sweep derives what expired from committed
//! rows (`pay_by < now()`), so a crash or a restart cannot lose a deadline.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use seckill_messaging::{Health, Supervised, Supervisor};
use seckill_store::ledger::{self, GiveUp, Standing};
use seckill_store::{Redis, RedisKeys};

#[cfg(feature = "failpoints")]
use crate::failpoints::postgres_lost;

/// The reason a cancelled order's buyer sees.
pub const REASON_CANCELLED: &str = "cancelled";
/// The reason an unpaid order's buyer sees.
pub const REASON_PAYMENT_EXPIRED: &str = "payment_expired";
/// The reason of a second purchase of a buyer who holds the product's live order already
/// (Redis accepted it after losing their marker). Their result shows the live order instead.
pub const REASON_ALREADY_PURCHASED: &str = "already_purchased";

/// How soon the relay tries a compensation again whose reopen is owed: a unit may be on sale
/// again behind the sold-out flag, which must come down within 500 ms of it going back.
pub const REOPEN_RETRY: Duration = Duration::from_millis(100);

/// Cancels the `created` orders among `order_ids` (all of them, or those of `user_id`):
/// each becomes `cancelled` with `reason`, its product's DB stock goes up, and its unit is
/// queued for Redis. Returns the ids cancelled. Runs in the caller's transaction.
pub async fn cancel_orders(
    conn: &mut PgConnection,
    order_ids: &[i64],
    user_id: Option<i64>,
    reason: &str,
) -> Result<Vec<i64>, sqlx::Error> {
    let given_up: Vec<(i64, uuid::Uuid, i64, i64, Option<i16>)> = sqlx::query_as(
        "UPDATE orders SET status = 'cancelled', cancelled_at = now(), cancel_reason = $3 \
         WHERE id = ANY($1) AND status = 'created' AND ($2::bigint IS NULL OR user_id = $2) \
         RETURNING id, request_id, user_id, product_id, bucket",
    )
    .bind(order_ids)
    .bind(user_id)
    .bind(reason)
    .fetch_all(&mut *conn)
    .await?;
    let mut units: std::collections::BTreeMap<i64, i32> = Default::default();
    for (_, _, _, product_id, _) in &given_up {
        *units.entry(*product_id).or_default() += 1;
    }
    let versions = give_up_units(conn, &units).await?;
    sqlx::query(
        "INSERT INTO compensations (event_id, user_id, product_id, reason, ledger_version, bucket) \
         SELECT g.request_id::text, g.user_id, g.product_id, $5, g.version, g.bucket \
         FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::smallint[], $6::bigint[]) \
           AS g(request_id, user_id, product_id, bucket, version) \
         ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(given_up.iter().map(|g| g.1).collect::<Vec<_>>())
    .bind(given_up.iter().map(|g| g.2).collect::<Vec<_>>())
    .bind(given_up.iter().map(|g| g.3).collect::<Vec<_>>())
    .bind(given_up.iter().map(|g| g.4).collect::<Vec<_>>())
    .bind(reason)
    .bind(
        given_up
            .iter()
            .map(|g| versions.get(&g.3).copied())
            .collect::<Vec<_>>(),
    )
    .execute(&mut *conn)
    .await?;
    Ok(given_up.into_iter().map(|g| g.0).collect())
}

/// Gives units of each product up in the caller's transaction: `units[product]` go back into
/// its database stock (0 for purchases that never took any), and its ledger version moves on
/// (see `seckill_store::ledger`). Returns each product's new version, which the give-ups'
/// compensations carry.
///
/// Product rows are locked in ascending id order, as every writer of orders locks them: two
/// sweeps (or a sweep and a batch of new orders) wait for each other instead of deadlocking.
pub async fn give_up_units(
    conn: &mut PgConnection,
    units: &std::collections::BTreeMap<i64, i32>,
) -> Result<std::collections::HashMap<i64, i64>, sqlx::Error> {
    let mut versions = std::collections::HashMap::with_capacity(units.len());
    for (&product_id, &count) in units {
        let version: Option<i64> = sqlx::query_scalar(
            "UPDATE products SET stock_remaining = stock_remaining + $2, \
             ledger_version = ledger_version + 1 WHERE id = $1 RETURNING ledger_version",
        )
        .bind(product_id)
        .bind(count)
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(version) = version {
            versions.insert(product_id, version);
        }
    }
    Ok(versions)
}

/// Cancels up to `limit` orders whose payment window has passed; returns how many.
pub async fn expire_unpaid(db: &PgPool, limit: i64) -> Result<usize, sqlx::Error> {
    let mut tx = db.begin().await?;
    let due: Vec<i64> = sqlx::query_scalar(
        "SELECT id FROM orders WHERE status = 'created' AND pay_by <= now() \
         ORDER BY pay_by LIMIT $1 FOR UPDATE SKIP LOCKED",
    )
    .bind(limit)
    .fetch_all(&mut *tx)
    .await?;
    if due.is_empty() {
        return Ok(0);
    }
    let cancelled = cancel_orders(&mut tx, &due, None, REASON_PAYMENT_EXPIRED).await?;
    seckill_http::failpoint!("expiry::before_commit", Err(postgres_lost()));
    tx.commit().await?;
    seckill_http::failpoint!("expiry::after_commit", Err(postgres_lost()));
    metrics::counter!("orders_payment_expired_total").increment(cancelled.len() as u64);
    tracing::info!(
        count = cancelled.len(),
        "unpaid orders cancelled after the payment window"
    );
    Ok(cancelled.len())
}

/// Relays the compensation outbox to Redis and runs the payment-window sweep.
#[derive(Debug, Clone)]
pub struct Compensator {
    /// Orders and the outbox.
    pub db: PgPool,
    /// Stock buckets.
    pub redis: Redis,
    /// Key names.
    pub keys: RedisKeys,
    /// How often to look for due work when there was none.
    pub poll: Duration,
    /// Rows claimed per round.
    pub batch: i64,
}

/// What a round finished, and whether a reopen it tried is still owed.
#[derive(Debug, Default, Clone, Copy)]
struct Round {
    worked: usize,
    reopen_owed: bool,
}

#[derive(Debug, sqlx::FromRow)]
struct Due {
    event_id: String,
    user_id: i64,
    product_id: i64,
    reason: String,
    restock: bool,
    attempts: i32,
    buckets: Option<i16>,
    ledger_version: Option<i64>,
    bucket: Option<i16>,
    order_id: Option<i64>,
}

/// The live order each of `due`'s buyers holds of its product from another purchase (request
/// id and order id, by event id): a given-up second purchase hands its buyer's marker and
/// result to it. Each is locked (`FOR SHARE`) until the round commits, so cancelling it waits
/// for the round, and its own release in Redis comes after this round handed the marker to
/// it, never before (which would leave the buyer marked for an order they no longer hold).
async fn standing_orders(
    conn: &mut PgConnection,
    due: &[Due],
) -> Result<std::collections::HashMap<String, (String, i64)>, sqlx::Error> {
    if due.is_empty() {
        return Ok(Default::default());
    }
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT c.event_id, o.request_id::text, o.id \
         FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS c(event_id, user_id, product_id) \
         JOIN orders o ON o.user_id = c.user_id AND o.product_id = c.product_id \
           AND o.status <> 'cancelled' AND o.request_id::text <> c.event_id \
         FOR SHARE OF o",
    )
    .bind(due.iter().map(|d| d.event_id.clone()).collect::<Vec<_>>())
    .bind(due.iter().map(|d| d.user_id).collect::<Vec<_>>())
    .bind(due.iter().map(|d| d.product_id).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(event, request, order)| (event, (request, order)))
        .collect())
}

impl Supervised for Compensator {
    /// Rounds until `cancel` or a round in which nothing but failures happened: at once
    /// after a round that did some work, after a poll when there was none.
    ///
    /// A round that panics (a bug) fails like any other: the supervisor runs the relay again
    /// after its backoff. A panic left alone would end the relay's task for good, with
    /// nothing relaying in this replica from then on — a unit already back in its bucket
    /// (a panic between restock and reopen) would stay under a sold-out flag that never
    /// comes down. The round's transaction is dropped with it, so its rows are due again.
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        loop {
            let round = match AssertUnwindSafe(self.round()).catch_unwind().await {
                Ok(round) => round?,
                Err(panic) => anyhow::bail!("a compensation round panicked: {}", message(&*panic)),
            };
            health.healthy();
            let pause = if round.worked > 0 {
                Duration::ZERO
            } else if round.reopen_owed {
                REOPEN_RETRY.min(self.poll)
            } else {
                self.poll
            };
            tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// What a panic said, when it said it with a string.
fn message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl Compensator {
    /// Runs until `cancel`: sweep expired orders, relay due compensations, sleep when idle;
    /// after a round in which both failed, back off from one poll up to 15 s (plus jitter).
    pub async fn run(mut self, cancel: CancellationToken) {
        Supervisor::new("compensation relay")
            .with_backoff(self.poll, Duration::from_secs(15))
            .run(&mut self, &cancel)
            .await;
    }

    /// Relays the due compensations it can claim; returns how many it finished.
    pub async fn relay_due(&self) -> anyhow::Result<usize> {
        Ok(self.relay().await?.worked)
    }

    async fn relay(&self) -> anyhow::Result<Round> {
        let mut tx = self.db.begin().await?;
        let due: Vec<Due> = sqlx::query_as(
            "SELECT c.event_id, c.user_id, c.product_id, c.reason, c.restock, c.attempts, \
                    p.stock_buckets AS buckets, c.ledger_version, c.bucket, o.id AS order_id \
             FROM compensations c LEFT JOIN products p ON p.id = c.product_id \
             LEFT JOIN orders o ON o.request_id = CASE \
               WHEN c.event_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' \
               THEN c.event_id::uuid END \
             WHERE c.done_at IS NULL AND c.due_at <= now() \
             ORDER BY c.due_at LIMIT $1 FOR UPDATE OF c SKIP LOCKED",
        )
        .bind(self.batch)
        .fetch_all(&mut *tx)
        .await?;
        let standing = standing_orders(&mut tx, &due).await?;
        let mut relayed = Round::default();
        for row in &due {
            match self.put_back(row, standing.get(&row.event_id)).await {
                Ok(outcome) => {
                    seckill_http::failpoint!("compensation::after_reopen", Err(postgres_lost()));
                    sqlx::query("UPDATE compensations SET done_at = now() WHERE event_id = $1")
                        .bind(&row.event_id)
                        .execute(&mut *tx)
                        .await?;
                    seckill_http::failpoint!("compensation::after_done", Err(postgres_lost()));
                    metrics::counter!("orders_compensated_total", "reason" => row.reason.clone())
                        .increment(1);
                    tracing::info!(event_id = %row.event_id, product_id = row.product_id,
                        user_id = row.user_id, reason = %row.reason, outcome, "unit back on sale");
                    relayed.worked += 1;
                }
                Err(e) => {
                    // An owed reopen is due again at once: the loop returns to it after
                    // REOPEN_RETRY (so does any replica polling meanwhile).
                    let backoff_ms = if e.reopen_owed {
                        0
                    } else {
                        (500i64 << row.attempts.clamp(0, 7)).min(60_000)
                    };
                    relayed.reopen_owed |= e.reopen_owed;
                    // Owed reopens are retried ten times a second: log a few of them.
                    if !e.reopen_owed || row.attempts % 50 == 0 {
                        tracing::warn!(event_id = %row.event_id, error = %e, backoff_ms,
                            attempts = row.attempts + 1, "compensation failed, will retry");
                    }
                    sqlx::query(
                        "UPDATE compensations SET attempts = attempts + 1, \
                         due_at = now() + make_interval(secs => $2::double precision / 1000) \
                         WHERE event_id = $1",
                    )
                    .bind(&row.event_id)
                    .bind(backoff_ms)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        tx.commit().await?;
        Ok(relayed)
    }

    /// One round of both jobs: the rows they finished, or why neither did.
    async fn round(&self) -> anyhow::Result<Round> {
        // Two independent jobs: a sweep that keeps failing must not hold back units
        // waiting to go back on sale, nor the other way round.
        let expired = expire_unpaid(&self.db, self.batch)
            .await
            .map_err(|e| anyhow::Error::from(e).context("payment-window sweep"));
        let relayed = self.relay().await.map_err(|e| e.context("relay"));
        let round = Round {
            worked: *expired.as_ref().unwrap_or(&0)
                + relayed.as_ref().map_or(0, |relayed| relayed.worked),
            reopen_owed: relayed.as_ref().is_ok_and(|relayed| relayed.reopen_owed),
        };
        match (expired.err(), relayed.err()) {
            (None, None) => Ok(round),
            (Some(e), Some(also)) => Err(e.context(format!("{also:#}"))),
            // The other job is making progress (or owes a reopen soon): no backoff, but say
            // what failed.
            (Some(e), None) | (None, Some(e)) if round.worked > 0 || round.reopen_owed => {
                tracing::warn!(error = format!("{e:#}"), "compensation round failed");
                Ok(round)
            }
            (Some(e), None) | (None, Some(e)) => Err(e),
        }
    }

    /// The Redis side of one compensation (see `seckill_store::ledger`), `standing` the
    /// live order its buyer holds of the product from another purchase; its outcome.
    async fn put_back(
        &self,
        row: &Due,
        standing: Option<&(String, i64)>,
    ) -> Result<&'static str, ledger::GiveBackError> {
        let result = format!("failed:{}", row.reason);
        let outcome = ledger::give_back(
            &self.redis,
            &self.keys,
            &GiveUp {
                product_id: row.product_id,
                buckets: row.buckets.and_then(|b| u16::try_from(b).ok()).unwrap_or(1),
                user_id: row.user_id,
                event_id: &row.event_id,
                order_id: row.order_id,
                origin: row.bucket.and_then(|b| u16::try_from(b).ok()),
                version: row.ledger_version,
                restock: row.restock,
                result: &result,
                standing: standing.map(|(request_id, order_id)| Standing {
                    request_id,
                    order_id: *order_id,
                }),
            },
        )
        .await?;
        Ok(outcome.as_str())
    }
}
