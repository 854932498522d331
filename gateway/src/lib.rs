//! The gateway: the only way in from the public network.
//!
//! Every request to a business route is authenticated here (a JWT whose algorithm — HS256,
//! RS256 or EdDSA — is pinned by configuration), rate-limited per user (per client address
//! when there is no user), stripped of any identity header the client sent, signed with the
//! gateway's own identity credential (see `seckill_auth::identity`), and proxied to a
//! replica of the owning service over a pooled keep-alive client. In-flight requests are
//! bounded (fast 503 beyond), each has a deadline (504), bodies and heads are size-limited
//! (413, 431).
//!
//! Layout:
//! - [`config`] — settings; [`startup`] — `Application::build` / `run_until_stopped`;
//!   [`serve`] — the accept loop and the worker threads.
//! - [`seckill_http1`], a crate of its own — HTTP/1.1 on both sides, knowing nothing of
//!   the rest: the server (heads, framing, keep-alive) generic over a handler, the client
//!   for the upstream leg, the body readers and header rules both share.
//! - [`pipeline`] — the request path, in order: the application's
//!   [`seckill_http1::Handler`]; [`ops`] — the public `/healthz`, and the operator listener
//!   (`/metrics`, `/readyz`) on loopback; [`error`] — the gateway's own JSON error
//!   responses; [`in_flight`] — the bounds on requests and purchases under way.
//! - [`openapi`] — the public API contract (`docs/openapi.json`, served at `/openapi.json`)
//!   and the function that builds it from the code.
//! - [`auth`] — bearer token → verified identity, admin check.
//! - [`client_ip`] — the client address, through trusted proxies only.
//! - [`ratelimit`] — per-user / per-address GCRA quotas.
//! - [`metrics`] — the names of the gateway's own metrics.
//! - [`sold_out`] — a sold-out product's purchases answered here, until units come back.
//! - [`room`] — the waiting rooms: tickets, admission, passes; [`sale_page`] — the buyer's
//!   page (`/sale/{product_id}`), compiled in from `gateway/static/sale/`.
//! - [`proxy`] — route table, upstream selection and ejection, request forwarding, the
//!   upstream connection pool.

pub mod auth;
pub mod client_ip;
pub mod config;
pub mod error;
pub mod in_flight;
pub mod metrics;
pub mod openapi;
pub mod ops;
pub mod pipeline;
pub mod proxy;
pub mod ratelimit;
pub mod room;
pub mod sale_page;
pub mod serve;
pub mod sold_out;
pub mod startup;

pub use config::Settings;
pub use startup::Application;
