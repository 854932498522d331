//! seckill-api: decides every purchase, atomically, in Redis.
//!
//! A purchase is one Lua step on the product's keys (one hash tag): check the window, the
//! buyer and the stock, deduct, and append the order intent to the product's outbox stream.
//! A relay task then publishes outbox entries to RabbitMQ with publisher confirms and
//! deletes them only once the broker confirmed, so an accepted purchase survives a crash of
//! this process and an outage of the broker.
//!
//! Layout:
//! - [`config`] — settings.
//! - [`startup`] — `Application::build` / `run_until_stopped`, the task tree.
//! - [`catalog`] — products in Postgres behind a Moka L1 cache.
//! - [`stock`] — the Redis stock engine: lazy loading under a lock, the purchase Lua.
//! - [`relay`] — the outbox → RabbitMQ relay.
//! - [`idempotency`] — `Idempotency-Key` replays.
//! - [`routes`] — HTTP handlers; [`error`]: the one error type they return.

pub mod catalog;
pub mod config;
pub mod error;
pub mod idempotency;
pub mod relay;
pub mod routes;
pub mod startup;
pub mod state;
pub mod stock;

pub use config::Settings;
pub use startup::Application;
