//! Sale windows and key lifetimes: bucket keys expire an hour after the sale ends plus a
//! random spread (no expiry storm), the product's state hash no earlier than its buckets;
//! the outbox never expires.

use std::time::Duration;

use chrono::{DateTime, Utc};

use seckill_store::ledger::Window;

use super::engine::StockEngine;
use crate::catalog::Product;
use crate::error::ApiError;

/// Bucket keys expire this long after the sale ends, plus up to [`EXPIRY_SPREAD`].
pub(super) const EXPIRY_GRACE: Duration = Duration::from_secs(3600);
const EXPIRY_SPREAD: Duration = Duration::from_secs(600);

impl StockEngine {
    /// Applies a changed sale window to the buckets already loaded (the others load with
    /// the new one).
    pub async fn update_window(&self, product: &Product) -> Result<(), ApiError> {
        let id = product.id;
        let keys = self.ledger.keys();
        for bucket in 0..product.buckets() {
            let mut conn = self.redis.get().await?;
            // Before the window opens further: the relay must not retire a stream that
            // purchases can write to again (see `relay::registry`).
            crate::relay::register(
                &mut conn,
                keys,
                &keys.outbox(id, bucket),
                product.end_at.timestamp_millis(),
            )
            .await?;
            self.ledger
                .update_window(&mut conn, id, bucket, &window(product))
                .await?;
        }
        self.extend_state(product).await
    }

    /// Makes the product's state hash live at least as long as its buckets may.
    pub(super) async fn extend_state(&self, product: &Product) -> Result<(), ApiError> {
        let mut conn = self.redis.get().await?;
        self.ledger
            .extend_state(
                &mut conn,
                product.id,
                expire_at_ms(product) + EXPIRY_SPREAD.as_millis() as i64,
            )
            .await?;
        Ok(())
    }

    /// After a load from `product`, a snapshot that may predate an edit of its window: the
    /// edit's own [`StockEngine::update_window`] (run once the edit is committed) reached
    /// only the buckets loaded before it. Re-reading the window after the load closes the
    /// gap: either this read sees the edit, or the edit committed later and its update saw
    /// these buckets. Without it a bucket could keep the old expiry and, the sale extended,
    /// expire and reload mid-sale on top of its earlier share.
    pub(super) async fn catch_up_window(&self, product: &Product) -> Result<(), ApiError> {
        let window: Option<(DateTime<Utc>, DateTime<Utc>)> =
            sqlx::query_as("SELECT start_at, end_at FROM products WHERE id = $1")
                .bind(product.id)
                .fetch_optional(&self.db)
                .await?;
        match window {
            Some((start_at, end_at))
                if (start_at, end_at) != (product.start_at, product.end_at) =>
            {
                let edited = Product {
                    start_at,
                    end_at,
                    ..product.clone()
                };
                self.update_window(&edited).await
            }
            _ => Ok(()),
        }
    }
}

/// The product's window as its buckets store it, with a fresh expiry (see [`expire_at_ms`]).
pub(super) fn window(product: &Product) -> Window {
    Window {
        start_ms: product.start_at.timestamp_millis(),
        end_ms: product.end_at.timestamp_millis(),
        expire_at_ms: expire_at_ms(product),
    }
}

/// When a product's bucket keys expire: an hour after the sale, spread over ten minutes.
pub(super) fn expire_at_ms(product: &Product) -> i64 {
    let spread = rand::random_range(0..EXPIRY_SPREAD.as_millis() as i64);
    product.end_at.timestamp_millis() + EXPIRY_GRACE.as_millis() as i64 + spread
}
