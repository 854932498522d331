//! seckill-api: decides every purchase, atomically, in Redis.
//!
//! A purchase is one Lua step on the buyer's home bucket of the product (one hash tag): check
//! the window, the buyer and the stock, deduct, and append the order intent to the bucket's
//! outbox stream; a buyer whose home bucket is dry sweeps the others (see [`stock`]).
//! The handler then publishes the intent to RabbitMQ with a publisher confirm and answers
//! `202` once it is confirmed ([`publisher`]); what a handler could not publish (broker
//! down or slow, process killed) the relay publishes from the outbox, deleting entries only
//! once the broker confirmed, so an accepted purchase survives a crash of this process and
//! an outage of the broker.
//!
//! Layout:
//! - [`config`] — settings.
//! - [`startup`] — `Application::build` / `run_until_stopped`, the task tree.
//! - [`catalog`] — products in Postgres behind a bloom filter ([`bloom`]), a Moka L1 cache
//!   and a Redis null cache ([`null_cache`]); [`catalog_sync`] applies product changes
//!   announced by Postgres `NOTIFY` on every replica.
//! - [`stock`] — the stock engine on `seckill_store::ledger` (the Redis buckets and their
//!   scripts): the purchase, sweeps, abandoned reservations, lazy loading under a lock.
//! - [`publisher`] — the handlers' confirmed publishing of accepted purchases.
//! - [`relay`] — the outbox → RabbitMQ relay (the safety net behind the handlers).
//! - [`transit`] — what both note in Postgres before it is out of the ledger fence's sight.
//! - [`metrics`] — the purchase and outbox metrics' names and help; the relay's
//!   `age` module reports the oldest outbox entry's age.
//! - [`idempotency`] — `Idempotency-Key` replays.
//! - [`sold_out`] — the products this replica remembers sold out, until units come back.
//! - [`room`] — the waiting rooms' set-up, written into Redis for the gateway.
//! - [`http`] — the HTTP API: the router, the state its handlers share, the handlers;
//!   [`error`]: the one error type they return.
//! - `failpoints` (with the `failpoints` feature) — the errors its failpoints return
//!   (`docs/failpoints.md`).

pub mod bloom;
pub mod catalog;
pub mod catalog_sync;
pub mod config;
pub mod error;
#[cfg(feature = "failpoints")]
mod failpoints;
pub mod http;
pub mod idempotency;
pub mod metrics;
pub mod null_cache;
pub mod publisher;
pub mod relay;
pub mod room;
pub mod sold_out;
pub mod startup;
pub mod stock;
pub mod transit;

pub use config::Settings;
pub use startup::Application;
