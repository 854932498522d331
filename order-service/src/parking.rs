//! The parking lot: dead letters kept in Postgres for an operator, and what they can do with
//! them (list, redrive, ignore, clear a quarantine), each action audited.
//!
//! Life of an entry (`dead_letters.status`):
//! ```text
//! dead letter ──record──► pending ──redrive──► redriven ──dead letter again──► pending
//!                            │                                 (after N redrives: quarantined)
//!                            └──ignore──► ignored (its unit goes back on sale: compensation)
//! quarantined ──clear──► pending        quarantined ──ignore──► ignored
//! ```
//! A redrive flips the entry to `redriven` and publishes its body back to the orders exchange
//! (with a confirm) inside one transaction that commits only after the confirm: a failed
//! publish leaves it `pending`, and a second redrive of the same entry finds it `redriven`
//! and does nothing. A crash between confirm and commit republishes on the next redrive,
//! which the idempotent order write absorbs.

use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use sqlx::PgPool;

use seckill_messaging::{HEADER_ATTEMPT, OrderMessage, Topology};

/// AMQP header of a redriven message: how many times the operator redrove it.
pub const HEADER_REDRIVE: &str = "x-redrive";

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for an operator.
    Pending,
    /// Sent back to the orders queue.
    Redriven,
    /// Given up for good; its unit went back on sale.
    Ignored,
    /// Failed again after too many redrives: no redrive until an operator clears it.
    Quarantined,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Redriven => "redriven",
            Self::Ignored => "ignored",
            Self::Quarantined => "quarantined",
        }
    }
}

/// A dead letter as the operator sees it.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct Entry {
    /// The purchase's request id (or `sha256:<hex>` of a body that did not parse).
    pub event_id: String,
    /// The buyer, when the body parsed.
    pub user_id: Option<i64>,
    /// The product, when the body parsed.
    pub product_id: Option<i64>,
    /// Why it was given up (`unparseable`, `unknown_product`, `out_of_stock`,
    /// `retries_exhausted`, `rejected`, …).
    pub error_code: String,
    /// The last error, for a human.
    pub last_error: String,
    /// Deliveries it had when given up.
    pub attempts: i32,
    /// Redrives so far.
    pub redrives: i32,
    /// pending, redriven, ignored or quarantined.
    pub status: String,
    /// When it was first dead-lettered.
    pub first_seen: DateTime<Utc>,
    /// When it was last dead-lettered.
    pub last_attempt: DateTime<Utc>,
    /// Who last acted on it.
    pub operator: Option<String>,
    /// The message body (non-UTF-8 bytes escaped).
    pub body: String,
}

/// Which entries an action applies to. An action needs at least one of ids, product or a
/// time bound, so "everything" is never selected by accident.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Selection {
    /// These entries.
    #[serde(default)]
    pub ids: Vec<String>,
    /// Entries of this product.
    pub product_id: Option<i64>,
    /// First dead-lettered at or after this instant.
    pub from: Option<DateTime<Utc>>,
    /// First dead-lettered before this instant.
    pub to: Option<DateTime<Utc>>,
    /// Most entries to act on (default and cap: [`MAX_SELECTION`]).
    pub limit: Option<i64>,
    /// Only report what would be done.
    #[serde(default)]
    pub dry_run: bool,
}

/// Most entries one action or listing touches.
pub const MAX_SELECTION: i64 = 10_000;

impl Selection {
    /// Whether the selection names something.
    pub fn is_bounded(&self) -> bool {
        !self.ids.is_empty()
            || self.product_id.is_some()
            || self.from.is_some()
            || self.to.is_some()
    }

    /// Refuses a selection that names nothing or that no entry could match sensibly.
    pub fn check(&self) -> Result<(), ParkingError> {
        if !self.is_bounded() {
            return Err(ParkingError::Unbounded);
        }
        // Event ids are request ids (UUIDs) or hex digests: the rule for request ids.
        let usable = |id: &String| seckill_http::layers::is_usable_request_id(id.as_bytes());
        if !self.ids.iter().all(usable) {
            return Err(ParkingError::Invalid(
                "ids must be event ids (letters, digits, '-', at most 128 characters)",
            ));
        }
        if let (Some(from), Some(to)) = (self.from, self.to)
            && from >= to
        {
            return Err(ParkingError::Invalid("from must be before to"));
        }
        Ok(())
    }

    fn limit(&self) -> i64 {
        self.limit.unwrap_or(MAX_SELECTION).clamp(1, MAX_SELECTION)
    }

    fn ids(&self) -> Option<&[String]> {
        (!self.ids.is_empty()).then_some(self.ids.as_slice())
    }
}

/// What an action did (or, on a dry run, would do).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Report {
    /// `redrive`, `ignore` or `clear`.
    pub action: String,
    /// Nothing was changed.
    pub dry_run: bool,
    /// The entries acted on (or that would be).
    pub event_ids: Vec<String>,
    /// Of those, units put back on sale (ignore only).
    pub compensated: usize,
}

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ParkingError {
    /// The selection names nothing.
    #[error("name entries by ids, product_id or a from/to window")]
    Unbounded,
    /// The selection is malformed.
    #[error("{0}")]
    Invalid(&'static str),
    /// Postgres failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The broker refused or failed a redrive's publish; `done` were redriven before it.
    #[error("redrive stopped after {done} entries: {reason}")]
    Publish {
        /// Entries redriven before the failure.
        done: usize,
        /// What went wrong.
        reason: String,
    },
}

/// A dead letter as it leaves the dead-letter queue, ready to be recorded.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// See [`Entry::event_id`].
    pub event_id: String,
    /// The buyer, if the body parsed.
    pub user_id: Option<i64>,
    /// The product, if the body parsed.
    pub product_id: Option<i64>,
    /// The body as published.
    pub body: Vec<u8>,
    /// Why it was given up.
    pub error_code: String,
    /// The last error.
    pub last_error: String,
    /// Deliveries it had.
    pub attempts: i32,
}

impl Arrival {
    /// Reads what the dead-letter path attached: the event id from the body (or the AMQP
    /// message id, or a digest of the body), the reason from our headers, or from the
    /// broker's `x-death` when the message was rejected without them.
    pub fn from_message(body: &[u8], properties: &BasicProperties) -> Self {
        let headers = properties.headers().clone().unwrap_or_default();
        let text = |name: &str| -> Option<String> {
            headers.inner().get(name).and_then(|v| match v {
                AMQPValue::LongString(s) => Some(s.to_string()),
                AMQPValue::ShortString(s) => Some(s.to_string()),
                _ => None,
            })
        };
        let attempts = headers
            .inner()
            .get(HEADER_ATTEMPT)
            .and_then(|v| match v {
                AMQPValue::LongInt(n) => Some(*n),
                AMQPValue::LongLongInt(n) => i32::try_from(*n).ok(),
                AMQPValue::ShortInt(n) => Some(i32::from(*n)),
                AMQPValue::LongUInt(n) => i32::try_from(*n).ok(),
                _ => None,
            })
            .unwrap_or(0)
            // The attempt header counts retries; the deliveries are one more.
            .saturating_add(1);
        let parsed = serde_json::from_slice::<OrderMessage>(body).ok();
        let event_id = match (&parsed, properties.message_id()) {
            (Some(msg), _) => msg.request_id.to_string(),
            (None, Some(id)) if !id.as_str().is_empty() => id.to_string(),
            (None, _) => format!("sha256:{:x}", sha2::Sha256::digest(body)),
        };
        Self {
            event_id,
            user_id: parsed.as_ref().map(|m| m.user_id),
            product_id: parsed.as_ref().map(|m| m.product_id),
            body: body.to_vec(),
            error_code: text(seckill_messaging::HEADER_ERROR_CODE)
                .unwrap_or_else(|| "rejected".to_string()),
            last_error: text(seckill_messaging::HEADER_ERROR_MESSAGE)
                .unwrap_or_else(|| "rejected without a reason (see x-death)".to_string()),
            attempts,
        }
    }
}

/// Records a dead letter (idempotent per event id) and returns the entry's status. An entry
/// that was redriven and failed again is pending again, or quarantined once it has had
/// `quarantine_after` redrives; an ignored or pending one stays as it is.
pub async fn record(
    db: &PgPool,
    arrival: &Arrival,
    quarantine_after: i32,
) -> Result<String, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO dead_letters \
             (event_id, user_id, product_id, body, error_code, last_error, attempts) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) \
         ON CONFLICT (event_id) DO UPDATE SET \
             error_code = EXCLUDED.error_code, last_error = EXCLUDED.last_error, \
             attempts = EXCLUDED.attempts, body = EXCLUDED.body, last_attempt = now(), \
             status = CASE WHEN dead_letters.status <> 'redriven' THEN dead_letters.status \
                           WHEN dead_letters.redrives >= $8 THEN 'quarantined' \
                           ELSE 'pending' END \
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

/// An audit row.
#[derive(Debug, Clone, Serialize, Deserialize, sqlx::FromRow)]
pub struct AuditEntry {
    /// Its id.
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub operator: String,
    /// redrive, ignore or clear.
    pub action: String,
    /// Whether it only reported.
    pub dry_run: bool,
    /// The selection as given.
    pub selection: serde_json::Value,
    /// The entries it applied to.
    pub event_ids: Vec<String>,
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

async fn audit(
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
async fn select_ids(
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

/// A token bucket pacing redrives, so a large redrive cannot flood the queue and the
/// database it feeds: `rate` per second, up to `burst` at once.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: tokio::time::Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: f64, burst: f64) -> Self {
        let burst = burst.max(1.0);
        Self {
            rate: rate.max(0.001),
            burst,
            tokens: burst,
            last: tokio::time::Instant::now(),
        }
    }

    /// Waits for one token and takes it.
    pub async fn take(&mut self) {
        loop {
            let now = tokio::time::Instant::now();
            let elapsed = now.duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
            self.last = now;
            if self.tokens >= 1.0 {
                self.tokens -= 1.0;
                return;
            }
            let wait = (1.0 - self.tokens) / self.rate;
            tokio::time::sleep(Duration::from_secs_f64(wait)).await;
        }
    }
}

/// Where redrives are published, and how fast.
#[derive(Debug)]
pub struct Redriver {
    /// Broker URL (a connection is opened per redrive: operator actions are rare).
    pub amqp_url: String,
    /// Exchange and routing key of the orders queue.
    pub topology: Topology,
    /// Paces the publishes; shared by concurrent redrives of one process.
    pub pace: tokio::sync::Mutex<TokenBucket>,
}

impl Redriver {
    /// Sends the pending entries of `selection` back to the orders queue, paced; each entry
    /// at most once (see the module docs). A dry run changes nothing but the audit trail.
    pub async fn redrive(
        &self,
        db: &PgPool,
        selection: &Selection,
        operator: &str,
    ) -> Result<Report, ParkingError> {
        selection.check()?;
        let candidates = select_ids(db, selection, &["pending"]).await?;
        let mut done = Vec::new();
        let outcome = if selection.dry_run || candidates.is_empty() {
            done = candidates;
            Ok(())
        } else {
            self.publish_each(db, &candidates, operator, &mut done)
                .await
        };
        let mut conn = db.acquire().await?;
        audit(&mut conn, operator, "redrive", selection, &done).await?;
        outcome?;
        if !selection.dry_run {
            metrics::counter!("orders_redriven_total").increment(done.len() as u64);
            tracing::warn!(operator, count = done.len(), "dead letters redriven");
        }
        Ok(Report {
            action: "redrive".into(),
            dry_run: selection.dry_run,
            event_ids: done,
            compensated: 0,
        })
    }

    async fn publish_each(
        &self,
        db: &PgPool,
        candidates: &[String],
        operator: &str,
        done: &mut Vec<String>,
    ) -> Result<(), ParkingError> {
        let failed = |done: &Vec<String>, reason: String| ParkingError::Publish {
            done: done.len(),
            reason,
        };
        let connection =
            seckill_messaging::connect(&self.amqp_url, "order-service-redrive", Duration::ZERO)
                .await
                .map_err(|e| failed(done, format!("{e:#}")))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| failed(done, e.to_string()))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| failed(done, e.to_string()))?;
        let mut result = Ok(());
        for event_id in candidates {
            self.pace.lock().await.take().await;
            match self.publish_one(db, &channel, event_id, operator).await {
                Ok(true) => done.push(event_id.clone()),
                // Redriven, ignored or cleared by someone else meanwhile.
                Ok(false) => {}
                Err(reason) => {
                    result = Err(failed(done, reason));
                    break;
                }
            }
        }
        let _ = connection.close(200, "redrive done".into()).await;
        result
    }

    /// Flips one entry to `redriven` and publishes it, committing only after the broker
    /// confirmed; false if it was no longer pending.
    async fn publish_one(
        &self,
        db: &PgPool,
        channel: &Channel,
        event_id: &str,
        operator: &str,
    ) -> Result<bool, String> {
        let mut tx = db.begin().await.map_err(|e| e.to_string())?;
        let row: Option<(Vec<u8>, i32)> = sqlx::query_as(
            "UPDATE dead_letters SET status = 'redriven', redrives = redrives + 1, operator = $2 \
             WHERE event_id = $1 AND status = 'pending' RETURNING body, redrives",
        )
        .bind(event_id)
        .bind(operator)
        .fetch_optional(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let Some((body, redrives)) = row else {
            return Ok(false);
        };
        let mut headers = FieldTable::default();
        headers.insert(ShortString::from(HEADER_ATTEMPT), AMQPValue::LongInt(0));
        headers.insert(
            ShortString::from(HEADER_REDRIVE),
            AMQPValue::LongInt(redrives),
        );
        let properties = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_message_id(event_id.into())
            .with_headers(headers);
        let confirm = channel
            .basic_publish(
                self.topology.exchange.as_str().into(),
                self.topology.routing_key.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &body,
                properties,
            )
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        if let Err(refused) = seckill_messaging::taken(&confirm) {
            return Err(format!("the broker did not take the message: {refused}"));
        }
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(true)
    }
}

/// Gives up the pending or quarantined entries of `selection` for good. Each one whose
/// purchase never became an order and whose unit was taken in Redis (the body parsed, the
/// product exists) gets, in the same transaction, a cancelled order in its name (see
/// [`tombstones`]) and a compensation: its buyer's result becomes `failed:<error code>` and
/// its unit goes back on sale — unless the database refused it for want of stock
/// (`out_of_stock`), when Redis had offered a unit the database never had, and returning it
/// would offer it again: then the buyer is released but no unit is returned.
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
    tx.commit().await?;
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
/// `event_ids` whose body parses, whose product exists and that has no order yet; returns
/// the event id, product and origin bucket of each it wrote one for — exactly the purchases
/// being given up.
///
/// The cancelled order is what makes giving up final: a copy of the purchase still on its
/// way (in a retry tier, redriven a moment ago, or being written by a consumer right now)
/// meets its request id already taken and becomes a no-op, instead of an order for a unit
/// that is also going back on sale. The unique request id decides who came first, so a
/// consumer that commits the order first wins, and then nothing is given up.
async fn tombstones(
    tx: &mut sqlx::PgConnection,
    event_ids: &[String],
) -> Result<Vec<(String, i64, Option<i16>)>, sqlx::Error> {
    let rows: Vec<(String, Vec<u8>, String)> = sqlx::query_as(
        "SELECT event_id, body, error_code FROM dead_letters \
         WHERE event_id = ANY($1) AND user_id IS NOT NULL",
    )
    .bind(event_ids)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_token_bucket_allows_its_burst_then_its_rate() {
        let mut bucket = TokenBucket::new(10.0, 5.0);
        let start = tokio::time::Instant::now();
        for _ in 0..5 {
            bucket.take().await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst is free");
        for _ in 0..10 {
            bucket.take().await;
        }
        let waited = start.elapsed().as_secs_f64();
        assert!(
            (0.99..1.1).contains(&waited),
            "10 more at 10/s took {waited}s"
        );
    }

    #[test]
    fn a_selection_must_name_something() {
        assert!(!Selection::default().is_bounded());
        let by_product = Selection {
            product_id: Some(3),
            ..Selection::default()
        };
        assert!(by_product.is_bounded());
        assert_eq!(Selection::default().limit(), MAX_SELECTION);
        let huge = Selection {
            limit: Some(i64::MAX),
            ..Selection::default()
        };
        assert_eq!(huge.limit(), MAX_SELECTION);
    }

    #[test]
    fn a_selection_with_a_malformed_id_or_an_empty_window_is_refused() {
        let ids = |ids: &[&str]| Selection {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            ..Selection::default()
        };
        assert!(
            ids(&["0193c2a4-7d1e-7f00-9c1a-1b2c3d4e5f60", "ab12"])
                .check()
                .is_ok()
        );
        for bad in ["a\0b", "", "has space", &"x".repeat(129)] {
            assert!(
                matches!(ids(&[bad]).check(), Err(ParkingError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            Selection::default().check(),
            Err(ParkingError::Unbounded)
        ));
        let now = Utc::now();
        let window = |from, to| Selection {
            from: Some(from),
            to: Some(to),
            ..Selection::default()
        };
        assert!(
            window(now - chrono::Duration::hours(1), now)
                .check()
                .is_ok()
        );
        assert!(matches!(
            window(now, now).check(),
            Err(ParkingError::Invalid(_))
        ));
    }

    #[test]
    fn an_arrival_takes_its_id_from_the_body_or_a_digest() {
        let msg = OrderMessage {
            request_id: uuid::Uuid::now_v7(),
            user_id: 7,
            product_id: 9,
            price_cents: 100,
            created_at: Utc::now(),
            bucket: None,
        };
        let body = serde_json::to_vec(&msg).unwrap();
        let arrival = Arrival::from_message(&body, &BasicProperties::default());
        assert_eq!(arrival.event_id, msg.request_id.to_string());
        assert_eq!((arrival.user_id, arrival.product_id), (Some(7), Some(9)));
        assert_eq!(arrival.error_code, "rejected");
        assert_eq!(arrival.attempts, 1);

        let garbage = Arrival::from_message(b"not json", &BasicProperties::default());
        let again = Arrival::from_message(b"not json", &BasicProperties::default());
        assert!(garbage.event_id.starts_with("sha256:"));
        assert_eq!(
            garbage.event_id, again.event_id,
            "the same body, the same entry"
        );
        assert_eq!(garbage.user_id, None);
    }
}
