//! Purchases in transit where no reading of the broker can see them (`order_transit`,
//! migration `0010_in_flight.sql`), for seckill-api's fence (`seckill_api::stock::fence`):
//! after Redis lost a product's ledger, a purchase noted here holds the product until an
//! order or a dead letter with its request id exists.
//!
//! Three writers note a purchase, each before the fence could miss its copy:
//! - seckill-api's handlers' publisher, once a handler's wait for a confirm has run out
//!   while the message was already on the wire (the broker may still take it much later:
//!   a connection blocked by an alarm is read again only once the alarm clears), within
//!   the fence's grace;
//! - seckill-api's relay, before it publishes a round;
//! - order-service, before it publishes a retry or dead-letter copy.
//!
//! A copy that never lands (lost with a connection, refused, or its queue dropped) would hold
//! its product for good: a note stops holding after [`HOLDS_FOR`] and the fence logs its
//! request id. Notes are deleted by order-service a minute after landing, or once a day old.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

/// How long a note holds its product at most: past it, its copy is presumed lost (a later
/// landing may then meet a unit sold again; Postgres still refuses to oversell).
pub const HOLDS_FOR: Duration = Duration::from_secs(300);

/// Notes purchases (request id, product) as in transit.
pub async fn note(db: &PgPool, purchases: &[(Uuid, i64)]) -> Result<(), sqlx::Error> {
    let mut purchases = purchases.to_vec();
    // One statement may not touch a row twice.
    purchases.sort_unstable();
    purchases.dedup_by_key(|(request_id, _)| *request_id);
    if purchases.is_empty() {
        return Ok(());
    }
    let (request_ids, products): (Vec<Uuid>, Vec<i64>) = purchases.into_iter().unzip();
    sqlx::query(
        "INSERT INTO order_transit (request_id, product_id) \
         SELECT * FROM unnest($1::uuid[], $2::bigint[]) \
         ON CONFLICT (request_id) DO UPDATE SET product_id = EXCLUDED.product_id, since = now()",
    )
    .bind(request_ids)
    .bind(products)
    .execute(db)
    .await?;
    Ok(())
}

/// The product's notes without an order or a dead letter (one refused with an error code of
/// `refused_codes`, a forgery's, does not count): those still holding, and those older than
/// [`HOLDS_FOR`] that no longer do.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unlanded {
    /// Noted within [`HOLDS_FOR`].
    pub holding: i64,
    /// Request ids of older ones (ten at most).
    pub expired: Vec<Uuid>,
}

/// What is noted of `product_id` and has not landed (the newest thousand notes are read:
/// enough to tell whether any holds).
pub async fn unlanded(
    db: &PgPool,
    product_id: i64,
    refused_codes: &[&str],
) -> Result<Unlanded, sqlx::Error> {
    let rows: Vec<(Uuid, bool)> = sqlx::query_as(
        "SELECT t.request_id, t.since > now() - make_interval(secs => $3) \
         FROM order_transit t WHERE t.product_id = $1 \
         AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.request_id = t.request_id) \
         AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.event_id = t.request_id::text \
                         AND d.error_code <> ALL($2)) \
         ORDER BY t.since DESC LIMIT 1000",
    )
    .bind(product_id)
    .bind(refused_codes)
    .bind(HOLDS_FOR.as_secs_f64())
    .fetch_all(db)
    .await?;
    let mut unlanded = Unlanded::default();
    for (request_id, holding) in rows {
        if holding {
            unlanded.holding += 1;
        } else if unlanded.expired.len() < 10 {
            unlanded.expired.push(request_id);
        }
    }
    Ok(unlanded)
}

/// Deletes the notes of landed purchases last noted a minute ago or more, and every note a
/// day old. Returns how many.
pub async fn clear_landed(db: &PgPool) -> Result<u64, sqlx::Error> {
    let cleared = sqlx::query(
        "DELETE FROM order_transit t WHERE t.since < now() - interval '1 day' \
         OR (t.since < now() - interval '1 minute' \
             AND (EXISTS (SELECT 1 FROM orders o WHERE o.request_id = t.request_id) \
                  OR EXISTS (SELECT 1 FROM dead_letters d \
                             WHERE d.event_id = t.request_id::text)))",
    )
    .execute(db)
    .await?;
    Ok(cleared.rows_affected())
}
