//! The fault matrix's rows: what each scenario breaks, when, and for how long.

use std::time::Duration;

use seckill_testkit::{AmqpProxy, LatencyProxy, OwnBrokerCluster};
use uuid::Uuid;

use super::books::Books;
use super::forge::{self, Forgeries};
use super::stack::{Role, Services, Shape, Stores, Wiring};

/// The orders' payment window in [`Scenario::RedisStalls`]: short enough that orders of the
/// burst expire while Redis still stalls, long enough for a buyer to pay on a busy machine.
const PAYMENT_WINDOW: Duration = Duration::from_secs(12);
/// One `CLIENT PAUSE` of [`Scenario::RedisStalls`]: past the services' 2 s command timeout.
const STALL: Duration = Duration::from_millis(2500);
/// How long [`Scenario::RedisStalls`] keeps pausing Redis.
const STALLING_FOR: Duration = Duration::from_secs(15);
/// How long [`Scenario::ConfirmLost`]'s proxy keeps the publisher's connection silent after
/// it swallowed a confirm, before it severs it: past seckill-api's 1 s publish timeout
/// (`SECKILL_API_PUBLISH_TIMEOUT_MS`), so the batch's handlers give up on the confirm.
pub const CONFIRM_SILENCE: Duration = Duration::from_secs(3);
/// The connection [`Scenario::ConfirmLost`] loses a confirm on: seckill-api's publishing
/// workers name theirs so (`seckill-api/src/publisher.rs`); its relay's and its fence's
/// connections pass through the proxy untouched.
pub const PUBLISHER_CONNECTION: &str = "seckill-api publisher";
/// [`Scenario::KillApiMidBatch`] kills once the outbox holds this many purchases...
const IN_FLIGHT_AT_LEAST: i64 = 4;
/// ...or after this long looking (then the verdict says whether it caught any).
const IN_FLIGHT_PATIENCE: Duration = Duration::from_secs(5);
/// The confirm [`Scenario::ConfirmLost`] swallows is one of a batch: of a message (or
/// messages) carrying at least this many purchases.
const LOST_CONFIRM_PURCHASES: usize = 2;
/// Longest [`Scenario::ConfirmLost`] waits for such a confirm, then for the severance.
const CONFIRM_LOSS_PATIENCE: Duration = Duration::from_secs(20);

/// The sale a fault hits, for the faults that act on it rather than on a process.
pub struct Sale<'a> {
    /// How the services are wired (the broker, the database, the signing key).
    pub wiring: &'a Wiring,
    /// The product on sale.
    pub product_id: i64,
    /// Buyers who come after the fault: forgeries name them, so a forgery that sold in
    /// their name or locked them out shows in the verdict.
    pub later_users: Vec<i64>,
    /// The scenario's stores, read straight (the outbox at a kill).
    pub books: &'a Books,
    /// The proxy on seckill-api's AMQP connections, for the scenario that has one.
    pub amqp_proxy: Option<&'a AmqpProxy>,
}

/// What a fault left behind for the verdict.
#[derive(Debug, Default)]
pub struct Injected {
    /// Messages forged into the broker.
    pub forgeries: Forgeries,
    /// The purchases in the outbox the moment seckill-api was killed, for the scenario
    /// that counts them.
    pub in_flight: Option<Vec<Uuid>>,
}

/// One row of the fault matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// No fault: the yardstick the others are read against.
    Baseline,
    /// seckill-api killed with SIGKILL mid-burst, started again 3 s later.
    KillApi,
    /// seckill-api gathering batches (1 ms linger, up to 256 purchases a message) killed
    /// with SIGKILL mid-burst once its outbox holds a few purchases, the outbox read at once;
    /// started again 3 s later.
    KillApiMidBatch,
    /// seckill-api's publishing connection through a proxy that swallows one batch's
    /// `basic.ack` mid-burst, stays silent for 3 s, then severs the connection.
    ConfirmLost,
    /// order-service killed with SIGKILL mid-burst, started again 3 s later.
    KillOrders,
    /// The gateway killed with SIGKILL mid-burst, started again 2 s later.
    KillGateway,
    /// RabbitMQ stopped mid-burst for 30 s.
    BrokerDown,
    /// Postgres stopped mid-burst for 20 s.
    PostgresDown,
    /// Redis killed with SIGKILL mid-burst and started again from its append-only file.
    RedisRestart,
    /// Redis killed mid-burst and started again without its files: the ledger is gone.
    RedisWiped,
    /// Redis slow mid-burst: 300 ms per command for 4 s, then 2.5 s (past the services'
    /// 2 s command timeout) for 3 s.
    SlowRedis,
    /// Two replicas of each service serve the sale (gateways sharing Redis rate limits);
    /// one seckill-api and one order-service replica killed mid-burst, started again 3 s later.
    Replicas,
    /// A 3-node RabbitMQ cluster (quorum queues on every node, the order queue's leader moved
    /// off the node the services use); the leader's node killed with SIGKILL mid-burst and
    /// left down.
    BrokerNodeLoss,
    /// Redis stalling mid-burst: `CLIENT PAUSE` for 2.5 s (past the services' 2 s command
    /// timeout), again and again for 15 s, while buyers pay, cancel or let a 12 s payment
    /// window expire, so compensations run into the stalls.
    RedisStalls,
    /// Forged, unsigned and replayed order messages published into the broker mid-burst;
    /// once quiet, an operator redrives everything parked, then ignores it.
    ForgedMessages,
}

impl Scenario {
    /// Every scenario, in the order the matrix runs them.
    pub const ALL: [Scenario; 15] = [
        Scenario::Baseline,
        Scenario::KillApi,
        Scenario::KillApiMidBatch,
        Scenario::ConfirmLost,
        Scenario::KillOrders,
        Scenario::KillGateway,
        Scenario::RedisRestart,
        Scenario::RedisWiped,
        Scenario::SlowRedis,
        Scenario::RedisStalls,
        Scenario::ForgedMessages,
        Scenario::Replicas,
        Scenario::PostgresDown,
        Scenario::BrokerDown,
        Scenario::BrokerNodeLoss,
    ];

    /// The name on its line and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Baseline => "baseline",
            Scenario::KillApi => "kill-seckill-api",
            Scenario::KillApiMidBatch => "kill-seckill-api-mid-batch",
            Scenario::ConfirmLost => "rabbitmq-confirm-lost",
            Scenario::KillOrders => "kill-order-service",
            Scenario::KillGateway => "kill-gateway",
            Scenario::BrokerDown => "rabbitmq-down-30s",
            Scenario::PostgresDown => "postgres-down-20s",
            Scenario::RedisRestart => "redis-restart-aof",
            Scenario::RedisWiped => "redis-restart-empty",
            Scenario::SlowRedis => "slow-redis",
            Scenario::Replicas => "two-replicas-each",
            Scenario::BrokerNodeLoss => "rabbitmq-node-lost",
            Scenario::RedisStalls => "redis-stalls",
            Scenario::ForgedMessages => "forged-messages",
        }
    }

    /// The scenario called `name`, if any.
    pub fn named(name: &str) -> Option<Scenario> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether it belongs to the fast subset CI runs (the ones that do not wait out a long
    /// outage).
    pub fn fast(self) -> bool {
        !matches!(
            self,
            Scenario::BrokerDown | Scenario::PostgresDown | Scenario::BrokerNodeLoss
        )
    }

    /// Whether it runs on a RabbitMQ cluster of its own instead of the run's broker.
    pub fn needs_broker_cluster(self) -> bool {
        self == Scenario::BrokerNodeLoss
    }

    /// The services it runs.
    pub fn shape(self) -> Shape {
        match self {
            Scenario::Replicas => Shape {
                gateways: 2,
                apis: 2,
                orders: 2,
            },
            _ => Shape::SINGLE,
        }
    }

    /// Settings of its own for every service, before the operator's.
    pub fn service_env(self) -> Vec<(String, String)> {
        match self {
            Scenario::RedisStalls => vec![(
                "SECKILL_ORDER_PAYMENT_WINDOW_SECS".into(),
                PAYMENT_WINDOW.as_secs().to_string(),
            )],
            // Batches gathered for up to 1 ms, and big: purchases wait in memory to be
            // published when the kill lands.
            Scenario::KillApiMidBatch => vec![
                ("SECKILL_API_PUBLISH_LINGER_US".into(), "1000".into()),
                ("SECKILL_API_PUBLISH_BATCH_MAX".into(), "256".into()),
            ],
            _ => Vec::new(),
        }
    }

    /// The orders' payment window, when the scenario gives them one to expire in.
    pub fn payment_window(self) -> Option<Duration> {
        (self == Scenario::RedisStalls).then_some(PAYMENT_WINDOW)
    }

    /// Whether its buyers settle their orders (pay, cancel, let expire) as they get them.
    pub fn settles(self) -> bool {
        self == Scenario::RedisStalls
    }

    /// Whether an operator tidies the parking lot once the burst is quiet.
    pub fn operated(self) -> bool {
        self == Scenario::ForgedMessages
    }

    /// Whether the services reach Redis through a latency proxy.
    pub fn needs_proxy(self) -> bool {
        self == Scenario::SlowRedis
    }

    /// Whether seckill-api reaches RabbitMQ through an [`AmqpProxy`].
    pub fn needs_amqp_proxy(self) -> bool {
        self == Scenario::ConfirmLost
    }

    /// Breaks what the scenario breaks and puts it back; returns once the fault is over.
    pub async fn inject(
        self,
        stores: &mut Stores,
        services: &mut Services,
        proxy: Option<&LatencyProxy>,
        cluster: Option<&OwnBrokerCluster>,
        doomed_node: usize,
        sale: &Sale<'_>,
    ) -> anyhow::Result<Injected> {
        let sleep = |secs: u64| tokio::time::sleep(Duration::from_secs(secs));
        let mut injected = Injected::default();
        match self {
            Scenario::Baseline => {}
            Scenario::KillApi | Scenario::KillOrders | Scenario::KillGateway => {
                let (role, down) = match self {
                    Scenario::KillApi => (Role::Api, 3),
                    Scenario::KillOrders => (Role::Orders, 3),
                    _ => (Role::Gateway, 2),
                };
                services.kill(role, 0).await?;
                sleep(down).await;
                services.restart(role, 0).await?;
            }
            Scenario::KillApiMidBatch => {
                // The kill lands while purchases are in flight: once the outbox holds a few
                // (the moment the burst reached its trigger may fall between two batches).
                // Entries live a linger and a confirm at least, longer than this look takes.
                let looking = std::time::Instant::now();
                while looking.elapsed() < IN_FLIGHT_PATIENCE
                    && sale.books.outbox_len(sale.product_id).await? < IN_FLIGHT_AT_LEAST
                {
                }
                services.kill(Role::Api, 0).await?;
                // Nobody deletes an outbox entry while seckill-api is down: what is there
                // now is what it had in flight (taken, not yet confirmed and deleted).
                injected.in_flight = Some(sale.books.outbox_request_ids(sale.product_id).await?);
                sleep(3).await;
                services.restart(Role::Api, 0).await?;
            }
            Scenario::ConfirmLost => {
                let proxy = sale
                    .amqp_proxy
                    .ok_or_else(|| anyhow::anyhow!("rabbitmq-confirm-lost needs its proxy"))?;
                proxy.lose_next_confirm(LOST_CONFIRM_PURCHASES);
                // Whether it happened is the verdict's to say (from the proxy's report).
                proxy
                    .wait_severed(CONFIRM_LOSS_PATIENCE + CONFIRM_SILENCE)
                    .await;
            }
            Scenario::Replicas => {
                services.kill(Role::Api, 1).await?;
                services.kill(Role::Orders, 0).await?;
                sleep(3).await;
                services.restart(Role::Api, 1).await?;
                services.restart(Role::Orders, 0).await?;
            }
            Scenario::BrokerDown => {
                stores.broker.stop().await;
                sleep(30).await;
                stores.broker.restart().await;
            }
            Scenario::PostgresDown => {
                stores.postgres.stop().await;
                sleep(20).await;
                stores.postgres.restart().await;
            }
            // Both wait for the new server's PING on this thread: fine for a runtime with
            // others to run the burst meanwhile.
            Scenario::RedisRestart => {
                tokio::task::block_in_place(|| stores.redis.kill_and_restart());
            }
            Scenario::RedisWiped => {
                tokio::task::block_in_place(|| stores.redis.wipe_and_restart());
            }
            Scenario::BrokerNodeLoss => {
                let cluster = cluster
                    .ok_or_else(|| anyhow::anyhow!("rabbitmq-node-lost needs its cluster"))?;
                cluster.node(doomed_node).kill().await;
            }
            Scenario::SlowRedis => {
                let proxy = proxy.ok_or_else(|| anyhow::anyhow!("slow-redis needs its proxy"))?;
                proxy.set_delay(Duration::from_millis(300));
                sleep(4).await;
                proxy.set_delay(Duration::from_millis(2500));
                sleep(3).await;
                proxy.set_delay(Duration::ZERO);
            }
            Scenario::RedisStalls => {
                let redis = redis::Client::open(stores.redis.url())?;
                let mut connection = redis.get_multiplexed_async_connection().await?;
                let began = std::time::Instant::now();
                while began.elapsed() < STALLING_FOR {
                    redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(STALL.as_millis() as u64)
                        .arg("ALL")
                        .query_async::<()>(&mut connection)
                        .await?;
                    // Half a second of service between two stalls.
                    tokio::time::sleep(STALL + Duration::from_millis(500)).await;
                }
            }
            Scenario::ForgedMessages => {
                injected.forgeries =
                    forge::publish(sale.wiring, sale.product_id, &sale.later_users).await?;
            }
        }
        Ok(injected)
    }
}
