//! Keeps this replica's bloom filter and Moka cache in step with Postgres.
//!
//! Migration 0003 makes Postgres `NOTIFY product_changes, '<id>'` whenever a product is
//! inserted or its catalogue columns change, from whichever replica (or `psql`) wrote it. Each
//! replica listens: on `<id>` it adds the id to its bloom filter, drops its null-cache entry,
//! re-reads the product into Moka and, when the sale window moved, updates the window of the
//! loaded stock buckets in Redis (idempotent, so every replica doing it is harmless), and
//! hands the product to the waiting rooms' sync ([`crate::room`]), which writes its room.
//!
//! Notifications are not queued for a listener that is away: whenever the listening
//! connection is (re)established, the filter is rebuilt from `SELECT id FROM products` and
//! Moka is emptied, *after* `LISTEN`, so a change is either in that read or notified after it.

use anyhow::Context;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use seckill_messaging::{Health, Supervised, Supervisor};

use crate::catalog::{Catalog, Product};
use crate::room;
use crate::stock::StockEngine;

/// The channel migration 0003's trigger notifies.
pub const CHANNEL: &str = "product_changes";

/// The change listener of one replica; run it with [`CatalogSync::run`].
pub struct CatalogSync {
    database_url: String,
    /// `None` while disconnected.
    listener: Option<PgListener>,
    catalog: Catalog,
    stock: StockEngine,
    /// The waiting rooms' sync, which writes each changed product's room.
    rooms: room::Changed,
}

impl std::fmt::Debug for CatalogSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogSync")
            .field("listening", &self.listener.is_some())
            .finish_non_exhaustive()
    }
}

impl CatalogSync {
    /// Listens on [`CHANNEL`] and fills the bloom filter, so the catalog is complete before
    /// the first request. Uses its own connection (not one of the pool's), held for good.
    /// Changed products go to `rooms` too.
    pub async fn start(
        database_url: &str,
        catalog: Catalog,
        stock: StockEngine,
        rooms: room::Changed,
    ) -> anyhow::Result<Self> {
        let mut sync = Self {
            database_url: database_url.to_string(),
            listener: None,
            catalog,
            stock,
            rooms,
        };
        sync.connect("start").await?;
        Ok(sync)
    }

    /// Applies notifications until `cancel`, re-establishing the connection (and rebuilding)
    /// whenever it drops.
    pub async fn run(mut self, cancel: CancellationToken) -> anyhow::Result<()> {
        Supervisor::new("product change listener")
            .run(&mut self, &cancel)
            .await;
        Ok(())
    }

    /// A fresh listening connection, then a rebuild.
    async fn connect(&mut self, reason: &'static str) -> anyhow::Result<()> {
        self.listener = None;
        let mut listener = PgListener::connect(&self.database_url)
            .await
            .context("connect the product change listener")?;
        listener
            .listen(CHANNEL)
            .await
            .context("LISTEN product_changes")?;
        // Kept only once rebuilt: a listener without a rebuild behind it would miss changes.
        self.resync(reason).await?;
        self.listener = Some(listener);
        Ok(())
    }

    /// Rebuilds the bloom filter from the table and empties Moka.
    async fn resync(&self, reason: &'static str) -> anyhow::Result<()> {
        let ids = self.catalog.all_ids().await.context("read product ids")?;
        self.catalog.bloom().rebuild(&ids)?;
        self.catalog.invalidate_all();
        metrics::counter!("seckill_catalog_resyncs_total", "reason" => reason).increment(1);
        tracing::info!(products = ids.len(), reason, "product bloom filter rebuilt");
        Ok(())
    }

    /// One notification: the product with this id was created or changed.
    async fn apply(&self, payload: &str) {
        let Ok(id) = payload.parse::<i64>() else {
            tracing::warn!(payload, "ignoring a product change that is not an id");
            return;
        };
        metrics::counter!("seckill_product_changes_total").increment(1);
        let before = self.catalog.cached(id).await.flatten();
        let product = match self.catalog.reload(id).await {
            Ok(Some(product)) => product,
            Ok(None) => return,
            Err(e) => {
                // The id is in the filter and Moka no longer holds the old row; the next
                // lookup reads Postgres itself. Only the Redis window waits for a later change.
                tracing::warn!(product_id = id, error = %e, "could not re-read a changed product");
                return;
            }
        };
        // Read after the change committed: the room's last write on this replica is of this.
        // (No receiver only once the application stops.)
        let _ = self.rooms.send(product.clone());
        if self.catalog.bloom().over_capacity()
            && let Err(e) = self.resync("resize").await
        {
            tracing::warn!(error = format!("{e:#}"), "bloom filter resize failed");
        }
        // Unknown `before` (not cached here) counts as moved: the update is idempotent.
        if before.is_some_and(|old| same_window(&old, &product)) {
            return;
        }
        // A no-op for buckets that are not loaded: they load with the new window.
        if let Err(e) = self.stock.update_window(&product).await {
            tracing::warn!(product_id = id, error = %e, "could not update the window in redis");
        }
    }
}

impl Supervised for CatalogSync {
    /// (Re)connects unless connected, then applies notifications until `cancel` or until
    /// the connection is lost (the next cycle connects and rebuilds).
    async fn cycle(
        &mut self,
        health: &mut Health,
        cancel: &CancellationToken,
    ) -> anyhow::Result<()> {
        if self.listener.is_none() {
            // Connecting waits up to the pool's acquire timeout: not past a shutdown.
            tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                connected = self.connect("reconnect") => connected?,
            }
        }
        health.healthy();
        loop {
            let Some(listener) = self.listener.as_mut() else {
                anyhow::bail!("no listening connection");
            };
            let received = tokio::select! {
                () = cancel.cancelled() => return Ok(()),
                received = listener.try_recv() => received,
            };
            match received {
                Ok(Some(notification)) => self.apply(notification.payload()).await,
                // The connection dropped and the listener re-subscribed on a new one; whatever
                // was notified in between is lost, so start over from the table.
                Ok(None) => {
                    tracing::warn!("product change listener reconnected; rebuilding");
                    if let Err(e) = self.resync("reconnect").await {
                        self.listener = None;
                        return Err(e.context("rebuild after reconnect"));
                    }
                }
                Err(e) => {
                    self.listener = None;
                    return Err(anyhow::Error::from(e).context("lost postgres"));
                }
            }
        }
    }
}

fn same_window(a: &Product, b: &Product) -> bool {
    a.start_at == b.start_at && a.end_at == b.end_at
}
