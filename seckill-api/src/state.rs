//! The one state every handler shares: cheap handles only.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::FromRef;
use moka::future::Cache;
use tokio::sync::Notify;

use seckill_auth::IdentitySigner;
use seckill_store::RedisKeys;

use crate::catalog::Catalog;
use crate::idempotency::Idempotency;
use crate::stock::StockEngine;

/// Handles shared by all handlers.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Products (Postgres + L1 cache).
    pub catalog: Catalog,
    /// Redis stock and purchase decisions.
    pub stock: StockEngine,
    /// Redis, for results.
    pub redis: deadpool_redis::Pool,
    /// Key names.
    pub keys: RedisKeys,
    /// Verifies the gateway's identity headers.
    pub signer: IdentitySigner,
    /// Products this replica saw sold out recently: answered 410 without Redis. Short-lived,
    /// because a cancelled order can put a unit back.
    pub sold_out: Cache<i64, ()>,
    /// `Idempotency-Key` records.
    pub idempotency: Idempotency,
    /// Wakes the outbox relay after an accepted purchase.
    pub relay_wakeup: Arc<Notify>,
}

impl FromRef<AppState> for IdentitySigner {
    fn from_ref(state: &AppState) -> Self {
        state.signer.clone()
    }
}

/// How long a local sold-out flag lasts.
pub const SOLD_OUT_FLAG_TTL: Duration = Duration::from_millis(500);
