//! `/readyz` probes for the stores every service uses.

use std::sync::Arc;

use seckill_http::ops::Probe;

/// Passes when Postgres answers `SELECT 1`.
pub fn postgres(db: sqlx::PgPool) -> Probe {
    Arc::new(move || {
        let db = db.clone();
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(&db)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}

/// Passes when Redis answers `PING`.
pub fn redis(redis: crate::Redis) -> Probe {
    Arc::new(move || {
        let redis = redis.clone();
        Box::pin(async move {
            let mut conn = redis.get().await.map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}

/// Settings of a Redis server under which it could lose an acknowledged write, one
/// sentence each (empty: none found). A Redis Cluster is asked node by node (every seed).
///
/// Lossy: `appendonly no` (a restart comes back with the last snapshot, or nothing) and any
/// `maxmemory-policy` but `noeviction` (stock keys can be evicted mid-sale). Worth a
/// warning but not lossy on a process crash: `appendfsync` other than `always` (an OS crash
/// or power loss loses what was not yet fsynced, up to a second with `everysec`).
pub async fn redis_durability(url: &str, cluster: bool) -> anyhow::Result<Durability> {
    let nodes: Vec<&str> = if cluster {
        url.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .collect()
    } else {
        vec![url]
    };
    let mut durability = Durability::default();
    for node in nodes {
        let client = redis::Client::open(node)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let mut get = async |name: &str| -> anyhow::Result<String> {
            let pair: Vec<String> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(&mut conn)
                .await?;
            Ok(pair.get(1).cloned().unwrap_or_default())
        };
        let (aof, fsync, policy) = (
            get("appendonly").await?,
            get("appendfsync").await?,
            get("maxmemory-policy").await?,
        );
        let at = redacted(node);
        if aof != "yes" {
            durability.lossy.push(format!(
                "{at}: appendonly is {aof:?}: a restart loses every write since the last snapshot"
            ));
        }
        if policy != "noeviction" {
            durability.lossy.push(format!(
                "{at}: maxmemory-policy is {policy:?}: stock keys can be evicted mid-sale"
            ));
        }
        if aof == "yes" && fsync != "always" {
            durability.warnings.push(format!(
                "{at}: appendfsync is {fsync:?}: an OS crash can lose the writes not yet fsynced"
            ));
        }
    }
    Ok(durability)
}

/// What [`redis_durability`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Durability {
    /// Settings under which an acknowledged write can be lost.
    pub lossy: Vec<String>,
    /// Settings that lose writes only if the machine itself fails.
    pub warnings: Vec<String>,
}

/// A Redis URL without its password, for messages.
fn redacted(url: &str) -> String {
    match url.split_once('@') {
        Some((scheme_user, host)) => {
            let scheme = scheme_user.split("://").next().unwrap_or("redis");
            format!("{scheme}://***@{host}")
        }
        None => url.to_string(),
    }
}
