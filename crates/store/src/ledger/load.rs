//! Loading buckets and keeping their lifetimes (see [`crate::ledger`]'s "Loading"):
//! `load.lua`, `window.lua`, `extend.lua`, `unlock.lua`, and the reads around them.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{RedisResult, Script};

use super::handle::Ledger;
use crate::redis_handle::RedisConn;

static LOAD: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("load.lua")));
static WINDOW: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("window.lua")));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("extend.lua")));
static UNLOCK: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("unlock.lua")));

/// A sale's window and its keys' lifetime, as the buckets store them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// When the sale opens (unix ms).
    pub start_ms: i64,
    /// When it ends (unix ms).
    pub end_ms: i64,
    /// When the bucket's keys expire (unix ms), after the sale.
    pub expire_at_ms: i64,
}

/// What a load writes into one bucket, besides the purchases it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketLoad {
    /// Units on sale as of the snapshot (returns newer than it are added by the script).
    pub units: i64,
    /// The ledger version the snapshot read.
    pub version: i64,
    /// The sale's window.
    pub window: Window,
}

/// One purchase holding a unit, for a load: who, which purchase, and the buyer's result.
#[derive(Debug, Clone)]
pub struct HeldUnit {
    /// The buyer (homed in the bucket being loaded).
    pub user_id: i64,
    /// The purchase.
    pub request_id: String,
    /// What the buyer sees, as [`crate::PurchaseResult`] text.
    pub result: String,
}

impl Ledger {
    /// Takes the product's load lock with `token` for `ttl`; whether it was free.
    pub async fn lock_load(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        token: &str,
        ttl: Duration,
    ) -> RedisResult<bool> {
        let acquired: Option<String> = redis::cmd("SET")
            .arg(self.keys().load_lock(product_id))
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(conn)
            .await?;
        Ok(acquired.is_some())
    }

    /// Releases the product's load lock if `token` still owns it (`unlock.lua`).
    pub async fn unlock_load(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        token: &str,
    ) -> RedisResult<bool> {
        let released: i64 = UNLOCK
            .key(self.keys().load_lock(product_id))
            .arg(token)
            .invoke_async(conn)
            .await?;
        Ok(released == 1)
    }

    /// Whether every bucket of the product was loaded once (its state's `loaded`).
    pub async fn was_loaded(&self, conn: &mut RedisConn, product_id: i64) -> RedisResult<bool> {
        let loaded: Option<String> = redis::cmd("HGET")
            .arg(self.keys().product_state(product_id))
            .arg("loaded")
            .query_async(conn)
            .await?;
        Ok(loaded.is_some())
    }

    /// Notes that every bucket of the product was loaded.
    pub async fn mark_loaded(&self, conn: &mut RedisConn, product_id: i64) -> RedisResult<()> {
        redis::cmd("HSET")
            .arg(self.keys().product_state(product_id))
            .arg("loaded")
            .arg("1")
            .query_async(conn)
            .await
    }

    /// Whether `bucket` is loaded (its stock hash exists).
    pub async fn is_loaded(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
    ) -> RedisResult<bool> {
        redis::cmd("EXISTS")
            .arg(self.keys().stock(product_id, bucket))
            .query_async(conn)
            .await
    }

    /// Units `bucket` still has on sale; `None` when it is not loaded.
    pub async fn remaining(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
    ) -> RedisResult<Option<i64>> {
        redis::cmd("HGET")
            .arg(self.keys().stock(product_id, bucket))
            .arg("remaining")
            .query_async(conn)
            .await
    }

    /// Entries in `bucket`'s outbox stream.
    pub async fn outbox_len(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
    ) -> RedisResult<i64> {
        redis::cmd("XLEN")
            .arg(self.keys().outbox(product_id, bucket))
            .query_async(conn)
            .await
    }

    /// Fills `bucket` as `load` says, with the markers and results of `held` (purchases of
    /// buyers homed there, less those released since), unless it is loaded already
    /// (`load.lua`); whether it loaded.
    pub async fn load_bucket(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
        load: &BucketLoad,
        held: impl IntoIterator<Item = HeldUnit>,
    ) -> RedisResult<bool> {
        let mut invocation = LOAD.prepare_invoke();
        invocation
            .key(self.keys().stock(product_id, bucket))
            .key(self.keys().buyers(product_id, bucket))
            .key(self.keys().results(product_id, bucket))
            .key(self.keys().returns(product_id, bucket))
            .key(self.keys().released(product_id, bucket))
            .arg(load.units)
            .arg(load.window.start_ms)
            .arg(load.window.end_ms)
            .arg(load.window.expire_at_ms)
            .arg(load.version);
        for unit in held {
            invocation
                .arg(unit.user_id)
                .arg(unit.request_id)
                .arg(unit.result);
        }
        let loaded: i64 = invocation.invoke_async(conn).await?;
        Ok(loaded == 1)
    }

    /// Applies a changed window to `bucket` if it is loaded (`window.lua`); its keys'
    /// expiry only moves later. Whether it was loaded.
    pub async fn update_window(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        bucket: u16,
        window: &Window,
    ) -> RedisResult<bool> {
        let updated: i64 = WINDOW
            .key(self.keys().stock(product_id, bucket))
            .key(self.keys().buyers(product_id, bucket))
            .key(self.keys().takers(product_id, bucket))
            .key(self.keys().results(product_id, bucket))
            .key(self.keys().returns(product_id, bucket))
            .key(self.keys().released(product_id, bucket))
            .arg(window.start_ms)
            .arg(window.end_ms)
            .arg(window.expire_at_ms)
            .invoke_async(conn)
            .await?;
        Ok(updated == 1)
    }

    /// Makes the product's state hash live at least until `until_ms` (`extend.lua`).
    pub async fn extend_state(
        &self,
        conn: &mut RedisConn,
        product_id: i64,
        until_ms: i64,
    ) -> RedisResult<bool> {
        let extended: i64 = EXTEND
            .key(self.keys().product_state(product_id))
            .arg(until_ms)
            .invoke_async(conn)
            .await?;
        Ok(extended == 1)
    }
}
