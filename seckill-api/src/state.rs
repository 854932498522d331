//! The one state every handler shares: cheap handles only.

use std::sync::Arc;

use moka::future::Cache;

use seckill_auth::IdentityVerifier;
use seckill_store::RedisKeys;

use crate::catalog::Catalog;
use crate::idempotency::Idempotency;
use crate::publisher::OrderPublisher;
use crate::relay::RelayHints;
use crate::stock::StockEngine;

/// Handles shared by all handlers.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Products (Postgres + L1 cache).
    pub catalog: Catalog,
    /// Redis stock and purchase decisions.
    pub stock: StockEngine,
    /// Redis, for results.
    pub redis: seckill_store::Redis,
    /// Key names.
    pub keys: RedisKeys,
    /// Verifies the gateway's identity credentials (the routes' middleware holds it).
    pub identity: IdentityVerifier,
    /// Products this replica saw flagged sold out in Redis recently: answered 410 without
    /// Redis or Lua. Forgotten when units go back on sale (announced
    /// on the reopened channel, see `seckill_store::reopened`) and in any case after
    /// `sold_out_local_ttl_ms`, should an announcement be missed.
    pub sold_out: Cache<i64, ()>,
    /// The generation each product was last announced reopened at (for a minute): a
    /// sold-out decision of an older one predates the reopen and is neither remembered nor
    /// told to the gateway.
    pub reopened: Cache<i64, u64>,
    /// `Idempotency-Key` records.
    pub idempotency: Idempotency,
    /// Tells the outbox relay which stream an accepted purchase went to.
    pub relay_hints: Arc<RelayHints>,
    /// Publishes accepted purchases before they are answered; `None`: the relay does.
    pub publisher: Option<OrderPublisher>,
    /// Buckets of a product created without a bucket count.
    pub default_buckets: i16,
}
