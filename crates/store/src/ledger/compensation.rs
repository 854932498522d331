//! Giving a given-up purchase back (see [`crate::ledger`]'s "Where a unit belongs" and
//! "Versions"): `release.lua`, `restock.lua`, `reopen.lua`. order-service's compensation relay
//! calls [`give_back()`].

use redis::Script;

#[cfg(feature = "failpoints")]
use crate::failpoints::redis_lost;
use crate::keys::{RedisKeys, home_bucket};
use crate::ledger::marker::loaded;
use crate::redis_handle::Redis;
use crate::result::PurchaseResult;

/// How long a returns (or released) hash lives when its bucket is not loaded: far beyond
/// any load.
const UNLOADED_RETURNS_TTL_MS: u64 = 3_600_000;

/// A purchase given up in Postgres, to be undone in Redis.
#[derive(Debug, Clone)]
pub struct GiveUp<'a> {
    /// The product.
    pub product_id: i64,
    /// The product's bucket count.
    pub buckets: u16,
    /// The buyer.
    pub user_id: i64,
    /// The purchase's request id.
    pub event_id: &'a str,
    /// Its order, if it became one (a dead letter given up never did).
    pub order_id: Option<i64>,
    /// The bucket its unit came from; `None`: the buyer's home bucket.
    pub origin: Option<u16>,
    /// The ledger version its give-up committed as; `None` (older rows): newer than any load.
    pub version: Option<i64>,
    /// Whether its unit goes back on sale (false: the unit never existed in the database).
    pub restock: bool,
    /// What the buyer's result becomes, e.g. `failed:cancelled`.
    pub result: &'a str,
    /// The buyer's live order of the product from another purchase, if any: its marker and
    /// its success take this purchase's place (see `release.lua`).
    pub standing: Option<Standing<'a>>,
}

/// A buyer's live order of a product, as Redis shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing<'a> {
    /// The purchase that made it (its request id).
    pub request_id: &'a str,
    /// The order.
    pub order_id: i64,
}

/// What [`give_back`] did with the unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restocked {
    /// Back on sale now.
    Returned,
    /// Its bucket is not loaded; the next load counts it.
    Deferred,
    /// The bucket's load had already counted it.
    CountedByLoad,
    /// An earlier run already handled it.
    AlreadyReturned,
    /// No unit goes back (the buyer is only released).
    NotRestocked,
}

impl Restocked {
    /// snake_case, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Returned => "returned",
            Self::Deferred => "bucket_not_loaded",
            Self::CountedByLoad => "counted_by_load",
            Self::AlreadyReturned => "already_returned",
            Self::NotRestocked => "buyer_released",
        }
    }
}

/// A [`give_back`] that failed, and whether the product's reopen is owed.
#[derive(Debug)]
pub struct GiveBackError {
    /// The restock was sent: the unit may be back in its bucket (its answer lost, or the
    /// reopen after it failed) under a sold-out flag still up. The flag must come down
    /// within its bound, so the caller runs [`give_back`] again at once, not after a backoff.
    pub reopen_owed: bool,
    /// What Redis said.
    pub source: redis::RedisError,
}

impl GiveBackError {
    fn before_restock(source: redis::RedisError) -> Self {
        Self {
            reopen_owed: false,
            source,
        }
    }

    fn reopen_owed(source: redis::RedisError) -> Self {
        Self {
            reopen_owed: true,
            source,
        }
    }
}

impl std::fmt::Display for GiveBackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.reopen_owed {
            write!(f, "reopen owed: {}", self.source)
        } else {
            self.source.fmt(f)
        }
    }
}

impl std::error::Error for GiveBackError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Undoes a given-up purchase in Redis: releases its buyer in their home bucket (or hands
/// their marker and result to the live order they still hold, [`GiveUp::standing`]), puts its
/// unit back into its origin bucket (once, see [`crate::ledger`]), and reopens the product
/// (bumps its generation, lowers the sold-out flag). Each step is safe to repeat, so a
/// caller that failed half-way simply runs it again.
///
/// The restock and the reopen cannot be one script: the bucket's keys and the product's
/// state have different hash tags, so that one product's buckets spread over a Redis
/// Cluster. Between the two calls a unit can be back on sale under a raised flag; an error
/// after the restock was sent says so ([`GiveBackError::reopen_owed`]), and a run again
/// finds the unit handled (the returns hash) and still reopens.
pub async fn give_back(
    redis: &Redis,
    keys: &RedisKeys,
    g: &GiveUp<'_>,
) -> Result<Restocked, GiveBackError> {
    let id = g.product_id;
    let home = home_bucket(g.user_id, g.buckets);
    let mut conn = redis.get().await.map_err(GiveBackError::before_restock)?;
    let _: i64 = scripts()
        .release
        .key(keys.buyers(id, home))
        .key(keys.results(id, home))
        .key(keys.stock(id, home))
        .key(keys.released(id, home))
        .arg(g.user_id)
        .arg(g.event_id)
        .arg(g.result)
        .arg(g.order_id.map(|o| o.to_string()).unwrap_or_default())
        .arg(UNLOADED_RETURNS_TTL_MS)
        .arg(g.standing.map(|s| loaded(s.request_id)).unwrap_or_default())
        .arg(
            g.standing
                .map(|s| {
                    PurchaseResult::Success {
                        order_id: s.order_id,
                    }
                    .encode()
                })
                .unwrap_or_default(),
        )
        .invoke_async(&mut conn)
        .await
        .map_err(GiveBackError::before_restock)?;
    seckill_http::failpoint!(
        "compensation::after_release",
        Err(GiveBackError::before_restock(redis_lost()))
    );
    if !g.restock {
        return Ok(Restocked::NotRestocked);
    }
    let origin = g.origin.filter(|&b| b < g.buckets).unwrap_or(home);
    let outcome: i64 = scripts()
        .restock
        .key(keys.stock(id, origin))
        .key(keys.returns(id, origin))
        .arg(g.event_id)
        .arg(g.version.unwrap_or(i64::MAX))
        .arg(UNLOADED_RETURNS_TTL_MS)
        .invoke_async(&mut conn)
        .await
        .map_err(GiveBackError::reopen_owed)?;
    seckill_http::failpoint!(
        "compensation::after_restock",
        Err(GiveBackError::reopen_owed(redis_lost()))
    );
    // Units are on sale again: a sweep that started before must not raise the sold-out flag
    // over them (sold_out.lua compares the generation), and a raised flag comes
    // down. Done even when the unit was handled before, in case that run died right here.
    let _: i64 = scripts()
        .reopen
        .key(keys.product_state(id))
        .arg(keys.reopened_channel())
        .arg(id)
        .invoke_async(&mut conn)
        .await
        .map_err(GiveBackError::reopen_owed)?;
    Ok(match outcome {
        1 => Restocked::Returned,
        2 => Restocked::Deferred,
        3 => Restocked::CountedByLoad,
        _ => Restocked::AlreadyReturned,
    })
}

struct Scripts {
    release: Script,
    restock: Script,
    reopen: Script,
}

fn scripts() -> &'static Scripts {
    static SCRIPTS: std::sync::OnceLock<Scripts> = std::sync::OnceLock::new();
    SCRIPTS.get_or_init(|| Scripts {
        release: Script::new(include_str!("release.lua")),
        restock: Script::new(include_str!("restock.lua")),
        reopen: Script::new(include_str!("reopen.lua")),
    })
}
