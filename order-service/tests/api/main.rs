//! order-service against real Postgres, Redis and RabbitMQ, one namespace per test.

mod batches;
mod breaker;
mod compensation;
mod consume;
mod errors;
mod forged;
mod helpers;
mod in_flight;
mod lifecycle_metrics;
mod ops;
mod outage;
mod parking;
mod payment;
mod retries;
mod signature;
mod startup;
mod topology;
