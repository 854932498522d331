//! The sweep of a buyer whose home bucket is dry (see [`crate::ledger`]'s "The purchase" and
//! "Abandoned reservations"): `reserve.lua`, `take.lua`, `close.lua`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script};

use super::handle::{Ledger, LedgerError};
use super::marker::{self, Reservation};
use super::sale::Purchase;
use crate::redis_handle::RedisConn;

static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reserve.lua")));
static TAKE: LazyLock<Script> = LazyLock::new(|| Script::new(super::TAKE_LUA));
static CLOSE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("close.lua")));

/// What `take.lua` said of one bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TakeAnswer {
    /// A unit was taken; the order intent is this outbox entry.
    Taken(String),
    /// No unit here.
    Dry,
    /// The sale window closed.
    NotActive,
    /// The bucket is not loaded.
    NotLoaded,
    /// The reservation is past the fence: nothing was taken.
    PastFence,
}

/// How a sweep's reservation ends.
#[derive(Debug, Clone, Copy)]
pub enum ReservationEnd<'a> {
    /// A unit was taken from `bucket` for purchase `request_id`.
    Took {
        /// Where the unit came from.
        bucket: u16,
        /// The purchase that holds it.
        request_id: &'a str,
    },
    /// No unit was taken: the marker goes.
    Empty,
}

impl Ledger {
    /// Reserves the buyer's marker in `home` for a sweep (`reserve.lua`); `None` when the
    /// buyer already has a marker.
    pub async fn reserve(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        home: u16,
        user_id: i64,
        request_id: &str,
    ) -> RedisResult<Option<Reservation>> {
        let reserved_at: i64 = RESERVE
            .key(self.keys().buyers(product_id, home))
            .key(self.keys().stock(product_id, home))
            .arg(user_id)
            .arg(request_id)
            .invoke_async(conn)
            .await?;
        Ok((reserved_at >= 0).then(|| Reservation::made(reserved_at, request_id)))
    }

    /// One sweep step: takes a unit from `bucket` under `reservation` unless it is older
    /// than `fence` (`take.lua`).
    pub async fn take(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
        p: &Purchase<'_>,
        reservation: &Reservation,
        fence: Duration,
    ) -> Result<TakeAnswer, LedgerError> {
        let (code, entry_id): (i64, String) = TAKE
            .key(self.keys().stock(product_id, bucket))
            .key(self.keys().takers(product_id, bucket))
            .key(self.keys().outbox(product_id, bucket))
            .arg(p.user_id)
            .arg(p.request_id)
            .arg(p.payload)
            .arg(p.http_request_id)
            .arg(reservation.at())
            .arg(fence.as_millis() as u64)
            .arg(p.traceparent)
            .arg(p.tracestate)
            .invoke_async(conn)
            .await?;
        Ok(match code {
            1 => TakeAnswer::Taken(entry_id),
            0 => TakeAnswer::Dry,
            -2 => TakeAnswer::NotActive,
            -3 => TakeAnswer::NotLoaded,
            -4 => TakeAnswer::PastFence,
            code => {
                return Err(LedgerError::UnknownCode {
                    script: "take",
                    code,
                });
            }
        })
    }

    /// The purchase `bucket` gave a unit to under `reservation`, if any (its `takers` hash).
    pub async fn taken_under(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
        user_id: i64,
        reservation: &Reservation,
    ) -> RedisResult<Option<String>> {
        let stored: Option<String> = redis::cmd("HGET")
            .arg(self.keys().takers(product_id, bucket))
            .arg(user_id)
            .query_async(conn)
            .await?;
        Ok(stored
            .as_deref()
            .and_then(|s| reservation.taker(s))
            .map(str::to_string))
    }

    /// Closes a sweep's reservation in `home` (`close.lua`): into the marker of the unit
    /// taken, showing the buyer their purchase queued, or empty. False when the reservation
    /// was not (or no longer) there.
    pub async fn close_reservation(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        home: u16,
        user_id: i64,
        reservation: &Reservation,
        end: ReservationEnd<'_>,
    ) -> RedisResult<bool> {
        let (marker, result) = match end {
            ReservationEnd::Took { bucket, request_id } => (
                marker::taken(bucket, request_id),
                format!("queued:{request_id}"),
            ),
            ReservationEnd::Empty => (String::new(), String::new()),
        };
        let closed: i64 = CLOSE
            .key(self.keys().buyers(product_id, home))
            .key(self.keys().results(product_id, home))
            .arg(user_id)
            .arg(reservation.marker())
            .arg(marker)
            .arg(result)
            .invoke_async(conn)
            .await?;
        Ok(closed == 1)
    }
}
