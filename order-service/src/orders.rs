//! Orders in Postgres: the idempotent write and the buyer's queries.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use seckill_messaging::OrderMessage;

#[cfg(feature = "failpoints")]
use crate::failpoints::postgres_lost;

/// What writing one message did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// A new order.
    Created {
        /// Its id.
        order_id: i64,
    },
    /// The purchase (or this user's order of this product) was already there: nothing changed.
    Duplicate {
        /// The existing order's id.
        order_id: i64,
    },
    /// This purchase's order exists and was cancelled (by its buyer, the payment window, or
    /// an operator giving up its dead letter): nothing changed, and the buyer's result, set
    /// when it was cancelled, stands.
    Cancelled {
        /// The cancelled order's id.
        order_id: i64,
    },
    /// Another purchase of this buyer holds the product's live order: this one (a second
    /// purchase Redis accepted after losing the buyer's marker) was given up in the same
    /// transaction — a cancelled order in its name, and a compensation that returns its unit
    /// and leaves the buyer's result on the live order (see [`crate::compensation`]).
    Superseded {
        /// The buyer's live order.
        order_id: i64,
    },
    /// The message can never become an order; retrying will not help.
    Rejected {
        /// snake_case reason, shown to the buyer.
        reason: &'static str,
    },
}

/// An order as its buyer sees it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct Order {
    /// Its id.
    pub id: i64,
    /// The purchase that produced it.
    pub request_id: uuid::Uuid,
    /// The buyer.
    pub user_id: i64,
    /// What was bought.
    pub product_id: i64,
    /// Price paid, in cents.
    pub price_cents: i64,
    /// created, paid or cancelled.
    #[schema(pattern = "^(created|paid|cancelled)$", example = "created")]
    pub status: String,
    /// When the purchase was accepted.
    pub accepted_at: DateTime<Utc>,
    /// When the order was written.
    pub created_at: DateTime<Utc>,
    /// Unpaid by then, it is cancelled and its unit goes back on sale (`null`: no deadline).
    pub pay_by: Option<DateTime<Utc>>,
    /// When it was paid.
    pub paid_at: Option<DateTime<Utc>>,
    /// When it was cancelled.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// Why: `cancelled` (by the buyer), `payment_expired`, `already_purchased` (a second
    /// purchase of a buyer who held this product's live order already, given up), or the
    /// error code of a dead letter an operator gave up (its purchase never became a live
    /// order).
    pub cancel_reason: Option<String>,
}

/// How orders are written.
#[derive(Debug, Clone, Copy)]
pub struct WriteOptions {
    /// How long a transaction waits for a lock before it fails (and the message retries).
    pub lock_timeout: Duration,
    /// Time a new order has to be paid (`pay_by`); `None`: no deadline.
    pub payment_window: Option<Duration>,
}

impl WriteOptions {
    /// The window in seconds for SQL; NULL (no `pay_by`) without one.
    fn window_secs(&self) -> Option<f64> {
        self.payment_window.map(|w| w.as_secs_f64())
    }
}

/// Postgres error codes that mean "this message is wrong", not "try again".
const FOREIGN_KEY_VIOLATION: &str = "23503";
/// An order of a product that does not exist has no price (the price is read from the
/// product, so this comes before the foreign key's own refusal).
const NOT_NULL_VIOLATION: &str = "23502";
const CHECK_VIOLATION: &str = "23514";

/// Writes `msg` as an order, idempotently, in one transaction. The price is the product's
/// in Postgres when the order is written: the message's `price_cents` is never trusted.
/// A purchase whose buyer already holds the product's live order under another request id
/// is given up instead ([`Recorded::Superseded`]).
pub async fn record(
    db: &PgPool,
    msg: &OrderMessage,
    options: WriteOptions,
) -> Result<Recorded, sqlx::Error> {
    let mut tx = begin(db, options.lock_timeout).await?;
    let inserted: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(
        "INSERT INTO orders \
           (request_id, user_id, product_id, price_cents, accepted_at, pay_by, bucket) \
         VALUES ($1, $2, $3, (SELECT price_cents FROM products WHERE id = $3), $4, \
                 now() + make_interval(secs => $5::double precision), $6) \
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(msg.request_id)
    .bind(msg.user_id)
    .bind(msg.product_id)
    .bind(msg.created_at)
    .bind(options.window_secs())
    .bind(bucket_column(msg))
    .fetch_optional(&mut *tx)
    .await;
    let order_id = match inserted {
        Ok(Some(id)) => id,
        Ok(None) => {
            // A unique key matched: this purchase is already recorded ("already done", not an
            // error), or another purchase of this user holds the product's live order.
            let existing: Option<(i64, bool, bool)> = sqlx::query_as(
                "SELECT id, request_id = $1, status = 'cancelled' FROM orders \
                 WHERE request_id = $1 \
                 OR (user_id = $2 AND product_id = $3 AND status <> 'cancelled') \
                 ORDER BY (request_id = $1) DESC LIMIT 1",
            )
            .bind(msg.request_id)
            .bind(msg.user_id)
            .bind(msg.product_id)
            .fetch_optional(&mut *tx)
            .await?;
            return match existing {
                Some((order_id, true, true)) => {
                    tx.rollback().await?;
                    Ok(Recorded::Cancelled { order_id })
                }
                Some((order_id, true, false)) => {
                    tx.rollback().await?;
                    Ok(Recorded::Duplicate { order_id })
                }
                Some((live, false, _)) => supersede(tx, msg, live).await,
                None => {
                    // The conflicting row was cancelled in between; let the retry decide.
                    tx.rollback().await?;
                    Err(sqlx::Error::Protocol("conflicting order vanished".into()))
                }
            };
        }
        Err(e) if is_unknown_product(&e) => {
            return Ok(Recorded::Rejected {
                reason: "unknown_product",
            });
        }
        Err(e) => return Err(e),
    };
    let decremented = sqlx::query(
        "UPDATE products SET stock_remaining = stock_remaining - 1 \
         WHERE id = $1 AND stock_remaining > 0",
    )
    .bind(msg.product_id)
    .execute(&mut *tx)
    .await;
    match decremented {
        Ok(done) if done.rows_affected() == 1 => {}
        Ok(_) => {
            // Redis accepted more than the database holds: refuse rather than oversell.
            tx.rollback().await?;
            tracing::error!(product_id = msg.product_id, request_id = %msg.request_id,
                "no database stock left for an accepted purchase");
            return Ok(Recorded::Rejected {
                reason: "out_of_stock",
            });
        }
        Err(e) if is_db_code(&e, CHECK_VIOLATION) => {
            tx.rollback().await?;
            return Ok(Recorded::Rejected {
                reason: "out_of_stock",
            });
        }
        Err(e) => return Err(e),
    }
    tx.commit().await?;
    seckill_http::failpoint!("consume::after_insert", Err(postgres_lost()));
    Ok(Recorded::Created { order_id })
}

/// Writes a batch of messages as orders in one transaction, returning one outcome per message
/// in input order. Much faster than one transaction per message: one round trip inserts
/// every row (`unnest`), one decrements each product's stock by the rows actually inserted,
/// one finds the existing orders of the duplicates.
///
/// The batch is all-or-nothing. When it cannot commit as a whole for a reason tied to one
/// message (an unknown product, a product without enough database stock), it is replayed
/// message by message through [`record`], so one bad message never holds back the others
/// and each gets its own outcome. A transient error fails the whole batch.
pub async fn record_batch(
    db: &PgPool,
    msgs: &[OrderMessage],
    options: WriteOptions,
) -> Result<Vec<Recorded>, sqlx::Error> {
    match try_batch(db, msgs, options).await? {
        Some(outcomes) => Ok(outcomes),
        None => {
            metrics::counter!("orders_batch_fallbacks_total").increment(1);
            let mut outcomes = Vec::with_capacity(msgs.len());
            for msg in msgs {
                outcomes.push(record(db, msg, options).await?);
            }
            Ok(outcomes)
        }
    }
}

/// The batch fast path; `Ok(None)` when a message needs the one-by-one path.
async fn try_batch(
    db: &PgPool,
    msgs: &[OrderMessage],
    options: WriteOptions,
) -> Result<Option<Vec<Recorded>>, sqlx::Error> {
    let request_ids: Vec<uuid::Uuid> = msgs.iter().map(|m| m.request_id).collect();
    let user_ids: Vec<i64> = msgs.iter().map(|m| m.user_id).collect();
    let product_ids: Vec<i64> = msgs.iter().map(|m| m.product_id).collect();
    let accepted: Vec<DateTime<Utc>> = msgs.iter().map(|m| m.created_at).collect();
    let buckets: Vec<Option<i16>> = msgs.iter().map(bucket_column).collect();
    let mut tx = begin(db, options.lock_timeout).await?;
    // ON CONFLICT without a target skips a row that hits any unique index: a redelivered
    // purchase, a second live order of one user, or a duplicate inside this very batch.
    // Rows go in in (user, product, request) order: a row waiting on another transaction's
    // uncommitted copy of it holds that wait in the same order in every batch, so two
    // batches sharing redelivered purchases queue behind each other instead of deadlocking
    // (which would send both to a retry tier for nothing).
    // The price is the product's, never the message's (a LEFT JOIN: an unknown product's
    // row has no price and fails the batch, which the one-by-one path then rejects).
    let inserted: Result<Vec<(i64, uuid::Uuid, i64)>, sqlx::Error> = sqlx::query_as(
        "INSERT INTO orders \
           (request_id, user_id, product_id, price_cents, accepted_at, bucket, pay_by) \
         SELECT m.request_id, m.user_id, m.product_id, p.price_cents, m.accepted_at, m.bucket, \
                now() + make_interval(secs => $5::double precision) \
         FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::timestamptz[], \
                     $6::smallint[]) \
           AS m(request_id, user_id, product_id, accepted_at, bucket) \
         LEFT JOIN products p ON p.id = m.product_id \
         ORDER BY m.user_id, m.product_id, m.request_id \
         ON CONFLICT DO NOTHING RETURNING id, request_id, product_id",
    )
    .bind(&request_ids)
    .bind(&user_ids)
    .bind(&product_ids)
    .bind(&accepted)
    .bind(options.window_secs())
    .bind(&buckets)
    .fetch_all(&mut *tx)
    .await;
    let inserted = match inserted {
        Ok(rows) => rows,
        Err(e) if is_unknown_product(&e) => {
            tx.rollback().await?;
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // Decrement each product by the rows inserted for it, in product order (every batch
    // locks product rows in the same order: no deadlock between concurrent batches).
    let mut per_product: std::collections::BTreeMap<i64, i32> = Default::default();
    for (_, _, product_id) in &inserted {
        *per_product.entry(*product_id).or_default() += 1;
    }
    for (product_id, count) in &per_product {
        let done = sqlx::query(
            "UPDATE products SET stock_remaining = stock_remaining - $2 \
             WHERE id = $1 AND stock_remaining >= $2",
        )
        .bind(product_id)
        .bind(count)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() != 1 {
            // Not enough database stock for all of them: let the slow path decide which.
            tx.rollback().await?;
            return Ok(None);
        }
    }
    let created: std::collections::HashMap<uuid::Uuid, i64> = inserted
        .iter()
        .map(|(id, request_id, _)| (*request_id, *id))
        .collect();
    let skipped: Vec<&OrderMessage> = msgs
        .iter()
        .filter(|m| !created.contains_key(&m.request_id))
        .collect();
    // request id → (existing order, whether it is this very purchase, whether cancelled)
    let mut existing: std::collections::HashMap<uuid::Uuid, (i64, bool, bool)> = Default::default();
    if !skipped.is_empty() {
        let rows: Vec<(uuid::Uuid, i64, bool, bool)> = sqlx::query_as(
            "SELECT DISTINCT ON (m.request_id) m.request_id, o.id, \
                    o.request_id = m.request_id, o.status = 'cancelled' \
             FROM unnest($1::uuid[], $2::bigint[], $3::bigint[]) AS m(request_id, user_id, product_id) \
             JOIN orders o ON o.request_id = m.request_id \
               OR (o.user_id = m.user_id AND o.product_id = m.product_id AND o.status <> 'cancelled') \
             ORDER BY m.request_id, (o.request_id = m.request_id) DESC",
        )
        .bind(skipped.iter().map(|m| m.request_id).collect::<Vec<_>>())
        .bind(skipped.iter().map(|m| m.user_id).collect::<Vec<_>>())
        .bind(skipped.iter().map(|m| m.product_id).collect::<Vec<_>>())
        .fetch_all(&mut *tx)
        .await?;
        existing.extend(
            rows.into_iter()
                .map(|(request, id, same, gone)| (request, (id, same, gone))),
        );
    }
    let mut outcomes = Vec::with_capacity(msgs.len());
    let mut first_seen = std::collections::HashSet::new();
    for msg in msgs {
        let outcome = match created.get(&msg.request_id) {
            // The same purchase twice in one batch: the first copy created it.
            Some(&order_id) if first_seen.insert(msg.request_id) => Recorded::Created { order_id },
            Some(&order_id) => Recorded::Duplicate { order_id },
            None => match existing.get(&msg.request_id) {
                Some(&(order_id, true, true)) => Recorded::Cancelled { order_id },
                Some(&(order_id, true, false)) => Recorded::Duplicate { order_id },
                // Another purchase's live order (giving this one up is the one-by-one path's:
                // it locks its product row, which this batch must not take out of order), or
                // its conflicting order vanished (cancelled meanwhile): decide it alone.
                Some((_, false, _)) | None => {
                    tx.rollback().await?;
                    return Ok(None);
                }
            },
        };
        outcomes.push(outcome);
    }
    tx.commit().await?;
    seckill_http::failpoint!("consume::after_insert", Err(postgres_lost()));
    Ok(Some(outcomes))
}

/// What each of `request_ids` already became in the database, as a copy of it written now
/// would find it: its own live (or paid) order is [`Recorded::Duplicate`], its cancelled
/// one [`Recorded::Cancelled`]; a purchase without an order of its own is left out.
pub async fn written(
    db: &PgPool,
    request_ids: &[uuid::Uuid],
) -> Result<std::collections::HashMap<uuid::Uuid, Recorded>, sqlx::Error> {
    let rows: Vec<(uuid::Uuid, i64, bool)> = sqlx::query_as(
        "SELECT request_id, id, status = 'cancelled' FROM orders WHERE request_id = ANY($1)",
    )
    .bind(request_ids)
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(request_id, order_id, cancelled)| {
            let outcome = if cancelled {
                Recorded::Cancelled { order_id }
            } else {
                Recorded::Duplicate { order_id }
            };
            (request_id, outcome)
        })
        .collect())
}

/// Gives up `msg`, a second purchase of a buyer whose live order of the product is `live`,
/// in `tx` (where its own insert found that order): a cancelled order in its name, so that
/// every copy of it is a no-op from now on ([`Recorded::Cancelled`]); no database stock back,
/// as it never took any, but the ledger version moves on; and a compensation that returns
/// its unit to the Redis bucket it came from. The live order is left alone.
async fn supersede(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    msg: &OrderMessage,
    live: i64,
) -> Result<Recorded, sqlx::Error> {
    let reason = crate::compensation::REASON_ALREADY_PURCHASED;
    let tombstone: Option<i64> = sqlx::query_scalar(
        "INSERT INTO orders (request_id, user_id, product_id, price_cents, accepted_at, \
                             status, cancelled_at, cancel_reason, bucket) \
         SELECT $1, $2, p.id, p.price_cents, $4, 'cancelled', now(), $5, $6 \
         FROM products p WHERE p.id = $3 \
         ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(msg.request_id)
    .bind(msg.user_id)
    .bind(msg.product_id)
    .bind(msg.created_at)
    .bind(reason)
    .bind(bucket_column(msg))
    .fetch_optional(&mut *tx)
    .await?;
    if tombstone.is_none() {
        // A copy of this purchase, committed meanwhile, gave it up first.
        let order_id: Option<i64> =
            sqlx::query_scalar("SELECT id FROM orders WHERE request_id = $1")
                .bind(msg.request_id)
                .fetch_optional(&mut *tx)
                .await?;
        tx.rollback().await?;
        return match order_id {
            Some(order_id) => Ok(Recorded::Cancelled { order_id }),
            None => Err(sqlx::Error::Protocol("conflicting order vanished".into())),
        };
    }
    let units = std::collections::BTreeMap::from([(msg.product_id, 0)]);
    let versions = crate::compensation::give_up_units(&mut tx, &units).await?;
    sqlx::query(
        "INSERT INTO compensations \
           (event_id, user_id, product_id, reason, ledger_version, bucket) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(msg.request_id.to_string())
    .bind(msg.user_id)
    .bind(msg.product_id)
    .bind(reason)
    .bind(versions.get(&msg.product_id).copied())
    .bind(bucket_column(msg))
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Recorded::Superseded { order_id: live })
}

/// The message's origin bucket as the `orders.bucket` column stores it.
fn bucket_column(msg: &OrderMessage) -> Option<i16> {
    msg.bucket.and_then(|b| i16::try_from(b).ok())
}

/// Begins a transaction whose lock waits give up after `lock_timeout`.
async fn begin(
    db: &PgPool,
    lock_timeout: Duration,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, sqlx::Error> {
    let mut tx = db.begin().await?;
    sqlx::query("SELECT set_config('lock_timeout', $1, true)")
        .bind(format!("{}ms", lock_timeout.as_millis()))
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Whether an insert failed because its product does not exist.
fn is_unknown_product(e: &sqlx::Error) -> bool {
    is_db_code(e, FOREIGN_KEY_VIOLATION) || is_db_code(e, NOT_NULL_VIOLATION)
}

fn is_db_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(code))
}

/// The columns of [`Order`], for `concat!` (sqlx takes only static SQL).
macro_rules! order_columns {
    () => {
        "id, request_id, user_id, product_id, price_cents, status, accepted_at, created_at, \
         pay_by, paid_at, cancelled_at, cancel_reason"
    };
}

/// Why a payment or a cancellation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// No such order for this user.
    #[error("order not found")]
    NotFound,
    /// The order is not in a state that allows it (paid, cancelled, window passed).
    #[error("{message}")]
    Conflict {
        /// snake_case code.
        code: &'static str,
        /// For a human.
        message: &'static str,
    },
    /// Postgres failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Pays the user's order (a simulated payment: no provider is called). Paying a paid order
/// again answers it as it is; a cancelled one, or one past its window, is refused.
pub async fn pay(db: &PgPool, user_id: i64, order_id: i64) -> Result<Order, ChangeError> {
    let paid = sqlx::query_as::<_, Order>(concat!(
        "UPDATE orders SET status = 'paid', paid_at = now() \
         WHERE id = $1 AND user_id = $2 AND status = 'created' \
           AND (pay_by IS NULL OR pay_by > now()) RETURNING ",
        order_columns!()
    ))
    .bind(order_id)
    .bind(user_id)
    .fetch_optional(db)
    .await?;
    if let Some(order) = paid {
        metrics::counter!("orders_paid_total").increment(1);
        return Ok(order);
    }
    let order = get_for_user(db, user_id, order_id)
        .await?
        .ok_or(ChangeError::NotFound)?;
    match order.status.as_str() {
        "paid" => Ok(order),
        "cancelled" => Err(ChangeError::Conflict {
            code: "order_cancelled",
            message: "the order was cancelled",
        }),
        _ => Err(ChangeError::Conflict {
            code: "payment_window_expired",
            message: "the payment window has passed; the order is being cancelled",
        }),
    }
}

/// Cancels the user's unpaid order: its unit goes back on sale (see
/// [`crate::compensation`]). Cancelling a cancelled order again answers it as it is; a paid
/// one is refused.
pub async fn cancel(db: &PgPool, user_id: i64, order_id: i64) -> Result<Order, ChangeError> {
    let mut tx = db.begin().await?;
    let cancelled = crate::compensation::cancel_orders(
        &mut tx,
        &[order_id],
        Some(user_id),
        crate::compensation::REASON_CANCELLED,
    )
    .await?;
    seckill_http::failpoint!("cancel::before_commit", Err(postgres_lost()));
    tx.commit().await?;
    seckill_http::failpoint!("cancel::after_commit", Err(postgres_lost()));
    if !cancelled.is_empty() {
        metrics::counter!("orders_cancelled_total").increment(1);
    }
    let order = get_for_user(db, user_id, order_id)
        .await?
        .ok_or(ChangeError::NotFound)?;
    match order.status.as_str() {
        "cancelled" => Ok(order),
        _ => Err(ChangeError::Conflict {
            code: "order_paid",
            message: "a paid order cannot be cancelled",
        }),
    }
}

/// The user's orders, newest first.
pub async fn list_for_user(db: &PgPool, user_id: i64) -> Result<Vec<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE user_id = $1 ORDER BY id DESC LIMIT 100"
    ))
    .bind(user_id)
    .fetch_all(db)
    .await
}

/// One order, only if it belongs to `user_id`.
pub async fn get_for_user(
    db: &PgPool,
    user_id: i64,
    order_id: i64,
) -> Result<Option<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(concat!(
        "SELECT ",
        order_columns!(),
        " FROM orders WHERE id = $1 AND user_id = $2"
    ))
    .bind(order_id)
    .bind(user_id)
    .fetch_optional(db)
    .await
}
