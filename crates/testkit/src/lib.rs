//! Test support shared by the services' integration tests.
//!
//! Every test gets a [`TestNamespace`]: its own Postgres database (`seckill_t_<id>`), Redis
//! key prefix and AMQP names (`t_<id>`), on the real local servers. Tests run in parallel
//! without seeing each other, and [`TestNamespace::cleanup`] removes everything afterwards
//! (`scripts/test.sh` also sweeps leftovers of crashed runs).
//!
//! Servers default to the local ones; `SECKILL_TEST_POSTGRES`, `SECKILL_TEST_REDIS` and
//! `SECKILL_TEST_AMQP` point elsewhere. `SECKILL_TEST_REDIS_CLUSTER` (comma-separated seed
//! URLs, as `scripts/redis-cluster.sh url` prints) runs the same tests on a Redis Cluster.

pub mod amqp_proxy;
pub mod broker;
pub mod broker_cluster;
pub mod dns;
pub mod latency_proxy;
mod orphans;
pub mod own_postgres;
pub mod own_redis;
pub mod ports;
pub mod process;

pub use amqp_proxy::{AmqpProxy, ConfirmReport};
pub use broker::OwnBroker;
pub use broker_cluster::OwnBrokerCluster;
pub use latency_proxy::LatencyProxy;
pub use own_postgres::OwnPostgres;
pub use own_redis::{OwnRedis, Persistence};
pub use ports::{free_port, free_ports};

use std::future::Future;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

use seckill_auth::{IdentitySigner, RequestFacts};
use seckill_config::{BackendSettings, Secret};
use seckill_messaging::Topology;
use seckill_store::RedisKeys;

/// The internal key tests sign identities with.
pub const INTERNAL_KEY: &str = "test-internal-key";
/// The JWT secret tests mint tokens with.
pub const JWT_SECRET: &str = "test-jwt-secret-0123456789";

/// One test's private slice of Postgres, Redis and RabbitMQ.
#[derive(Debug, Clone)]
pub struct TestNamespace {
    /// `t_<id>`: the Redis prefix and AMQP name prefix.
    pub namespace: String,
    /// A database URL naming `seckill_t_<id>` (created by the service under test).
    pub database_url: String,
    /// Redis URL (with `redis_cluster`, the cluster's comma-separated seed URLs).
    pub redis_url: String,
    /// Whether Redis is a cluster.
    pub redis_cluster: bool,
    /// RabbitMQ URL.
    pub amqp_url: String,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

impl TestNamespace {
    /// A fresh namespace; nothing is created until a service starts in it.
    pub fn new() -> Self {
        seckill_telemetry::init_test_tracing();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let id = &id[..12];
        let postgres = env_or(
            "SECKILL_TEST_POSTGRES",
            "postgres://postgres:postgres@127.0.0.1:5432",
        );
        let cluster = std::env::var("SECKILL_TEST_REDIS_CLUSTER")
            .ok()
            .filter(|seeds| !seeds.trim().is_empty());
        Self {
            namespace: format!("t_{id}"),
            database_url: format!("{postgres}/seckill_t_{id}"),
            redis_cluster: cluster.is_some(),
            redis_url: cluster
                .unwrap_or_else(|| env_or("SECKILL_TEST_REDIS", "redis://127.0.0.1:6379")),
            amqp_url: env_or("SECKILL_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672/%2f"),
        }
    }

    /// Backend settings pointing at this namespace, on loopback, with the test identity key.
    pub fn backend_settings(&self) -> BackendSettings {
        BackendSettings {
            host: "127.0.0.1".into(),
            database_url: Secret::new(&self.database_url),
            redis_url: Secret::new(&self.redis_url),
            redis_cluster: self.redis_cluster,
            amqp_url: Secret::new(&self.amqp_url),
            namespace: self.namespace.clone(),
            internal_key: Secret::new(INTERNAL_KEY),
            startup_patience: std::time::Duration::from_secs(10),
            ..BackendSettings::default()
        }
    }

    /// Key names of this namespace.
    pub fn keys(&self) -> RedisKeys {
        RedisKeys::new(&self.namespace)
    }

    /// AMQP names of this namespace.
    pub fn topology(&self) -> Topology {
        Topology::new(&self.namespace)
    }

    /// A pool on this namespace's database (after a service created it).
    pub async fn db(&self) -> sqlx::PgPool {
        sqlx::PgPool::connect(&self.database_url)
            .await
            .expect("connect to the test database")
    }

    /// A Redis connection (a cluster one when testing on a cluster).
    pub async fn redis(&self) -> seckill_store::RedisConn {
        seckill_store::Redis::new(&self.redis_url, self.redis_cluster, 1)
            .expect("redis url")
            .get()
            .await
            .expect("connect to redis")
    }

    /// An AMQP channel with this namespace's topology declared.
    pub async fn channel(&self) -> (lapin::Connection, lapin::Channel) {
        let connection =
            seckill_messaging::connect(&self.amqp_url, "test", Duration::from_secs(10))
                .await
                .expect("connect to rabbitmq");
        let channel = connection.create_channel().await.expect("channel");
        // Confirm mode, so a test's publish is in its queue once it is confirmed: without
        // it a "confirm" resolves at once and a queue can look drained while messages are
        // still on their way to it.
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .expect("confirm mode");
        self.topology().declare(&channel).await.expect("declare");
        (connection, channel)
    }

    /// Messages ready in `queue` (not counting unacked ones).
    pub async fn queue_depth(&self, channel: &lapin::Channel, queue: &str) -> u32 {
        passive_declare(channel, queue).await.message_count()
    }

    /// Consumers the broker counts on `queue`. A consumer whose connection died is removed
    /// in the same step that requeues its unacknowledged deliveries, so 0 here means they
    /// are back in the queue (and in [`Self::queue_depth`]).
    pub async fn queue_consumers(&self, channel: &lapin::Channel, queue: &str) -> u32 {
        passive_declare(channel, queue).await.consumer_count()
    }

    /// Drops the database, deletes the Redis keys and the AMQP objects.
    pub async fn cleanup(self) {
        let _ = seckill_store::postgres::drop_database(&self.database_url).await;
        let mut redis = self.redis().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(self.keys().pattern())
            .query_async(&mut redis)
            .await
            .unwrap_or_default();
        // One key per DEL: on a cluster the keys live in many slots.
        for key in keys {
            let _: redis::RedisResult<()> =
                redis::cmd("DEL").arg(&key).query_async(&mut redis).await;
        }
        let (connection, channel) = self.channel().await;
        let _ = self.topology().delete(&channel).await;
        let _ = connection.close(200, "test done".into()).await;
    }
}

/// Counts the purchases that reach a queue by taking them out of it: each look takes every
/// message ready (acked as it is taken) and adds the purchases it carries, a batch message
/// (group commit) one per part. For tests that only ask how many purchases were published.
pub struct TakenPurchases {
    _connection: lapin::Connection,
    channel: lapin::Channel,
    queue: String,
    taken: std::sync::Mutex<Vec<seckill_messaging::batch::Part>>,
}

impl TakenPurchases {
    /// Takes from `ns`'s order queue.
    pub async fn from(ns: &TestNamespace) -> Self {
        let (connection, channel) = ns.channel().await;
        Self {
            _connection: connection,
            channel,
            queue: ns.topology().queue,
            taken: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Takes what is ready now; returns how many purchases were taken so far in all.
    pub async fn count(&self) -> usize {
        while let Some(message) = self
            .channel
            .basic_get(
                self.queue.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .expect("basic_get")
        {
            let delivery = message.delivery;
            let parts = seckill_messaging::batch::messages(&delivery.data, &delivery.properties)
                .expect("a readable order message");
            self.lock().extend(parts);
        }
        self.lock().len()
    }

    /// The purchases taken so far, each as the single-order message it stands for.
    pub fn taken(&self) -> Vec<seckill_messaging::batch::Part> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<seckill_messaging::batch::Part>> {
        self.taken
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for TestNamespace {
    fn default() -> Self {
        Self::new()
    }
}

/// Signs `request` for `service` (`seckill-api`, `order-service`) as the gateway would for
/// `user_id` with `roles`: a new `x-request-id` unless it has one, then the identity bound
/// to its method, path and query, request id and body.
pub fn sign_request(request: &mut reqwest::Request, service: &str, user_id: i64, roles: &[&str]) {
    if !request.headers().contains_key("x-request-id") {
        let id = uuid::Uuid::new_v4().to_string();
        let value = HeaderValue::from_str(&id).expect("a uuid is a header value");
        request.headers_mut().insert("x-request-id", value);
    }
    let target = match request.url().query() {
        Some(query) => format!("{}?{query}", request.url().path()),
        None => request.url().path().to_string(),
    };
    let request_id = request.headers()["x-request-id"]
        .to_str()
        .expect("a text request id")
        .to_string();
    let body = request
        .body()
        .and_then(|b| b.as_bytes())
        .unwrap_or_default()
        .to_vec();
    let facts = RequestFacts {
        method: request.method().as_str(),
        target: &target,
        request_id: &request_id,
        body: &body,
    };
    let roles: Vec<String> = roles.iter().map(|r| r.to_string()).collect();
    let mut headers = HeaderMap::new();
    IdentitySigner::new(INTERNAL_KEY, service).sign_into(&mut headers, user_id, &roles, &facts);
    request.headers_mut().extend(headers);
}

/// Sends a request with the identity the gateway would sign ([`sign_request`]).
pub trait SendAs {
    /// Sends it to `service` as `user_id` with `roles`.
    fn send_as(
        self,
        service: &str,
        user_id: i64,
        roles: &[&str],
    ) -> impl Future<Output = reqwest::Result<reqwest::Response>> + Send;
}

impl SendAs for reqwest::RequestBuilder {
    async fn send_as(
        self,
        service: &str,
        user_id: i64,
        roles: &[&str],
    ) -> reqwest::Result<reqwest::Response> {
        let (client, request) = self.build_split();
        let mut request = request?;
        sign_request(&mut request, service, user_id, roles);
        client.execute(request).await
    }
}

/// `queue` as the broker counts it now (a passive declare: it must exist).
async fn passive_declare(channel: &lapin::Channel, queue: &str) -> lapin::Queue {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("passive declare")
}

/// Polls `check` every 50 ms until it returns `Some`, failing the test after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Accepts every connection to `listener` and serves each on a task of its own, until the
/// returned task is aborted: the connection tasks live in its set, so they end with it (the
/// test proxies' acceptor).
pub(crate) fn accept_each<F, Fut>(
    listener: tokio::net::TcpListener,
    serve: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((client, _)) = listener.accept().await {
            connections.spawn(serve(client));
            while connections.try_join_next().is_some() {}
        }
    })
}
