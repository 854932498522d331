//! The stock engine: decides purchases on the Redis stock ledger and loads it from Postgres.
//!
//! The ledger itself — what each bucket key and buyer marker means, the scripts that change
//! them, and the argument that no buyer hears `sold_out` while a bucket holds stock — is
//! `seckill_store::ledger`. This module drives it, following that argument's sections:
//! - `engine` — the [`StockEngine`] handle and its reads;
//! - `purchase` — the home bucket's step, and what a purchase decides;
//! - `sweep` — a dry home bucket: reserve, take from the other buckets, close;
//! - `abandoned` — a reservation whose sweep died, resolved by the buyer's next purchase;
//! - `load` — lazy loading under the product's lock, guarded by the [`fence`];
//! - `window` — sale windows and the keys' lifetimes;
//! - `snapshot` — what a load reads from Postgres.

mod abandoned;
mod engine;
pub mod fence;
mod load;
mod purchase;
mod snapshot;
mod sweep;
mod window;

pub use engine::{StockEngine, Timings};
pub use purchase::{Decision, Intent, PurchaseRequest};
pub use seckill_store::ledger::Holding;
pub use snapshot::share;

#[cfg(test)]
mod tests;
