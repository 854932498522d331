//! The gateway, alone and in front of the real services (all in-process, real
//! Postgres/Redis/RabbitMQ, one namespace per test), and the compose file's consistency.

mod compose;
mod e2e;
mod helpers;
mod security;
