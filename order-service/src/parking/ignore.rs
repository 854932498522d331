//! Giving dead letters up for good: a cancelled order in each purchase's name, and its
//! unit back on sale through the compensation outbox. A message refused for its signature
//! was never a purchase: ignoring it only marks it ignored.

use sqlx::PgPool;

use seckill_messaging::{OrderMessage, SignatureError};

use super::selection::{ParkingError, Report, Selection};
use super::store::{audit, select_ids};
#[cfg(feature = "failpoints")]
use crate::failpoints::postgres_lost;

/// Gives up the pending or quarantined entries of `selection` for good. Each one whose
/// purchase never became an order and whose unit was taken in Redis (the body parsed, the
/// product exists) gets, in the same transaction, a cancelled order in its name (see
/// [`tombstones`]) and a compensation: its buyer's result becomes `failed:<error code>` and
/// its unit goes back on sale — unless the database refused it for want of stock
/// (`out_of_stock`), when Redis had offered a unit the database never had, and returning it
/// would offer it again: then the buyer is released but no unit is returned. An entry parked
/// for its signature (`unsigned`, `bad_signature`) gets neither: anyone able to publish
/// could write one, for any buyer and under any request id, and it never took a unit.
pub async fn ignore(
    db: &PgPool,
    selection: &Selection,
    operator: &str,
) -> Result<Report, ParkingError> {
    selection.check()?;
    let ids = select_ids(db, selection, &["pending", "quarantined"]).await?;
    let mut tx = db.begin().await?;
    let (ignored, compensated) = if selection.dry_run {
        (ids, 0)
    } else {
        let ignored: Vec<String> = sqlx::query_scalar(
            "UPDATE dead_letters SET status = 'ignored', operator = $2 \
             WHERE event_id = ANY($1) AND status IN ('pending', 'quarantined') \
             RETURNING event_id",
        )
        .bind(&ids)
        .bind(operator)
        .fetch_all(&mut *tx)
        .await?;
        let given_up = tombstones(&mut tx, &ignored).await?;
        // No database stock comes back (these purchases never took any), but the ledger
        // version moves on, so a load of the stock tells these give-ups apart.
        let products = given_up
            .iter()
            .map(|(_, product, _)| (*product, 0))
            .collect();
        let versions = crate::compensation::give_up_units(&mut tx, &products).await?;
        let compensated = sqlx::query(
            "INSERT INTO compensations \
               (event_id, user_id, product_id, reason, restock, ledger_version, bucket) \
             SELECT d.event_id, d.user_id, d.product_id, d.error_code, d.error_code <> $2, \
                    g.version, g.bucket \
             FROM unnest($1::text[], $3::bigint[], $4::smallint[]) AS g(event_id, version, bucket) \
             JOIN dead_letters d ON d.event_id = g.event_id \
             ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(given_up.iter().map(|g| g.0.clone()).collect::<Vec<_>>())
        .bind(OUT_OF_STOCK)
        .bind(
            given_up
                .iter()
                .map(|g| versions.get(&g.1).copied())
                .collect::<Vec<_>>(),
        )
        .bind(given_up.iter().map(|g| g.2).collect::<Vec<_>>())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        (ignored, compensated as usize)
    };
    audit(&mut tx, operator, "ignore", selection, &ignored).await?;
    seckill_http::failpoint!("ignore::before_commit", Err(postgres_lost()));
    tx.commit().await?;
    seckill_http::failpoint!("ignore::after_commit", Err(postgres_lost()));
    if !selection.dry_run {
        metrics::counter!("orders_dead_letters_ignored_total").increment(ignored.len() as u64);
        tracing::warn!(
            operator,
            count = ignored.len(),
            compensated,
            "dead letters ignored"
        );
    }
    Ok(Report {
        action: "ignore".into(),
        dry_run: selection.dry_run,
        event_ids: ignored,
        compensated,
    })
}

/// The error code of a purchase the database refused for want of stock.
const OUT_OF_STOCK: &str = "out_of_stock";

/// Writes a cancelled order (reason: the entry's error code) for each purchase among
/// `event_ids` whose body parses, whose product exists, that was not refused for its
/// signature and that has no order yet; returns the event id, product and origin bucket of
/// each it wrote one for — exactly the purchases being given up.
///
/// The cancelled order is what makes giving up final: a copy of the purchase still on its
/// way (in a retry tier, redriven a moment ago, or being written by a consumer right now)
/// meets its request id already taken and becomes a no-op, instead of an order for a unit
/// that is also going back on sale. The unique request id decides who came first, so a
/// consumer that commits the order first wins, and then nothing is given up. A forgery gets
/// none: under a genuine purchase's request id it would turn that purchase into a no-op.
async fn tombstones(
    tx: &mut sqlx::PgConnection,
    event_ids: &[String],
) -> Result<Vec<(String, i64, Option<i16>)>, sqlx::Error> {
    let rows: Vec<(String, Vec<u8>, String)> = sqlx::query_as(
        "SELECT event_id, body, error_code FROM dead_letters \
         WHERE event_id = ANY($1) AND user_id IS NOT NULL AND error_code <> ALL($2)",
    )
    .bind(event_ids)
    .bind(SignatureError::CODES.to_vec())
    .fetch_all(&mut *tx)
    .await?;
    let mut purchases: Vec<(OrderMessage, String)> = rows
        .into_iter()
        .filter_map(|(event_id, body, code)| {
            let msg: OrderMessage = serde_json::from_slice(&body).ok()?;
            (msg.request_id.to_string() == event_id).then_some((msg, code))
        })
        .collect();
    // The order in which the consumer inserts (orders::record_batch): no deadlock with it.
    purchases.sort_by_key(|(m, _)| (m.user_id, m.product_id, m.request_id));
    let column =
        |f: fn(&(OrderMessage, String)) -> i64| purchases.iter().map(f).collect::<Vec<_>>();
    sqlx::query_as(
        "INSERT INTO orders (request_id, user_id, product_id, price_cents, accepted_at, \
                             status, cancelled_at, cancel_reason, bucket) \
         SELECT m.request_id, m.user_id, m.product_id, p.price_cents, m.accepted_at, \
                'cancelled', now(), m.reason, m.bucket \
         FROM unnest($1::uuid[], $2::bigint[], $3::bigint[], $4::timestamptz[], \
                     $5::text[], $6::smallint[]) \
           AS m(request_id, user_id, product_id, accepted_at, reason, bucket) \
         JOIN products p ON p.id = m.product_id \
         ORDER BY m.user_id, m.product_id, m.request_id \
         ON CONFLICT DO NOTHING RETURNING request_id::text, product_id, bucket",
    )
    .bind(
        purchases
            .iter()
            .map(|(m, _)| m.request_id)
            .collect::<Vec<_>>(),
    )
    .bind(column(|(m, _)| m.user_id))
    .bind(column(|(m, _)| m.product_id))
    .bind(
        purchases
            .iter()
            .map(|(m, _)| m.created_at)
            .collect::<Vec<_>>(),
    )
    .bind(
        purchases
            .iter()
            .map(|(_, code)| code.clone())
            .collect::<Vec<_>>(),
    )
    .bind(
        purchases
            .iter()
            .map(|(m, _)| m.bucket.and_then(|b| i16::try_from(b).ok()))
            .collect::<Vec<_>>(),
    )
    .fetch_all(&mut *tx)
    .await
}
