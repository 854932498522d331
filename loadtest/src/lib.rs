//! The flash-sale load tester's parts, as a library so more than one driver can use them.
//!
//! Layout:
//! - [`product`]: creating the product through the admin API.
//! - [`burst`]: pre-minted tokens, the concurrent burst, latency and status tallies.
//! - [`settle`]: read-only access to the stores, the settle wait, the observed numbers.
//! - [`check`]: the invariants, as pure functions.
//! - [`report`]: the JSON report and the human summary.

pub mod burst;
pub mod check;
pub mod product;
pub mod report;
pub mod settle;
