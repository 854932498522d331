//! The purchase on the home bucket and the sold-out flag (see [`crate::ledger`]'s "The
//! purchase"): `purchase.lua`, `sold_out.lua`, and the reads around them.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script};

use super::handle::{Ledger, LedgerError};
use super::marker::{self, Holding, Reservation};
use crate::redis_handle::RedisConn;

static PURCHASE: LazyLock<Script> = LazyLock::new(|| Script::new(super::PURCHASE_LUA));
static SOLD_OUT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("sold_out.lua")));

/// One purchase as the ledger records it.
#[derive(Debug, Clone, Copy)]
pub struct Purchase<'a> {
    /// The buyer.
    pub user_id: i64,
    /// The purchase's request id.
    pub request_id: &'a str,
    /// The order message for the outbox entry.
    pub payload: &'a str,
    /// The HTTP request id, kept with the entry for tracing.
    pub http_request_id: &'a str,
    /// The purchase's W3C `traceparent`, kept in the entry for the relay ('' for none).
    pub traceparent: &'a str,
    /// Its `tracestate` ('' for none).
    pub tracestate: &'a str,
}

/// What `purchase.lua` said of the home bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HomeAnswer {
    /// A unit was taken; the order intent is this outbox entry.
    Accepted(String),
    /// No unit here; nothing was reserved.
    Dry,
    /// The buyer already holds a unit (or is buying one right now).
    AlreadyHeld,
    /// Outside the sale window.
    NotActive,
    /// The bucket is not loaded.
    NotLoaded,
    /// The buyer's marker is a reservation past its fence: resolve it, then retry.
    Abandoned(Reservation),
}

impl Ledger {
    /// Runs `purchase.lua` on `home`; a reservation older than `stale` counts as abandoned.
    pub async fn purchase(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        home: u16,
        p: &Purchase<'_>,
        stale: Duration,
    ) -> Result<HomeAnswer, LedgerError> {
        let keys = self.keys();
        let (code, detail): (i64, String) = PURCHASE
            .key(keys.stock(product_id, home))
            .key(keys.buyers(product_id, home))
            .key(keys.outbox(product_id, home))
            .key(keys.results(product_id, home))
            .arg(p.user_id)
            .arg(p.request_id)
            .arg(p.payload)
            .arg(p.http_request_id)
            .arg(stale.as_millis() as u64)
            .arg(p.traceparent)
            .arg(p.tracestate)
            .invoke_async(conn)
            .await?;
        Ok(match code {
            1 => HomeAnswer::Accepted(detail),
            0 => HomeAnswer::Dry,
            -1 => HomeAnswer::AlreadyHeld,
            -2 => HomeAnswer::NotActive,
            -3 => HomeAnswer::NotLoaded,
            -5 => HomeAnswer::Abandoned(Reservation::found(detail)),
            code => {
                return Err(LedgerError::UnknownCode {
                    script: "purchase",
                    code,
                });
            }
        })
    }

    /// Whether the buyer's marker in `home` says purchase `request_id` bought there (how a
    /// lost answer of [`Ledger::purchase`] is recovered).
    pub async fn bought_at_home(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        home: u16,
        user_id: i64,
        request_id: &str,
    ) -> RedisResult<bool> {
        let stored = self.marker(conn, product_id, home, user_id).await?;
        Ok(stored.as_deref() == Some(marker::home(request_id).as_str()))
    }

    /// What the buyer's marker in `home` says of purchase `request_id`.
    pub async fn holding(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        home: u16,
        user_id: i64,
        request_id: impl std::fmt::Display,
    ) -> RedisResult<Holding> {
        let stored = self.marker(conn, product_id, home, user_id).await?;
        Ok(Holding::of(stored.as_deref(), request_id))
    }

    async fn marker(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        home: u16,
        user_id: i64,
    ) -> RedisResult<Option<String>> {
        redis::cmd("HGET")
            .arg(self.keys().buyers(product_id, home))
            .arg(user_id)
            .query_async(conn)
            .await
    }

    /// The product's sold-out flag, and its generation ('' when unset) for
    /// [`Ledger::raise_sold_out`].
    pub async fn sale_state(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
    ) -> RedisResult<(bool, String)> {
        let (sold_out, generation): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(self.keys().product_state(product_id))
            .arg("sold_out")
            .arg("gen")
            .query_async(conn)
            .await?;
        Ok((sold_out.is_some(), generation.unwrap_or_default()))
    }

    /// Whether the product's sold-out flag is up.
    pub async fn is_sold_out(&self, conn: &mut RedisConn, product_id: i64) -> RedisResult<bool> {
        let flag: Option<String> = redis::cmd("HGET")
            .arg(self.keys().product_state(product_id))
            .arg("sold_out")
            .query_async(conn)
            .await?;
        Ok(flag.is_some())
    }

    /// Raises the sold-out flag unless the generation moved from `generation` since it was
    /// read (`sold_out.lua`); whether it is up. The flag expires at `expire_at_ms`.
    pub async fn raise_sold_out(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        generation: &str,
        expire_at_ms: i64,
    ) -> RedisResult<bool> {
        let raised: i64 = SOLD_OUT
            .key(self.keys().product_state(product_id))
            .arg(generation)
            .arg(expire_at_ms)
            .invoke_async(conn)
            .await?;
        Ok(raised == 1)
    }
}
