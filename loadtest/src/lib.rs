//! The flash-sale load tester's parts, shared by its two drivers: `seckill-loadtest` (one
//! burst against a running platform, then the verdict) and `seckill-chaos` (the fault
//! matrix: its own stores and services, a burst per scenario with a fault injected while
//! purchases are in flight).
//!
//! Layout:
//! - [`product`]: creating the product through the admin API.
//! - [`burst`]: pre-minted tokens, the concurrent burst, latency and status tallies.
//! - [`stores`]: read-only access to the stores, the wait for quiet, the observed numbers.
//! - [`check`]: the invariants, as pure functions.
//! - [`pollers`]: a crowd waiting in line, polling at the gateway's pace, and what it costs.
//! - [`report`]: the JSON report and the human summary.
//! - [`room`]: the waiting-room scenario and its checks; [`draw`]: a raffle audited;
//!   [`bots`]: accounts that join and buy many times a second alongside the crowd.
//! - [`pow`]: the solver of the waiting room's proof-of-work on joining.
//! - [`chaos`]: the fault matrix.

pub mod bots;
pub mod burst;
pub mod chaos;
pub mod check;
pub mod draw;
pub mod pollers;
pub mod pow;
pub mod product;
pub mod report;
pub mod room;
pub mod stores;
