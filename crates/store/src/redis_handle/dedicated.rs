//! Dedicated connections, pooled, for the one command that blocks the connection it runs on:
//! `WAIT` / `WAITAOF`.
//!
//! The multiplexed connections of [`Redis`] carry every command of every request over a few
//! sockets, and Redis answers a socket's commands in order: a `WAIT` of up to its timeout
//! holds back whatever was sent behind it. So a purchase that waits for copies of its write
//! runs its script and its `WAIT` on a connection of its own, checked out of this pool
//! (deadpool-redis): `WAIT` counts the writes of the connection it runs on, so both must
//! share it. Checking one out costs a round trip (deadpool-redis' `PING` on recycle), which
//! is why the hot path without a wait stays multiplexed.
//!
//! Nothing else blocks: the relay's `XREADGROUP` has no `BLOCK`, and the load lock is a
//! `SET NX PX` that answers at once.

use std::time::Duration;

use deadpool_redis::{Runtime, cluster};
use redis::aio::ConnectionLike;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisError, RedisFuture, Value};

use super::{Redis, RedisConn, WaitFor};

/// How long a purchase waits for a free dedicated connection before it gives up.
pub const CHECKOUT_WAIT: Duration = Duration::from_secs(2);

/// Slack on top of the wait's own timeout before a command on a dedicated connection counts
/// as lost (connect, too).
const SLACK: Duration = Duration::from_secs(2);

/// A pool of dedicated connections to the Redis of a [`Redis`] handle.
#[derive(Clone)]
pub struct Dedicated {
    pool: Pool,
    /// Longest any one command may take (cluster: enforced here; single: by the client).
    bound: Duration,
}

#[derive(Clone)]
enum Pool {
    Single(deadpool_redis::Pool),
    Cluster(cluster::Pool),
}

impl std::fmt::Debug for Dedicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = match &self.pool {
            Pool::Single(p) => p.status(),
            Pool::Cluster(p) => p.status(),
        };
        f.debug_struct("Dedicated")
            .field("max_size", &status.max_size)
            .field("bound", &self.bound)
            .finish()
    }
}

/// Why no dedicated connection was handed out.
#[derive(Debug)]
pub enum CheckoutError {
    /// Every connection stayed busy for [`CHECKOUT_WAIT`].
    Busy,
    /// Redis could not be reached (or refused the connection).
    Redis(RedisError),
}

impl std::fmt::Display for CheckoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy => write!(
                f,
                "no dedicated Redis connection came free within {} ms",
                CHECKOUT_WAIT.as_millis()
            ),
            Self::Redis(e) => write!(f, "opening a dedicated Redis connection: {e}"),
        }
    }
}

impl std::error::Error for CheckoutError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Busy => None,
            Self::Redis(e) => Some(e),
        }
    }
}

impl From<deadpool_redis::PoolError> for CheckoutError {
    fn from(e: deadpool_redis::PoolError) -> Self {
        use deadpool_redis::{PoolError, TimeoutType};
        match e {
            PoolError::Timeout(TimeoutType::Wait) => Self::Busy,
            PoolError::Backend(e) => Self::Redis(e),
            other => Self::Redis(RedisError::from(std::io::Error::other(other.to_string()))),
        }
    }
}

impl Redis {
    /// A pool of up to `connections` dedicated connections to this handle's Redis (on a
    /// cluster, each a cluster connection of its own), for commands that block up to
    /// `blocking` (a `WAIT`'s timeout): each command may take that and 2 s more before it
    /// counts as lost. Opens nothing until the first checkout.
    pub fn dedicated(&self, connections: usize, blocking: Duration) -> anyhow::Result<Dedicated> {
        let bound = blocking + SLACK;
        let pool = match self {
            Self::Single(single) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(SLACK))
                    .set_response_timeout(Some(bound));
                let manager = deadpool_redis::Manager::new_with_config(
                    single.client.get_connection_info().clone(),
                    config,
                )?;
                Pool::Single(
                    deadpool_redis::Pool::builder(manager)
                        .max_size(connections)
                        .wait_timeout(Some(CHECKOUT_WAIT))
                        .runtime(Runtime::Tokio1)
                        .build()?,
                )
            }
            Self::Cluster(lazy) => {
                let manager = cluster::Manager::new(lazy.seeds.clone(), false)?;
                Pool::Cluster(
                    cluster::Pool::builder(manager)
                        .max_size(connections)
                        .wait_timeout(Some(CHECKOUT_WAIT))
                        .create_timeout(Some(bound))
                        .recycle_timeout(Some(SLACK))
                        .runtime(Runtime::Tokio1)
                        .build()?,
                )
            }
        };
        Ok(Dedicated { pool, bound })
    }
}

impl Dedicated {
    /// A connection of the caller's alone until dropped (then it goes back to the pool),
    /// waiting up to [`CHECKOUT_WAIT`] for one to come free.
    pub async fn get(&self) -> Result<RedisConn, CheckoutError> {
        let conn = match &self.pool {
            Pool::Single(pool) => DedicatedConn::Single(pool.get().await?),
            Pool::Cluster(pool) => DedicatedConn::Cluster(pool.get().await?, self.bound),
        };
        Ok(RedisConn::Dedicated(conn))
    }
}

/// A pooled connection that carries one request's commands only (see the module docs).
pub enum DedicatedConn {
    /// To a single server (its client bounds each command).
    Single(deadpool_redis::Connection),
    /// A cluster connection of its own, and the bound on each command.
    Cluster(cluster::Connection, Duration),
}

/// Runs `command` within `bound`, or fails as timed out.
fn bounded<'a, T: Send + 'a>(bound: Duration, command: RedisFuture<'a, T>) -> RedisFuture<'a, T> {
    Box::pin(async move {
        tokio::time::timeout(bound, command)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
    })
}

impl ConnectionLike for DedicatedConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c, bound) => bounded(*bound, c.req_packed_command(cmd)),
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
            Self::Cluster(c, bound) => {
                bounded(*bound, c.req_packed_commands(pipeline, offset, count))
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c, _) => c.get_db(),
        }
    }
}

impl DedicatedConn {
    /// `wait`'s command on this connection; on a cluster, on the master of `key`'s slot.
    pub(crate) async fn wait(&mut self, key: &str, wait: WaitFor) -> Result<Value, RedisError> {
        let cmd = wait.command();
        match self {
            Self::Single(c) => c.req_packed_command(&cmd).await,
            Self::Cluster(c, bound) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let routed = c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                );
                bounded(*bound, Box::pin(routed)).await
            }
        }
    }
}
