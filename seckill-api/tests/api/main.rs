//! seckill-api against real Postgres, Redis and RabbitMQ, one namespace per test.

mod buckets;
mod catalog;
mod duplicates;
mod durability;
mod fence;
// Some helpers serve only tests/sold_out_flags.rs, which includes this module too.
#[allow(dead_code)]
mod helpers;
mod idempotency;
mod identity;
mod outbox_age;
mod products;
mod purchase;
mod relay;
mod resilience;
mod startup;
mod trace_context;
mod waiting_room;
