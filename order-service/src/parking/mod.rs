//! The parking lot: dead letters kept in Postgres for an operator, and what they can do with
//! them (list, redrive, ignore, clear a quarantine), each action audited.
//!
//! Life of an entry (`dead_letters.status`):
//! ```text
//! dead letter ──record──► pending ──redrive──► redriven ──dead letter again──► pending
//!                            │                                 (after N redrives: quarantined)
//!                            └──ignore──► ignored (its unit goes back on sale: compensation)
//! quarantined ──clear──► pending        quarantined ──ignore──► ignored
//! ```
//! An entry parked for its signature (`unsigned`, `bad_signature`) goes through the same
//! states but holds nothing: ignored, it is only marked so, and redriven, it is refused again.
//! Whether a dead letter is one is checked on arrival, never read from its headers: anyone
//! who can publish to the dead-letter exchange can claim any reason (`entry::Arrival`).
//! Under one request id the genuine dead letter wins: it takes over a forgery's entry, and a
//! forgery never changes its entry (`store::record`).
//! A redrive flips the entry to `redriven` and publishes its body back to the orders exchange
//! (with a confirm) inside one transaction that commits only after the confirm: a failed
//! publish leaves it `pending`, and a second redrive of the same entry finds it `redriven`
//! and does nothing. A crash between confirm and commit republishes on the next redrive,
//! which the idempotent order write absorbs.
//!
//! Layout (this file only declares and re-exports; imports run one way, toward `entry` and
//! `selection`):
//! - `entry` — [`Entry`], [`Status`], an [`Arrival`] from the dead-letter queue, [`AuditEntry`].
//! - `selection` — which entries an action applies to ([`Selection`]), its [`Report`] and
//!   [`ParkingError`].
//! - `store` — the SQL: [`record`], [`list`], [`audit_log`], [`clear`].
//! - `ignore` — [`ignore`]: giving entries up, with a tombstone order and a compensation.
//! - `redrive` — [`Redriver`]: publishing entries back with a confirm.
//! - `pace` — [`RedrivePace`]: the redrives' rate limit, on `governor`.

mod entry;
mod ignore;
mod pace;
mod redrive;
mod selection;
mod store;

pub use entry::{Arrival, AuditEntry, Entry, Status};
pub use ignore::ignore;
pub use pace::RedrivePace;
pub use redrive::{HEADER_REDRIVE, Redriver};
pub use selection::{MAX_SELECTION, ParkingError, Report, Selection};
pub use store::{audit_log, clear, list, record};
