//! seckill-api against real Postgres, Redis and RabbitMQ, one namespace per test.

mod helpers;
mod idempotency;
mod products;
mod purchase;
