//! The gateway: the only public door.
//!
//! Every request to a business route is authenticated here (HS256 JWT, algorithm pinned),
//! stripped of any identity header the client sent, signed with the gateway's own identity
//! credential (see `seckill_auth::identity`), and proxied to a replica of the owning service
//! over a pooled keep-alive client. In-flight requests are bounded (fast 503 beyond), each
//! has a deadline (504), and bodies are size-limited (413).
//!
//! Layout:
//! - [`config`] — settings; [`startup`] — `Application::build` / `run_until_stopped`.
//! - [`auth`] — bearer token → verified identity, admin check.
//! - [`proxy`] — route table, upstream selection, request forwarding.

pub mod auth;
pub mod config;
pub mod proxy;
pub mod startup;

pub use config::Settings;
pub use startup::Application;
