//! The client side of the gateway: HTTP/1.1, served without a general-purpose server.
//!
//! The gateway forwards requests as bytes — the client's head is parsed once, checked, and
//! the replica's request written from its slices — and answers likewise, so no request or
//! answer passes through a header map. hyper's server did the same job for about a sixth of
//! the gateway's CPU per request (parsing into and encoding from header maps, its dispatch
//! and body machinery), and the gateway reads every body whole anyway: it needs neither
//! streaming nor HTTP/2 on this leg. What a general server gave for free is written down
//! here instead, in one place: the framing rules that keep request smuggling out
//! ([`head`]), the body readers ([`crate::wire`]), `100 Continue`, pipelining, keep-alive,
//! head and idle timeouts, and the drain at shutdown ([`conn`]).
//!
//! Layout: [`head`] — a request head, parsed and checked; [`conn`] — one connection's
//! loop and the request's body on demand; [`answer`] — an answer and its encoding.

pub mod answer;
pub mod conn;
pub mod head;

pub use answer::{Answer, header_line};
pub use conn::{BodyError, BodyState, ConnLimits, Incoming, serve_connection};
pub use head::{
    Framing, HeadError, HeadLimits, HopByHop, Kind, MAX_HEADERS_CAP, RequestHead, list_items,
};
