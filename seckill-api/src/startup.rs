//! Building and running seckill-api: connections, the HTTP server, the outbox relay and
//! the other background tasks (the waiting rooms' sync among them), all under one
//! cancellation token.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use seckill_auth::IdentityVerifier;
use seckill_http::ops::{self, Probe};
use seckill_messaging::{OrderSigner, Topology};
use seckill_store::{RedisKeys, probes};

use crate::Settings;
use crate::bloom::{BloomSizing, ProductBloom};
use crate::catalog::Catalog;
use crate::catalog_sync::CatalogSync;
use crate::http::{AppState, Shared};
use crate::idempotency::Idempotency;
use crate::null_cache::NullCache;
use crate::publisher::OrderPublisher;
use crate::relay::{OutboxAge, Relay, RelayHints};
use crate::room::{RoomSetup, RoomSync};
use crate::sold_out::SoldOutMemory;
use crate::stock::fence::Fence;
use crate::stock::{StockEngine, Timings};

/// A built, not yet running, seckill-api.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    router: axum::Router,
    relay: Relay,
    outbox_age: OutboxAge,
    publisher: Option<OrderPublisher>,
    catalog_sync: CatalogSync,
    /// Writes the waiting rooms' set-up into Redis.
    room_sync: RoomSync,
    /// Lowers the local sold-out flags when units go back on sale.
    reopened: Reopened,
    cancel: CancellationToken,
}

/// Where units going back on sale are announced, and the local memory that must hear it.
#[derive(Debug)]
struct Reopened {
    urls: Vec<String>,
    channel: String,
    memory: SoldOutMemory,
}

impl Application {
    /// Connects to Postgres (waiting while it comes up, then migrating), prepares the
    /// Redis pool and binds the port. RabbitMQ is not needed to start: the relay connects
    /// in the background and `/readyz` reports it.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let patience = settings.backend.startup_patience;
        let db = seckill_store::postgres::connect_and_migrate(
            settings.backend.database_url.expose(),
            settings.db_pool_size,
            patience,
        )
        .await?;
        let redis = seckill_store::Redis::new(
            settings.backend.redis_url.expose(),
            settings.backend.redis_cluster,
            settings.redis_pool_size,
        )?;
        check_redis_durability(&settings).await?;
        let keys = RedisKeys::new(&settings.backend.namespace);
        let relay_hints = Arc::new(RelayHints::default());
        let broker_connected = Arc::new(AtomicBool::new(false));
        let publisher_connected = Arc::new(AtomicBool::new(false));
        let topology = Topology::new(&settings.backend.namespace)
            .with_queue_type(settings.backend.amqp_queue_type);
        let signer = OrderSigner::new(settings.backend.order_signing_key.expose());
        let publisher = settings.publish_on_accept.then(|| {
            OrderPublisher::new(
                settings.backend.amqp_url.expose().to_string(),
                topology.clone(),
                signer.clone(),
                db.clone(),
                redis.clone(),
                crate::publisher::PublishOptions {
                    timeout: settings.publish_timeout,
                    channels: settings.publish_channels,
                    batch_max: settings.publish_batch_max,
                    linger: Duration::from_micros(settings.publish_linger_us),
                },
                publisher_connected.clone(),
            )
        });

        let sold_out = SoldOutMemory::new(settings.sold_out_local_ttl);
        let rooms = RoomSetup::new(redis.clone(), keys.clone());
        let state = AppState::new(Shared {
            catalog: Catalog::new(
                db.clone(),
                Arc::new(ProductBloom::new(BloomSizing {
                    expected: settings.bloom_expected_products,
                    fp_rate: settings.bloom_fp_rate,
                })?),
                NullCache::new(redis.clone(), keys.clone(), settings.null_cache_ttl),
                settings.product_cache_ttl,
            ),
            stock: StockEngine::new(
                redis.clone(),
                db.clone(),
                keys.clone(),
                Timings {
                    lock_ttl: settings.load_lock_ttl,
                    load_wait: settings.load_wait,
                    sweep_fence: settings.sweep_fence,
                    skew_margin: settings.sweep_skew_margin,
                },
            )
            .with_fence(Fence::new(
                settings.backend.amqp_url.expose(),
                &settings.backend.namespace,
                db.clone(),
                settings.publish_timeout,
                settings.copy_wait(),
            ))
            .with_wait(settings.redis_wait(), settings.redis_wait_connections)?,
            idempotency: Idempotency::new(redis.clone(), keys.clone()),
            rooms: rooms.clone(),
            redis: redis.clone(),
            keys: keys.clone(),
            identity: IdentityVerifier::new(
                settings.backend.internal_key.expose(),
                "seckill-api",
                settings.backend.identity_window,
            ),
            sold_out: sold_out.clone(),
            relay_hints: relay_hints.clone(),
            publisher: publisher.clone(),
            default_buckets: settings.stock_buckets,
        });
        let (room_sync, room_changes) =
            RoomSync::new(state.catalog.clone(), rooms, settings.room_sync);
        // Fills the bloom filter before the port is bound: an empty one would answer 404 to
        // every product.
        let catalog_sync = CatalogSync::start(
            settings.backend.database_url.expose(),
            state.catalog.clone(),
            state.stock.clone(),
            room_changes,
        )
        .await?;
        let mut probes = readiness_probes(db.clone(), redis.clone(), broker_connected.clone());
        if publisher.is_some() {
            probes.push((
                "rabbitmq_publisher",
                ops::flag_probe(publisher_connected, "handlers' publisher not connected"),
            ));
        }
        let router = seckill_http::layers::instrument(
            crate::http::router(state).merge(ops::router("seckill-api", probes)),
            "seckill-api",
        );

        let listener = TcpListener::bind((settings.backend.host.as_str(), settings.port))
            .await
            .with_context(|| format!("bind {}:{}", settings.backend.host, settings.port))?;
        let port = listener.local_addr()?.port();
        let relay = Relay {
            redis,
            keys,
            amqp_url: settings.backend.amqp_url.expose().to_string(),
            topology,
            signer,
            db: db.clone(),
            batch: settings.relay_batch,
            batch_max: settings.publish_batch_max,
            reclaim_idle: settings.relay_reclaim_idle,
            hints: relay_hints,
            connected: broker_connected,
            consumer: format!("api-{}", uuid::Uuid::new_v4().simple()),
            handlers_publish: publisher.is_some(),
            scan_every: crate::relay::SCAN_EVERY,
            consumer_idle: crate::relay::CONSUMER_IDLE,
            work: Arc::default(),
        };
        let outbox_age = OutboxAge {
            redis: relay.redis.clone(),
            keys: relay.keys.clone(),
            replica: relay.consumer.clone(),
            every: relay.scan_every,
        };
        crate::metrics::describe(&outbox_age.replica);
        let reopened = Reopened {
            urls: seckill_store::reopened::urls(
                settings.backend.redis_url.expose(),
                settings.backend.redis_cluster,
            ),
            channel: relay.keys.reopened_channel(),
            memory: sold_out,
        };
        Ok(Self {
            listener,
            port,
            router,
            relay,
            outbox_age,
            publisher,
            catalog_sync,
            room_sync,
            reopened,
            cancel: CancellationToken::new(),
        })
    }

    /// The bound port (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A token that stops the application when cancelled (tests; signals do the same).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Serves until SIGINT/SIGTERM or the shutdown token: stops accepting, lets in-flight
    /// requests finish, then lets the relay finish its batch (unconfirmed entries stay in
    /// the outbox for the next start).
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let cancel = self.cancel.clone();
        let relay = tokio::spawn(self.relay.run(cancel.clone()));
        // Only reads: stopped with the token, nothing to finish.
        tokio::spawn(self.outbox_age.run(cancel.clone()));
        tokio::spawn(self.reopened.memory.follow(
            self.reopened.urls,
            self.reopened.channel,
            cancel.clone(),
        ));
        // The publisher's connection closes with the token; handlers that still publish fall
        // back to the outbox, which the next start's relay drains.
        if let Some(publisher) = self.publisher {
            tokio::spawn(publisher.run(cancel.clone()));
        }
        // Only idempotent writes: stopped with the token, nothing to finish.
        tokio::spawn(self.room_sync.run(cancel.clone()));
        let catalog_sync = tokio::spawn(self.catalog_sync.run(cancel.clone()));
        tracing::info!(port = self.port, "seckill-api listening");
        let served = seckill_http::shutdown::serve(self.listener, self.router, cancel).await;
        match tokio::time::timeout(Duration::from_secs(10), relay).await {
            Ok(Ok(Ok(()))) => tracing::info!("relay finished"),
            Ok(Ok(Err(e))) => tracing::error!(error = format!("{e:#}"), "relay failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "relay panicked"),
            Err(_) => {
                tracing::warn!("relay did not stop within 10s; pending entries stay in the outbox")
            }
        }
        match tokio::time::timeout(Duration::from_secs(5), catalog_sync).await {
            Ok(Ok(Ok(()))) => tracing::info!("product change listener finished"),
            Ok(Ok(Err(e))) => {
                tracing::error!(error = format!("{e:#}"), "product change listener failed")
            }
            Ok(Err(e)) => tracing::error!(error = %e, "product change listener panicked"),
            Err(_) => tracing::warn!("product change listener did not stop within 5s"),
        }
        served.context("serve http")
    }
}

/// Warns about (or, with `require_durable_redis`, refuses) a Redis that could lose an
/// acknowledged write: the stock ledger, the buyers' markers and the outbox live there.
async fn check_redis_durability(settings: &Settings) -> anyhow::Result<()> {
    let url = settings.backend.redis_url.expose();
    let patience = settings.backend.startup_patience;
    let check = || probes::redis_durability(url, settings.backend.redis_cluster);
    // Required, the check waits for Redis like the rest of start-up; else one try is enough
    // (a Redis still coming up is warned about, and start-up goes on).
    let checked = if settings.require_durable_redis {
        check
            .retry(
                ExponentialBuilder::default()
                    .with_max_delay(Duration::from_secs(3))
                    .with_total_delay(Some(patience))
                    .without_max_times(),
            )
            .await
    } else {
        check().await
    };
    let found = match checked {
        Ok(found) => found,
        Err(e) if settings.require_durable_redis => {
            anyhow::bail!(
                "SECKILL_API_REQUIRE_DURABLE_REDIS is on, and Redis' persistence could not \
                 be checked (CONFIG GET): {e:#}"
            )
        }
        Err(e) => {
            tracing::warn!(
                error = format!("{e:#}"),
                "could not check redis persistence"
            );
            return Ok(());
        }
    };
    for warning in &found.warnings {
        tracing::warn!(finding = %warning, "redis durability");
    }
    metrics::gauge!("seckill_redis_lossy_settings").set(found.lossy.len() as f64);
    if found.lossy.is_empty() {
        return Ok(());
    }
    if settings.require_durable_redis {
        anyhow::bail!(
            "refusing to start: Redis could lose acknowledged writes ({}); fix Redis, or set \
             SECKILL_API_REQUIRE_DURABLE_REDIS=false to accept that",
            found.lossy.join("; ")
        );
    }
    for lossy in &found.lossy {
        tracing::warn!(
            finding = %lossy,
            "REDIS CAN LOSE ACKNOWLEDGED WRITES: a restart or an eviction forgets sold units \
             and buyers (SECKILL_API_REQUIRE_DURABLE_REDIS=true refuses to start like this)"
        );
    }
    Ok(())
}

fn readiness_probes(
    db: PgPool,
    redis: seckill_store::Redis,
    broker: Arc<AtomicBool>,
) -> Vec<(&'static str, Probe)> {
    vec![
        ("postgres", probes::postgres(db)),
        ("redis", probes::redis(redis)),
        ("rabbitmq", ops::flag_probe(broker, "relay not connected")),
    ]
}

/// How the binary starts: the steps every service shares (`seckill_service::main`).
impl seckill_service::Service for Settings {
    const NAME: &'static str = "seckill-api";
    const PREFIX: &'static str = "api";
    const RUNTIME: seckill_service::Runtime = seckill_service::Runtime::MultiThread;

    fn logging(&self) -> (&str, seckill_config::LogFormat) {
        (&self.backend.log_filter, self.backend.log_format)
    }

    fn refuse_public_secrets(&self) -> Result<Vec<&str>, seckill_config::ConfigError> {
        self.backend.refuse_public_secrets()
    }

    async fn run(self) -> anyhow::Result<()> {
        Application::build(self).await?.run_until_stopped().await
    }
}
