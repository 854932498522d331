//! One Redis handle for a single server or a Redis Cluster.
//!
//! Every script and command of the platform touches keys of one hash slot, so the same code
//! runs on both: a single server through a connection pool, a cluster through redis-rs'
//! cluster client, which routes each command by its keys and follows `MOVED`/`ASK`. The
//! cluster connection is multiplexed and opened lazily on first use, so a service can start
//! before Redis is reachable, as it can with the pool.

use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::OnceCell;

/// Command and connect timeout. redis-rs defaults to 500 ms, short enough that a Redis pause
/// during a burst would turn already-executed purchase scripts into client errors.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Where Redis is: one server, or the seed nodes of a cluster.
#[derive(Clone)]
pub enum Redis {
    /// A single server behind a pool.
    Single(deadpool_redis::Pool),
    /// A Redis Cluster.
    Cluster(std::sync::Arc<LazyCluster>),
}

/// A cluster client whose (multiplexed) connection opens on first use.
pub struct LazyCluster {
    client: ClusterClient,
    connection: OnceCell<ClusterConnection>,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Single(_) => f.write_str("Redis::Single"),
            Self::Cluster(_) => f.write_str("Redis::Cluster"),
        }
    }
}

impl Redis {
    /// A handle on `url`. With `cluster`, `url` is a comma-separated list of seed node URLs;
    /// otherwise one server's URL, pooled up to `pool_size` connections. Never blocks on Redis.
    pub fn new(url: &str, cluster: bool, pool_size: usize) -> anyhow::Result<Self> {
        if cluster {
            let seeds: Vec<&str> = url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            anyhow::ensure!(!seeds.is_empty(), "no Redis Cluster seed nodes configured");
            let client = ClusterClient::builder(seeds)
                .connection_timeout(TIMEOUT)
                .response_timeout(TIMEOUT)
                .build()?;
            return Ok(Self::Cluster(std::sync::Arc::new(LazyCluster {
                client,
                connection: OnceCell::new(),
            })));
        }
        let connection = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT));
        let manager = deadpool_redis::Manager::new_with_config(url, connection)?;
        let pool = deadpool_redis::Pool::builder(manager)
            .max_size(pool_size)
            .wait_timeout(Some(TIMEOUT))
            .create_timeout(Some(TIMEOUT))
            .recycle_timeout(Some(TIMEOUT))
            .runtime(deadpool_redis::Runtime::Tokio1)
            .build()?;
        Ok(Self::Single(pool))
    }

    /// Whether this is a cluster handle.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// A connection: one from the pool, or a clone of the cluster's multiplexed one. Hand a
    /// pooled one back (drop it) before waiting on anything else.
    pub async fn get(&self) -> Result<RedisConn, RedisError> {
        match self {
            Self::Single(pool) => pool
                .get()
                .await
                .map(RedisConn::Single)
                .map_err(|e| match e {
                    deadpool_redis::PoolError::Backend(e) => e,
                    other => RedisError::from((ErrorKind::Io, "redis pool", other.to_string())),
                }),
            Self::Cluster(cluster) => {
                let connection = cluster
                    .connection
                    .get_or_try_init(|| cluster.client.get_async_connection())
                    .await?;
                Ok(RedisConn::Cluster(connection.clone()))
            }
        }
    }
}

/// A connection from [`Redis::get`]; use it like any redis-rs async connection.
pub enum RedisConn {
    /// Pooled single-server connection.
    Single(deadpool_redis::Connection),
    /// Cluster connection (routes by key).
    Cluster(ClusterConnection),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}
