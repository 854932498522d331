//! Orders in Postgres: the idempotent write and the buyer's queries.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

use seckill_messaging::OrderMessage;

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
    /// The message can never become an order; retrying will not help.
    Rejected {
        /// snake_case reason, shown to the buyer.
        reason: &'static str,
    },
}

/// An order as its buyer sees it.
#[derive(Debug, Clone, Serialize, sqlx::FromRow)]
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
    pub status: String,
    /// When the purchase was accepted.
    pub accepted_at: DateTime<Utc>,
    /// When the order was written.
    pub created_at: DateTime<Utc>,
}

/// Postgres error codes that mean "this message is wrong", not "try again".
const FOREIGN_KEY_VIOLATION: &str = "23503";
const CHECK_VIOLATION: &str = "23514";

/// Writes `msg` as an order, idempotently, in one transaction.
pub async fn record(db: &PgPool, msg: &OrderMessage) -> Result<Recorded, sqlx::Error> {
    let mut tx = db.begin().await?;
    let inserted: Result<Option<i64>, sqlx::Error> = sqlx::query_scalar(
        "INSERT INTO orders (request_id, user_id, product_id, price_cents, accepted_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING RETURNING id",
    )
    .bind(msg.request_id)
    .bind(msg.user_id)
    .bind(msg.product_id)
    .bind(msg.price_cents)
    .bind(msg.created_at)
    .fetch_optional(&mut *tx)
    .await;
    let order_id = match inserted {
        Ok(Some(id)) => id,
        Ok(None) => {
            // A unique key matched: this purchase, or another live order of this user for
            // this product, is already recorded. "Already done", not an error.
            let existing: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM orders WHERE request_id = $1 \
                 OR (user_id = $2 AND product_id = $3 AND status <> 'cancelled') \
                 ORDER BY (request_id = $1) DESC LIMIT 1",
            )
            .bind(msg.request_id)
            .bind(msg.user_id)
            .bind(msg.product_id)
            .fetch_optional(&mut *tx)
            .await?;
            tx.rollback().await?;
            return match existing {
                Some(order_id) => Ok(Recorded::Duplicate { order_id }),
                // The conflicting row was cancelled in between; let the retry decide.
                None => Err(sqlx::Error::Protocol("conflicting order vanished".into())),
            };
        }
        Err(e) if is_db_code(&e, FOREIGN_KEY_VIOLATION) => {
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
    Ok(Recorded::Created { order_id })
}

fn is_db_code(e: &sqlx::Error, code: &str) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some(code))
}

/// The user's orders, newest first.
pub async fn list_for_user(db: &PgPool, user_id: i64) -> Result<Vec<Order>, sqlx::Error> {
    sqlx::query_as::<_, Order>(
        "SELECT id, request_id, user_id, product_id, price_cents, status, accepted_at, created_at \
         FROM orders WHERE user_id = $1 ORDER BY id DESC LIMIT 100",
    )
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
    sqlx::query_as::<_, Order>(
        "SELECT id, request_id, user_id, product_id, price_cents, status, accepted_at, created_at \
         FROM orders WHERE id = $1 AND user_id = $2",
    )
    .bind(order_id)
    .bind(user_id)
    .fetch_optional(db)
    .await
}
