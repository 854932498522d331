//! Where state lives: the Postgres schema and the Redis key layout, shared by every service
//! (and by the load tester, which checks invariants against both).
//!
//! Layout:
//! - [`postgres`] — connect with retry, create the configured database, run migrations.
//! - [`failure`] — a failed store call sorted as every service answers it: outage or bug.
//! - [`keys`] — every Redis key, namespaced, with one hash tag per product.
//! - [`ledger`] — the Redis stock ledger: what every bucket key and marker means, every Lua
//!   script that changes them, and a typed [`ledger::Ledger`] handle on them.
//! - [`result`] — the buyer-visible purchase result as stored in Redis.
//! - [`reopened`] — following the announcements of units going back on sale.
//! - [`redis_handle`] — one Redis handle over a single server or a Redis Cluster, and
//!   pooled connections of their own for the command that blocks one, `WAIT`
//!   ([`redis_handle::dedicated`]).
//! - [`probes`] — readiness checks of the stores.
//! - [`transit`] — purchases noted in transit, out of the broker readings' sight.
//! - `failpoints` (with the `failpoints` feature) — the error its failpoints return
//!   (`docs/failpoints.md`).

#[cfg(feature = "failpoints")]
mod failpoints;
pub mod failure;
pub mod keys;
pub mod ledger;
pub mod postgres;
pub mod probes;
pub mod redis_handle;
pub mod reopened;
pub mod result;
pub mod transit;

pub use failure::StoreFailure;
pub use keys::{RedisKeys, home_bucket};
pub use redis_handle::dedicated::{CheckoutError, Dedicated};
pub use redis_handle::{Redis, RedisConn, WaitFor};
pub use result::PurchaseResult;
