//! The cluster-wide backend: the same quotas, with the buckets in Redis so every gateway
//! replica charges the same ones (`gcra.lua`, one script call per request).
//!
//! When Redis cannot answer within `rate_limit_redis_timeout_ms`, or no connection is up,
//! `gateway_rate_limit_backend_errors_total` counts it and the verdict is left to
//! `rate_limit_redis_failure`: let through (open, the default: the limiter's outage does not
//! stop the platform) or refused (closed). Its Redis may be its own (`rate_limit_redis_url`),
//! so the purchase path's load cannot starve it. Requests
//! never wait for a connection to be made: a background task (re)connects, at most once per
//! [`RECONNECT_PAUSE`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisResult, Script};

use super::quota::{Decision, QuotaSpec, RateKey};
use crate::config::Settings;

/// Pause between connection attempts while Redis is unreachable.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);
/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

enum Link {
    Single(redis::Client),
    // Boxed: a cluster client is twice a single one's size (clippy::large_enum_variant).
    Cluster(Box<ClusterClient>),
}

impl Link {
    async fn connect(&self) -> RedisResult<Conn> {
        match self {
            Self::Single(client) => {
                let config =
                    AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT));
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Conn::Single)
            }
            Self::Cluster(client) => client.get_async_connection().await.map(Conn::Cluster),
        }
    }
}

/// Buckets in Redis, shared by every replica pointed at the same Redis and namespace.
pub struct RedisQuotas {
    link: Link,
    /// The live connection; `None` while (re)connecting. Multiplexed, so cloned per request.
    conn: RwLock<Option<Conn>>,
    /// Whether a (re)connect task is running or pausing.
    connecting: AtomicBool,
    script: Script,
    /// `<namespace>:ratelimit`.
    prefix: String,
    timeout: Duration,
}

impl RedisQuotas {
    /// A handle on the Redis the settings name; tries to connect for up to a second so a
    /// healthy start limits from the first request, then keeps trying in the background.
    pub async fn connect(settings: &Settings) -> anyhow::Result<Arc<Self>> {
        let url = settings
            .rate_limit_redis_url
            .as_ref()
            .unwrap_or(&settings.redis_url)
            .expose();
        let link = if settings.redis_cluster {
            let seeds = seckill_config::split_list(url);
            let client = ClusterClient::builder(seeds)
                .connection_timeout(CONNECT_TIMEOUT)
                .build()
                .context("redis cluster seeds")?;
            Link::Cluster(Box::new(client))
        } else {
            Link::Single(redis::Client::open(url).context("redis url")?)
        };
        let quotas = Arc::new(Self {
            link,
            conn: RwLock::new(None),
            connecting: AtomicBool::new(true),
            script: Script::new(include_str!("gcra.lua")),
            prefix: format!("{}:ratelimit", settings.namespace),
            timeout: settings.rate_limit_redis_timeout,
        });
        match tokio::time::timeout(CONNECT_TIMEOUT, quotas.link.connect()).await {
            Ok(Ok(conn)) => {
                *quotas.conn.write().expect("lock") = Some(conn);
                quotas.connecting.store(false, Ordering::SeqCst);
            }
            _ => {
                tracing::warn!(
                    "rate-limit Redis unreachable at start; its failure mode applies until it is"
                );
                quotas.connecting.store(false, Ordering::SeqCst);
                quotas.reconnect();
            }
        }
        Ok(quotas)
    }

    /// The key of `key`'s bucket for `spec`: hash-tagged by client, so a Redis Cluster keeps
    /// all of one client's buckets in one slot.
    fn bucket(&self, spec: &QuotaSpec, key: &RateKey) -> String {
        format!("{}:{{{key}}}:{}", self.prefix, spec.route)
    }

    /// Charges `key` one request against `spec`.
    pub async fn check(self: &Arc<Self>, spec: &QuotaSpec, key: &RateKey) -> Decision {
        let Some(conn) = self.conn.read().expect("lock").clone() else {
            self.reconnect();
            return unanswered("no connection");
        };
        let mut invocation = self.script.key(self.bucket(spec, key));
        invocation.arg(spec.interval_us()).arg(spec.burst);
        // {allowed, remaining, retry_after_us}, see gcra.lua.
        let call = async {
            let reply: RedisResult<(i64, i64, i64)> = match conn {
                Conn::Single(mut c) => invocation.invoke_async(&mut c).await,
                Conn::Cluster(mut c) => invocation.invoke_async(&mut c).await,
            };
            reply
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok((1, remaining, _))) => Decision::Allowed {
                remaining: u64::try_from(remaining).unwrap_or(0),
            },
            Ok(Ok((_, _, retry_after_us))) => Decision::Limited {
                retry_after_secs: u64::try_from(retry_after_us)
                    .unwrap_or(0)
                    .div_ceil(1_000_000)
                    .max(1),
            },
            Ok(Err(e)) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
                    tracing::warn!(error = %e, "rate-limit Redis connection lost");
                    self.conn.write().expect("lock").take();
                    self.reconnect();
                }
                tracing::debug!(error = %e, "rate-limit script failed");
                unanswered("error")
            }
            Err(_) => unanswered("timeout"),
        }
    }

    /// Starts a background (re)connect unless one is running.
    fn reconnect(self: &Arc<Self>) {
        if self.connecting.swap(true, Ordering::SeqCst) {
            return;
        }
        let quotas = self.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(CONNECT_TIMEOUT, quotas.link.connect()).await {
                Ok(Ok(conn)) => {
                    tracing::info!("rate-limit Redis connected");
                    *quotas.conn.write().expect("lock") = Some(conn);
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "rate-limit Redis connect failed");
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
                Err(_) => {
                    tracing::warn!("rate-limit Redis connect timed out");
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
            }
            quotas.connecting.store(false, Ordering::SeqCst);
        });
    }
}

/// Counts a check Redis did not answer; the caller's failure mode decides the request.
fn unanswered(why: &'static str) -> Decision {
    metrics::counter!(crate::metrics::RATE_LIMIT_BACKEND_ERRORS, "error" => why).increment(1);
    Decision::Unknown
}
