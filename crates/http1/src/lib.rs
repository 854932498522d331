//! The gateway's HTTP/1.1, both sides, served and spoken without a general-purpose server
//! or client.
//!
//! The gateway forwards requests as bytes — the client's head is parsed once, checked, and
//! the replica's request written from its slices — and responds likewise, so no request or
//! response passes through a header map. hyper's server did the same job for about a sixth
//! of the gateway's CPU per request (parsing into and encoding from header maps, its
//! dispatch and body machinery), and the gateway reads every body whole anyway: it needs
//! neither streaming nor HTTP/2 on this leg. What a general server gave for free is written
//! down here instead, in one place: the framing rules that keep request smuggling out
//! ([`request`]), the body readers ([`body`]), `100 Continue` ([`incoming`]), pipelining,
//! keep-alive, head and idle timeouts ([`server`]), and the lingering close at shutdown
//! ([`body`]).
//!
//! This crate knows nothing of the application: the gateway plugs in as a [`Handler`]
//! (the server side) and a [`ConnectionPool`] (where the client side's connections come
//! from), both called with static dispatch. It is a crate of its own, not a module of the
//! gateway, so that the fuzz targets (`fuzz/`) build it alone: instrumented, with nothing
//! of axum, Redis or OpenTelemetry to compile first.
//!
//! Layout:
//! - [`server`] — one client connection's loop, generic over the [`Handler`];
//!   [`incoming`] — a request as the handler sees it, its body on demand;
//! - [`client`] — one exchange with an upstream server, its response head parsed and its
//!   body read whole;
//! - [`request`] — a request head, parsed and checked; [`response`] — a response and its
//!   encoding; [`headers`] — header rules both sides share;
//! - [`body`] — a [`Connection`] (socket and read buffer) and the body readers both sides
//!   share;
//! - [`caps`] — the caps on open connections, overall and per client address;
//! - `fuzzing` (hidden) — what the fuzz targets read that the gateway keeps to itself.

pub mod body;
pub mod caps;
pub mod client;
#[doc(hidden)]
pub mod fuzzing;
pub mod headers;
pub mod incoming;
pub mod request;
pub mod response;
pub mod server;

pub use body::{Connection, Probe, ReadError};
pub use caps::{CapReason, ConnectionCaps};
pub use client::{ConnectionPool, ExchangeError, Outgoing};
pub use headers::{HopByHop, Kind, header_line, list_items};
pub use incoming::{BodyError, BodyState, Incoming};
pub use request::{Framing, HeadError, HeadLimits, MAX_HEADERS_CAP, RequestHead, Version};
pub use response::{EncodeOptions, Persistence, Response, with_date};
pub use server::{ConnectionLimits, Handler, Wait, refuse_connection, serve_connection};
