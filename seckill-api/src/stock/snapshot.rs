//! What a load of the stock reads from Postgres (see `seckill_store::ledger`).

use sqlx::PgPool;
use uuid::Uuid;

use seckill_messaging::{OrderMessage, SignatureError};
use seckill_store::{PurchaseResult, home_bucket};

use crate::catalog::Product;
use crate::error::ApiError;

/// What a load reads from Postgres, in one statement (one snapshot): the product's ledger
/// version and every purchase that holds a unit for its buyer — a live order, or a dead
/// letter not given up (it may still become an order). A dead letter refused for its
/// signature holds nothing: it never took a unit, and anyone who can publish could park one
/// in any buyer's name. See `seckill_store::ledger`.
pub(super) struct Snapshot {
    stock_total: i64,
    buckets: u16,
    /// The product's ledger version the snapshot saw.
    pub(super) version: i64,
    /// Purchases holding a unit.
    pub(super) held: Vec<Held>,
}

/// One purchase holding a unit.
pub(super) struct Held {
    /// The buyer.
    pub(super) user_id: i64,
    /// The purchase.
    pub(super) request_id: Uuid,
    /// Its order, if it is one.
    order_id: Option<i64>,
    /// The bucket the unit came from.
    origin: u16,
}

impl Held {
    /// The result its buyer sees.
    pub(super) fn result(&self) -> String {
        match self.order_id {
            Some(order_id) => PurchaseResult::Success { order_id }.encode(),
            None => PurchaseResult::Queued {
                request_id: self.request_id.to_string(),
            }
            .encode(),
        }
    }
}

/// `products` row, then one row per held purchase (none: NULL columns).
type SnapshotRow = (
    i64,
    Option<i64>,
    Option<Uuid>,
    Option<i64>,
    Option<i16>,
    Option<Vec<u8>>,
);

impl Snapshot {
    /// Reads the snapshot of `product`.
    pub(super) async fn read(db: &PgPool, product: &Product) -> Result<Self, ApiError> {
        let rows: Vec<SnapshotRow> = sqlx::query_as(
            "SELECT p.ledger_version, h.user_id, h.request_id, h.order_id, h.bucket, h.body \
             FROM products p LEFT JOIN LATERAL ( \
               SELECT o.user_id, o.request_id, o.id AS order_id, o.bucket, NULL::bytea AS body \
               FROM orders o WHERE o.product_id = p.id AND o.status <> 'cancelled' \
               UNION ALL \
               SELECT d.user_id, d.event_id::uuid, NULL, NULL, d.body \
               FROM dead_letters d \
               WHERE d.product_id = p.id AND d.status <> 'ignored' AND d.user_id IS NOT NULL \
                 AND d.error_code <> ALL($2) \
                 AND d.event_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' \
                 AND NOT EXISTS (SELECT 1 FROM orders o \
                                 WHERE o.request_id = CASE WHEN d.event_id ~ \
                                   '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' \
                                                      THEN d.event_id::uuid END) \
             ) h ON true WHERE p.id = $1",
        )
        .bind(product.id)
        .bind(SignatureError::CODES.to_vec())
        .fetch_all(db)
        .await?;
        let version = rows
            .first()
            .map(|row| row.0)
            .ok_or(ApiError::ProductNotFound)?;
        let buckets = product.buckets();
        let held = rows
            .into_iter()
            .filter_map(|(_, user_id, request_id, order_id, bucket, body)| {
                let (user_id, request_id) = (user_id?, request_id?);
                // A dead letter's body says where its unit came from (older ones do not).
                let bucket = bucket.or_else(|| {
                    let msg: OrderMessage = serde_json::from_slice(&body?).ok()?;
                    msg.bucket.and_then(|b| i16::try_from(b).ok())
                });
                let origin = bucket
                    .and_then(|b| u16::try_from(b).ok())
                    .filter(|&b| b < buckets)
                    .unwrap_or_else(|| home_bucket(user_id, buckets));
                Some(Held {
                    user_id,
                    request_id,
                    order_id,
                    origin,
                })
            })
            .collect();
        Ok(Self {
            stock_total: i64::from(product.stock_total),
            buckets,
            version,
            held,
        })
    }

    /// The units `bucket` holds as of the snapshot: its share, less what was taken from it.
    pub(super) fn units(&self, bucket: u16) -> i64 {
        let taken = self.held.iter().filter(|h| h.origin == bucket).count() as i64;
        (share(self.stock_total, self.buckets, bucket) - taken).max(0)
    }

    /// The held purchases of buyers whose home is `bucket`.
    pub(super) fn homed_in(&self, bucket: u16) -> impl Iterator<Item = &Held> {
        self.held
            .iter()
            .filter(move |h| home_bucket(h.user_id, self.buckets) == bucket)
    }
}

/// Bucket `bucket`'s share of `remaining` units over `buckets` buckets: as even as possible.
pub fn share(remaining: i64, buckets: u16, bucket: u16) -> i64 {
    let n = i64::from(buckets.max(1));
    remaining / n + i64::from(i64::from(bucket) < remaining % n)
}
