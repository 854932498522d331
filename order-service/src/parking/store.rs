//! The parking lot in Postgres: recording dead letters, listing them, the audit trail,
//! and clearing quarantines.

use sqlx::PgPool;

use seckill_messaging::SignatureError;

use super::entry::{Arrival, AuditEntry, Entry, Status};
use super::selection::{MAX_SELECTION, ParkingError, Report, Selection};

/// Dead-letter reasons of a message refused for its signature.
const SIGNATURE_REFUSALS: [&str; 2] = SignatureError::CODES;

/// Records a dead letter (idempotent per event id) and returns the entry's status. An entry
/// that was redriven and failed again is pending again, or quarantined once it has had
/// `quarantine_after` redrives; an ignored or pending one stays as it is.
///
/// What an entry says is the genuine purchase's (one not refused for its signature, signed
/// or accepted unsigned during an upgrade): anyone who can publish can park a forgery under
/// any request id, before or after the purchase's own dead letter, and claiming any reason —
/// which is why the recorder checks the signature itself and gives a dead letter that fails
/// a refusal's reason, whatever its headers say ([`Arrival::from_message`]). A genuine copy takes over
/// an entry a forgery holds entirely — buyer, product, body, signature, trace, reason, and a
/// fresh status, since an ignore or a redrive of the forgery never concerned the purchase.
/// A forgery never changes an entry that is not one (see [`refused_copy`]).
pub async fn record(
    db: &PgPool,
    arrival: &Arrival,
    quarantine_after: i32,
) -> Result<String, sqlx::Error> {
    let forged = SIGNATURE_REFUSALS.contains(&arrival.error_code.as_str());
    // The update's expressions read the entry as it was: `NOT $11 AND dead_letters.error_code
    // = ANY($12)` is a genuine copy taking over a forgery's entry. Its WHERE leaves a genuine
    // entry alone when a forgery arrives.
    let written: Option<String> = sqlx::query_scalar(
        "INSERT INTO dead_letters \
             (event_id, user_id, product_id, body, error_code, last_error, attempts, signature, \
              traceparent) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $9, $10) \
         ON CONFLICT (event_id) DO UPDATE SET \
             user_id = EXCLUDED.user_id, product_id = EXCLUDED.product_id, \
             error_code = EXCLUDED.error_code, last_error = EXCLUDED.last_error, \
             attempts = EXCLUDED.attempts, body = EXCLUDED.body, last_attempt = now(), \
             signature = EXCLUDED.signature, traceparent = EXCLUDED.traceparent, \
             status = CASE WHEN NOT $11 AND dead_letters.error_code = ANY($12) THEN 'pending' \
                           WHEN dead_letters.status <> 'redriven' THEN dead_letters.status \
                           WHEN dead_letters.redrives >= $8 THEN 'quarantined' \
                           ELSE 'pending' END, \
             redrives = CASE WHEN NOT $11 AND dead_letters.error_code = ANY($12) THEN 0 \
                             ELSE dead_letters.redrives END, \
             first_seen = CASE WHEN NOT $11 AND dead_letters.error_code = ANY($12) THEN now() \
                               ELSE dead_letters.first_seen END, \
             operator = CASE WHEN NOT $11 AND dead_letters.error_code = ANY($12) THEN NULL \
                             ELSE dead_letters.operator END \
         WHERE NOT $11 OR dead_letters.error_code = ANY($12) \
         RETURNING status",
    )
    .bind(&arrival.event_id)
    .bind(arrival.user_id)
    .bind(arrival.product_id)
    .bind(&arrival.body)
    .bind(&arrival.error_code)
    .bind(&arrival.last_error)
    .bind(arrival.attempts)
    .bind(quarantine_after)
    .bind(&arrival.signature)
    .bind(&arrival.traceparent)
    .bind(forged)
    .bind(SIGNATURE_REFUSALS.to_vec())
    .fetch_optional(db)
    .await?;
    match written {
        Some(status) => Ok(status),
        None => refused_copy(db, arrival, quarantine_after).await,
    }
}

/// A copy refused for its signature, arriving at a genuine entry: only its attempt is noted.
/// Unless it is the purchase's own body (its redrive refused, say an unsigned purchase from
/// before signing redriven once unsigned ones were no longer accepted): then it counts as the
/// entry failing again, with the reason the entry already has, so it stays the purchase's
/// and can be redriven again (or ignored) instead of waiting as `redriven` for good.
async fn refused_copy(
    db: &PgPool,
    arrival: &Arrival,
    quarantine_after: i32,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(
        "UPDATE dead_letters SET last_attempt = now(), \
             last_error = CASE WHEN body = $2 THEN $3 ELSE last_error END, \
             status = CASE WHEN body <> $2 OR status <> 'redriven' THEN status \
                           WHEN redrives >= $4 THEN 'quarantined' \
                           ELSE 'pending' END \
         WHERE event_id = $1 RETURNING status",
    )
    .bind(&arrival.event_id)
    .bind(&arrival.body)
    .bind(&arrival.last_error)
    .bind(quarantine_after)
    .fetch_one(db)
    .await
}

/// Entries matching `selection` (any status unless `status` is given), oldest first.
pub async fn list(
    db: &PgPool,
    selection: &Selection,
    status: Option<Status>,
) -> Result<Vec<Entry>, sqlx::Error> {
    sqlx::query_as::<_, Entry>(
        "SELECT event_id, user_id, product_id, error_code, last_error, attempts, redrives, \
                status, first_seen, last_attempt, operator, encode(body, 'escape') AS body \
         FROM dead_letters \
         WHERE ($1::text[] IS NULL OR event_id = ANY($1)) \
           AND ($2::bigint IS NULL OR product_id = $2) \
           AND ($3::timestamptz IS NULL OR first_seen >= $3) \
           AND ($4::timestamptz IS NULL OR first_seen < $4) \
           AND ($5::text IS NULL OR status = $5) \
         ORDER BY first_seen, event_id LIMIT $6",
    )
    .bind(selection.ids())
    .bind(selection.product_id)
    .bind(selection.from)
    .bind(selection.to)
    .bind(status.map(Status::as_str))
    .bind(selection.limit())
    .fetch_all(db)
    .await
}

/// The newest audit rows first.
pub async fn audit_log(db: &PgPool, limit: i64) -> Result<Vec<AuditEntry>, sqlx::Error> {
    sqlx::query_as::<_, AuditEntry>(
        "SELECT id, at, operator, action, dry_run, selection, event_ids \
         FROM dead_letter_audit ORDER BY id DESC LIMIT $1",
    )
    .bind(limit.clamp(1, MAX_SELECTION))
    .fetch_all(db)
    .await
}

/// Writes an audit row of `action` on `event_ids`, in the caller's transaction.
pub(super) async fn audit(
    conn: &mut sqlx::PgConnection,
    operator: &str,
    action: &str,
    selection: &Selection,
    event_ids: &[String],
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO dead_letter_audit (operator, action, dry_run, selection, event_ids) \
         VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(operator)
    .bind(action)
    .bind(selection.dry_run)
    .bind(serde_json::to_value(selection).unwrap_or_default())
    .bind(event_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// Ids of the entries in `statuses` matching `selection`, oldest first.
pub(super) async fn select_ids(
    db: &PgPool,
    selection: &Selection,
    statuses: &[&str],
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT event_id FROM dead_letters \
         WHERE status = ANY($1) \
           AND ($2::text[] IS NULL OR event_id = ANY($2)) \
           AND ($3::bigint IS NULL OR product_id = $3) \
           AND ($4::timestamptz IS NULL OR first_seen >= $4) \
           AND ($5::timestamptz IS NULL OR first_seen < $5) \
         ORDER BY first_seen, event_id LIMIT $6",
    )
    .bind(statuses)
    .bind(selection.ids())
    .bind(selection.product_id)
    .bind(selection.from)
    .bind(selection.to)
    .bind(selection.limit())
    .fetch_all(db)
    .await
}

/// Releases quarantined entries of `selection`: pending again, redrive count reset.
pub async fn clear(
    db: &PgPool,
    selection: &Selection,
    operator: &str,
) -> Result<Report, ParkingError> {
    selection.check()?;
    let ids = select_ids(db, selection, &["quarantined"]).await?;
    let mut tx = db.begin().await?;
    let cleared = if selection.dry_run {
        ids
    } else {
        sqlx::query_scalar(
            "UPDATE dead_letters SET status = 'pending', redrives = 0, operator = $2 \
             WHERE event_id = ANY($1) AND status = 'quarantined' RETURNING event_id",
        )
        .bind(&ids)
        .bind(operator)
        .fetch_all(&mut *tx)
        .await?
    };
    audit(&mut tx, operator, "clear", selection, &cleared).await?;
    tx.commit().await?;
    Ok(Report {
        action: "clear".into(),
        dry_run: selection.dry_run,
        event_ids: cleared,
        compensated: 0,
    })
}
