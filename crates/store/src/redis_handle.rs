//! One Redis handle for a single server or a Redis Cluster.
//!
//! Every script and command of the platform touches keys of one hash slot, so the same code
//! runs on both: a single server through a few multiplexed, self-reconnecting connections
//! (redis-rs' `ConnectionManager`), a cluster through redis-rs' cluster client, which routes
//! each command by its keys and follows `MOVED`/`ASK`. Multiplexed rather than pooled: a
//! pool checks each connection out with a `PING` and hands it back with an `UNWATCH`, two
//! round trips for every command, which measured as most of a purchase's Redis time. All
//! connections open lazily on first use, so a service can start before Redis is reachable.
//! The one command that blocks its connection, `WAIT`, runs on a pooled connection of its
//! own instead ([`Redis::dedicated`], [`dedicated`]).
//!
//! [`is_unavailable`] tells a Redis that cannot serve right now from a command, a script or
//! an answer that is wrong.

pub mod dedicated;

use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use dedicated::DedicatedConn;

/// Command and connect timeout. redis-rs defaults to 500 ms, short enough that a Redis pause
/// during a burst would turn already-executed purchase scripts into client errors.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Where Redis is: one server, or the seed nodes of a cluster.
#[derive(Clone)]
pub enum Redis {
    /// A single server behind a few multiplexed connections.
    Single(Arc<LazySingle>),
    /// A Redis Cluster.
    Cluster(std::sync::Arc<LazyCluster>),
}

/// Multiplexed connections to one server, each opened on first use, used in turn.
pub struct LazySingle {
    pub(crate) client: redis::Client,
    connections: Vec<OnceCell<ConnectionManager>>,
    next: AtomicUsize,
}

/// A cluster client whose (multiplexed) connection opens on first use.
pub struct LazyCluster {
    client: ClusterClient,
    /// The seed nodes' URLs, for the dedicated connections ([`dedicated`]).
    pub(crate) seeds: Vec<String>,
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
    /// otherwise one server's URL over `connections` multiplexed connections (1–8, each
    /// carrying any number of concurrent commands). Never blocks on Redis.
    pub fn new(url: &str, cluster: bool, connections: usize) -> anyhow::Result<Self> {
        if cluster {
            let seeds: Vec<String> = url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            anyhow::ensure!(!seeds.is_empty(), "no Redis Cluster seed nodes configured");
            let client = ClusterClient::builder(seeds.clone())
                .connection_timeout(TIMEOUT)
                .response_timeout(TIMEOUT)
                .build()?;
            return Ok(Self::Cluster(std::sync::Arc::new(LazyCluster {
                client,
                seeds,
                connection: OnceCell::new(),
            })));
        }
        let connections = (0..connections.clamp(1, 8))
            .map(|_| OnceCell::new())
            .collect();
        Ok(Self::Single(Arc::new(LazySingle {
            client: redis::Client::open(url)?,
            connections,
            next: AtomicUsize::new(0),
        })))
    }

    /// Whether this is a cluster handle.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// A connection: a clone of a multiplexed one (cheap; drop it whenever).
    pub async fn get(&self) -> Result<RedisConn, RedisError> {
        match self {
            Self::Single(single) => {
                let index = single.next.fetch_add(1, Ordering::Relaxed) % single.connections.len();
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(TIMEOUT))
                    .set_response_timeout(Some(TIMEOUT));
                let connection = single.connections[index]
                    .get_or_try_init(|| {
                        ConnectionManager::new_with_config(single.client.clone(), config)
                    })
                    .await?;
                Ok(RedisConn::Single(connection.clone()))
            }
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

/// A connection from [`Redis::get`] (or a dedicated one, from
/// [`Dedicated::get`](dedicated::Dedicated::get)); use it like any redis-rs async
/// connection.
pub enum RedisConn {
    /// Multiplexed single-server connection.
    Single(ConnectionManager),
    /// Cluster connection (routes by key).
    Cluster(ClusterConnection),
    /// A pooled connection of one caller's alone.
    Dedicated(DedicatedConn),
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
            Self::Dedicated(c) => c.req_packed_command(cmd),
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
            Self::Dedicated(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
            Self::Dedicated(c) => c.get_db(),
        }
    }
}

/// How many copies of a write to wait for once it is done (`WAIT` / `WAITAOF`), and how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitFor {
    /// Replicas that must have the write.
    pub replicas: u32,
    /// Whether the server's own append-only file must have it fsynced (`WAITAOF`, Redis 7.2+).
    pub local_aof: bool,
    /// Longest wait; the write stands either way.
    pub timeout: Duration,
}

impl WaitFor {
    /// The command: `WAITAOF 1 <replicas> <ms>` when the local AOF counts, else
    /// `WAIT <replicas> <ms>`.
    pub(crate) fn command(&self) -> Cmd {
        let millis = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        if self.local_aof {
            let mut cmd = redis::cmd("WAITAOF");
            cmd.arg(1).arg(self.replicas).arg(millis);
            cmd
        } else {
            let mut cmd = redis::cmd("WAIT");
            cmd.arg(self.replicas).arg(millis);
            cmd
        }
    }

    /// Whether the reply says every copy asked for is there.
    fn satisfied_by(&self, reply: &Value) -> RedisResult<bool> {
        use redis::FromRedisValue;
        if self.local_aof {
            let (local, replicas) = <(i64, i64)>::from_redis_value_ref(reply)?;
            Ok(local >= 1 && replicas >= i64::from(self.replicas))
        } else {
            Ok(i64::from_redis_value_ref(reply)? >= i64::from(self.replicas))
        }
    }
}

impl RedisConn {
    /// Waits until the writes this connection made so far (the script just run on `key`, at
    /// least) have the copies `wait` asks for, or its timeout passed; `Ok(false)` when they
    /// do not. `WAIT` counts a connection's own writes, so it runs on this connection (on a
    /// cluster, on the master of `key`'s slot, which executed them). On a multiplexed
    /// connection it holds back every command sent behind it until it returns: a purchase
    /// waits on a dedicated one.
    pub async fn wait_for(&mut self, key: &str, wait: WaitFor) -> RedisResult<bool> {
        let cmd = wait.command();
        let reply = match self {
            Self::Single(c) => c.req_packed_command(&cmd).await?,
            Self::Cluster(c) => {
                use redis::cluster_routing::{
                    Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
                };
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await?
            }
            Self::Dedicated(c) => c.wait(key, wait).await?,
        };
        wait.satisfied_by(&reply)
    }
}

/// Whether `e` says Redis cannot serve right now, rather than that the command, the script
/// or its answer is wrong: refused, reset, timed out or dropped; a cluster without a
/// connection to the slot's node, without a master for it, or moving it; a server still
/// loading its data or demoted to a replica; a script running past its time limit; a Redis
/// out of memory. The same command may succeed once it is back.
pub fn is_unavailable(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    match e.kind() {
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        ),
        ErrorKind::Extension => matches!(e.code(), Some("BUSY" | "OOM")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    //! The classification of the errors redis-rs gives, the server's built from the reply
    //! Redis would send.

    use std::io::ErrorKind;

    use super::*;

    /// The error Redis answers with `line` (an error reply without its `-` and `CRLF`).
    fn replied(line: &str) -> RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .expect("an error reply parses");
        value.extract_error().expect_err("an error reply")
    }

    #[test]
    fn a_redis_that_cannot_be_reached_or_cannot_serve_is_unavailable() {
        let unavailable = [
            RedisError::from(std::io::Error::from(ErrorKind::ConnectionRefused)),
            RedisError::from(std::io::Error::from(ErrorKind::ConnectionReset)),
            RedisError::from(std::io::Error::from(ErrorKind::TimedOut)),
            RedisError::from((redis::ErrorKind::ClusterConnectionNotFound, "no node")),
            replied("LOADING Redis is loading the dataset in memory"),
            replied("TRYAGAIN Multiple keys request during rehashing of slot"),
            replied("CLUSTERDOWN The cluster is down"),
            replied("MASTERDOWN Link with MASTER is down"),
            replied("READONLY You can't write against a read only replica."),
            replied("MOVED 3999 127.0.0.1:6381"),
            replied("ASK 3999 127.0.0.1:6381"),
            replied("BUSY Redis is busy running a script."),
            replied("OOM command not allowed when used memory > 'maxmemory'."),
        ];
        for e in unavailable {
            assert!(is_unavailable(&e), "{e}");
        }
    }

    #[test]
    fn a_command_script_or_answer_that_is_wrong_is_not_unavailable() {
        let wrong = [
            replied("ERR broken invariant"),
            replied("WRONGTYPE Operation against a key holding the wrong kind of value"),
            replied("NOSCRIPT No matching script."),
            replied("CROSSSLOT Keys in request don't hash to the same slot"),
            replied("NOPERM this user has no permissions to run the 'eval' command"),
            RedisError::from((redis::ErrorKind::UnexpectedReturnType, "not an integer")),
            RedisError::from((redis::ErrorKind::Parse, "bad reply")),
        ];
        for e in wrong {
            assert!(!is_unavailable(&e), "{e}");
        }
    }
}
