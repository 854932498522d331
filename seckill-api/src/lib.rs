//! seckill-api: decides every purchase, atomically, in Redis.
//!
//! A purchase is one Lua step on the buyer's home bucket of the product (one hash tag): check
//! the window, the buyer and the stock, deduct, and append the order intent to the bucket's
//! outbox stream; a buyer whose home bucket is dry sweeps the others (see [`stock`]).
//! A relay task then publishes outbox entries to RabbitMQ with publisher confirms and
//! deletes them only once the broker confirmed, so an accepted purchase survives a crash of
//! this process and an outage of the broker.
//!
//! Layout:
//! - [`config`] — settings.
//! - [`startup`] — `Application::build` / `run_until_stopped`, the task tree.
//! - [`catalog`] — products in Postgres behind a bloom filter ([`bloom`]), a Moka L1 cache
//!   and a Redis null cache ([`null_cache`]); [`catalog_sync`] applies product changes
//!   announced by Postgres `NOTIFY` on every replica.
//! - [`stock`] — the Redis stock engine: sharded buckets, sweeps, lazy loading under a lock.
//! - [`relay`] — the outbox → RabbitMQ relay.
//! - [`idempotency`] — `Idempotency-Key` replays.
//! - [`routes`] — HTTP handlers; [`error`]: the one error type they return.

pub mod bloom;
pub mod catalog;
pub mod catalog_sync;
pub mod config;
pub mod error;
pub mod idempotency;
pub mod null_cache;
pub mod relay;
pub mod routes;
pub mod startup;
pub mod state;
pub mod stock;

pub use config::Settings;
pub use startup::Application;
