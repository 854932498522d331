//! The Redis stock ledger: what every key and field of a product's buckets means, the Lua
//! scripts that change them (each `.lua` file here, its header stating KEYS, ARGV and return
//! codes), and typed calls to them. seckill-api sells through [`Ledger`]; order-service's
//! compensation relay gives units back through [`give_back()`]. No other code writes these keys.
//!
//! # Layout of a bucket
//! A product's stock is split into N buckets (`products.stock_buckets`), each a few keys with
//! its own hash tag (see [`crate::keys`]), so one product's load spreads over a Redis Cluster
//! and no script ever touches two slots. Every buyer has a **home bucket**
//! ([`crate::home_bucket`]), which holds their marker and their result. That is what keeps
//! "one unit per user" exact: whichever bucket the unit comes from, the decision that this
//! user may buy is made in one place.
//! - `stock` hash: `remaining` (units still on sale), `loaded_units` (what the load put in),
//!   `v` (the ledger version the load read), `start_ms`/`end_ms` (the sale window, judged by
//!   Redis' clock), `expire_at` (unix ms at which the bucket's keys expire). Its existence
//!   means "this bucket is loaded".
//! - `buyers` hash: user id → marker (below), for the users homed here.
//! - `takers` hash: user id → `<reservation ms>:<request id>`, for units this bucket gave to
//!   a sweep of a user homed elsewhere, so the unit is found again if the sweep dies.
//! - `outbox` stream: entries `request_id`, `payload` (the order message), `http_request_id`
//!   and, when the purchase was traced, `traceparent` (and `tracestate`) of accepted
//!   purchases not yet confirmed by RabbitMQ. It never expires.
//! - `results` hash: user id → [`crate::PurchaseResult`] text, for the users homed here.
//! - `returns` hash: event id → ledger version of given-up purchases whose unit came back here.
//! - `released` hash: request id → `1` of given-up purchases whose buyer (homed here) was
//!   released.
//! - the product's `state` hash: `gen` (bumped whenever units go back on sale), `sold_out`
//!   (the flag that keeps late requests off Lua), `loaded` (every bucket was loaded once).
//! - the product's `load-lock`: a random token, `SET NX PX`, released by compare-and-delete.
//!
//! # Markers
//! A buyer's home bucket holds one marker per buyer (`buyers` hash), and every marker names
//! the purchase it stands for, so that whatever clears it can tell it from a newer one
//! ([`marker`] reads and writes them; the scripts write the same shapes):
//! - `h:<request id>` bought from the home bucket (`purchase.lua`);
//! - `t<bucket>:<request id>` bought from another bucket by a sweep (`close.lua`);
//! - `r:<ms>:<request id>` a sweep in progress reserved it at `<ms>` (Redis' clock,
//!   `reserve.lua`);
//! - `o:<request id>` written by a load from Postgres (`load.lua`): a live order, or a dead
//!   letter still held for its buyer.
//!
//! # The purchase
//! 1. `purchase.lua` on the home bucket: window, marker, and if the home bucket has a unit,
//!    deduct + marker + outbox entry + result, atomically. This is the whole hot path.
//! 2. If the home bucket is dry, a **sweep**: read the product's sold-out flag (and its
//!    generation), reserve the marker in the home bucket (`reserve.lua`), then visit every
//!    bucket (from a random start, so sweeping buyers do not pile onto one donor) with
//!    `take.lua`, which deducts one unit and writes the outbox entry in *that* bucket's slot.
//!    The first unit found is the buyer's; `close.lua` closes the reservation, turning it
//!    into a marker that says where the unit came from. If every bucket was dry, it closes
//!    the reservation empty (the marker goes), `sold_out.lua` raises the flag (unless the
//!    generation moved) and the answer is sold out.
//!
//! Why this and not moving stock between buckets: a transfer takes units out of one slot
//! and puts them into another in two steps, so a crash or a concurrent sweep can strand
//! units in transit and turn a buyer away while stock exists. A sweep never moves stock:
//! a unit leaves a bucket only inside the script that also writes its outbox entry. Units
//! only decrease during a sale, so a sweep that found every bucket dry proves the product
//! was sold out when it finished: **no buyer hears `sold_out` while a bucket holds stock**.
//! (A unit put back by a cancellation is bumped through the generation, see
//! `sold_out.lua`.) The price is a few extra round trips for buyers whose home ran dry,
//! which only happens near the end of a sale; the flags then keep late requests off Lua.
//!
//! # Abandoned reservations
//! A replica can die between reserving and closing. `take.lua` refuses a reservation older
//! than the sweep fence (Redis' clock), so once a reservation is older than the fence plus
//! a clock-skew margin, no sweep can still take a unit for it. The next purchase by that
//! user then finds the marker stale (`purchase.lua` says so), looks for a unit taken under
//! that reservation in every bucket's `takers` hash, and either closes the reservation into
//! the marker of that unit (the user holds a unit: 409) or closes it empty and buys normally.
//!
//! # Loading
//! Stock is not preloaded. A purchase that finds its bucket missing takes the product's load
//! lock, reads one Postgres snapshot (the product's ledger version and every purchase holding
//! a unit: live orders, and dead letters not given up nor refused for their signature), and
//! fills each missing bucket with `load.lua`, which refuses to overwrite a loaded one, then
//! releases the lock (`unlock.lua`). Bucket keys expire after the sale ends plus a random
//! spread (no expiry storm); their expiry only ever moves later (`window.lua`), and the
//! product's state hash lives no shorter than its buckets (`extend.lua`): an expired `gen`
//! restarts from nothing.
//!
//! # Where a unit belongs
//! A purchase takes its unit from one bucket (its *origin*: the home bucket, or the bucket a
//! sweep took it from), and the order records it. A load gives bucket `b` its share of the
//! product's total less the purchases whose origin is `b`; a given-up purchase's unit goes
//! back to its origin. So each bucket's count stands on its own: loading some buckets later
//! than others (a load that died half-way) never counts one bucket's sales against another.
//!
//! # Versions
//! Every Postgres transaction that gives purchases up bumps `products.ledger_version` and
//! stamps its compensations with the new value. It locks the product row to do so, so the
//! versions follow commit order, and a load that read version `V` (in the same snapshot as
//! the orders it counted) saw exactly the give-ups numbered `≤ V`. The load writes `V` into
//! each bucket it fills; `restock.lua` puts a unit back only if its give-up is newer than
//! that, and when the bucket is not loaded it leaves the event in the bucket's returns hash,
//! where the load adds the units newer than its own snapshot. A unit is thus counted once
//! whichever comes first, the load or the compensation.
//!
//! The buyer's marker needs the same care: a release that runs between a load's snapshot and
//! its `load.lua` finds no marker to clear, and the stale snapshot would then mark the buyer
//! of a cancelled purchase for the rest of the sale. The returns hash cannot tell (it lives
//! in the unit's origin bucket, not in the buyer's home, and a give-up that returns no unit
//! is not in it), so `release.lua` records the purchase in the home bucket's `released`
//! hash, and `load.lua`, in the same slot, writes no marker or result for a purchase found
//! there. No version is needed: a request id names one purchase, and one given up never
//! holds a unit again.
//!
//! Layout:
//! - [`handle`] — the [`Ledger`] handle and [`LedgerError`].
//! - [`marker`] — buyer markers and sweep reservations.
//! - [`sale`] — the purchase on the home bucket and the sold-out flag: `purchase`, `sold_out`.
//! - [`sweep`] — a dry home bucket's sweep: `reserve`, `take`, `close`.
//! - [`load`] — loading and lifetimes: `load`, `window`, `extend`, `unlock`, and reads.
//! - [`compensation`] — giving a given-up purchase back ([`give_back()`]): `release`,
//!   `restock`, `reopen`.

pub mod compensation;
pub mod handle;
pub mod load;
pub mod marker;
pub mod sale;
pub mod sweep;

pub use compensation::{GiveBackError, GiveUp, Restocked, Standing, give_back};
pub use handle::{Ledger, LedgerError};
pub use load::{BucketLoad, HeldUnit, Window};
pub use marker::{Holding, Reservation, names};
pub use sale::{HomeAnswer, Purchase};
pub use sweep::{ReservationEnd, TakeAnswer};

/// `purchase.lua`'s text (after `outbox.lua`'s `append_outbox`, which it calls), for
/// benchmarks that run the script by hand (`EVALSHA`).
pub const PURCHASE_LUA: &str = concat!(include_str!("outbox.lua"), include_str!("purchase.lua"));
/// `take.lua`'s text (after `outbox.lua`'s `append_outbox`, which it calls), for tests that
/// drive a sweep's steps one by one.
pub const TAKE_LUA: &str = concat!(include_str!("outbox.lua"), include_str!("take.lua"));
