//! The gateway, alone and in front of the real services (all in-process, real
//! Postgres/Redis/RabbitMQ, one namespace per test), and the compose file's consistency.
//!
//! `echo` runs the gateway alone in front of a stand-in backend that answers with what it
//! received: the token, rate-limit, upstream and overload tests use it.

mod admission_ceiling;
mod compose;
mod compose_exposure;
mod configuration;
mod differential;
mod e2e;
mod echo;
mod framing;
mod helpers;
mod identity;
mod keepalive;
mod ledger;
mod limits;
mod load_tools;
mod metric_names;
mod openapi;
mod operator;
mod overload;
mod proof_of_work;
mod ratelimit;
mod raw;
mod runbook;
mod sale_page;
mod schemathesis;
mod security;
mod shared_ratelimit;
mod startup;
mod strict;
mod tokens;
mod upstream_dns;
mod upstreams;
mod waiting_room;
