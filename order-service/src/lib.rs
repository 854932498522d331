//! order-service: turns accepted purchases into orders in Postgres, exactly once in effect.
//!
//! Messages arrive at least once (the relay republishes what it could not confirm, the
//! broker redelivers what was not acked). Each is written in one transaction that inserts
//! the order — `request_id` unique, one live order per user and product — and decrements
//! the product's DB stock only if some is left. A redelivery finds the order already there
//! and is acked as a no-op. Acks happen only after commit.
//!
//! Layout:
//! - [`config`] — settings; [`startup`] — `Application::build` / `run_until_stopped`.
//! - [`cli`] — the command line: run the service, or an operator command on the breaker or
//!   the parking lot.
//! - [`orders`] — the idempotent write and order queries.
//! - [`consumer`] — the RabbitMQ consumer (manual ack, prefetch, concurrent writes): its
//!   loop, its batches, and what becomes of each delivery, in a module each.
//! - [`http`] — the shared state and every route: the buyer's orders (`GET /api/orders`,
//!   `GET /api/orders/{id}`, `POST …/pay`, `POST …/cancel`) and the operator's parking lot
//!   and breaker (`/admin/…`); [`error`] — the one error type they answer with.
//! - [`breaker`] — the circuit breaker around the database; [`retry`] — tiers and budget.
//! - [`recorder`] — drains the dead-letter queue into the parking lot ([`parking`]: entries,
//!   selections, SQL, redrive publishing and its pace), which the admin routes and the CLI
//!   list, redrive, ignore and clear.
//! - [`compensation`] — the payment window and putting given-up units back on sale.
//! - [`in_flight`] — what of the order flow this replica has in hand, told to Postgres for
//!   seckill-api's fence after a Redis loss.
//! - [`metrics`] — the message-lifecycle metrics' names and help; [`queue_watch`] —
//!   the queues' depth and consumers, read by passive declares.
//! - `failpoints` (with the `failpoints` feature) — the errors its failpoints return
//!   (`docs/failpoints.md`).

pub mod ack_window;
pub mod breaker;
pub mod cli;
pub mod compensation;
pub mod config;
pub mod consumer;
pub mod error;
#[cfg(feature = "failpoints")]
mod failpoints;
pub mod http;
pub mod in_flight;
pub mod metrics;
pub mod orders;
pub mod parking;
pub mod queue_watch;
pub mod recorder;
pub mod retry;
pub mod startup;

pub use config::Settings;
pub use startup::Application;
