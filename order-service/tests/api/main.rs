//! order-service against real Postgres, Redis and RabbitMQ, one namespace per test.

mod consume;
mod helpers;
