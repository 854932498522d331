//! Building and running seckill-api: connections, the HTTP server and the outbox relay,
//! all under one cancellation token.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use moka::future::Cache;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use seckill_auth::IdentitySigner;
use seckill_http::ops::{self, Probe};
use seckill_messaging::Topology;
use seckill_store::{RedisKeys, probes};

use crate::Settings;
use crate::catalog::Catalog;
use crate::idempotency::Idempotency;
use crate::relay::Relay;
use crate::state::{AppState, SOLD_OUT_FLAG_TTL};
use crate::stock::StockEngine;

/// A built, not yet running, seckill-api.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    router: axum::Router,
    relay: Relay,
    cancel: CancellationToken,
}

impl Application {
    /// Connects to Postgres (waiting while it comes up, then migrating), prepares the
    /// Redis pool and binds the port. RabbitMQ is not needed to start: the relay connects
    /// in the background and `/readyz` reports it.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let patience = Duration::from_secs(settings.backend.startup_patience_secs);
        let db = seckill_store::postgres::connect_and_migrate(
            settings.backend.database_url.expose(),
            settings.db_pool_size,
            patience,
        )
        .await?;
        let redis = seckill_store::redis_pool(
            settings.backend.redis_url.expose(),
            settings.redis_pool_size,
        )?;
        let keys = RedisKeys::new(&settings.backend.namespace);
        let relay_wakeup = Arc::new(Notify::new());
        let broker_connected = Arc::new(AtomicBool::new(false));

        let state = AppState {
            catalog: Catalog::new(
                db.clone(),
                Duration::from_secs(settings.product_cache_ttl_secs),
            ),
            stock: StockEngine::new(
                redis.clone(),
                db.clone(),
                keys.clone(),
                Duration::from_millis(settings.load_lock_ttl_ms),
                Duration::from_millis(settings.load_wait_ms),
            ),
            idempotency: Idempotency::new(redis.clone(), keys.clone()),
            redis: redis.clone(),
            keys: keys.clone(),
            signer: IdentitySigner::new(
                settings.backend.internal_key.expose(),
                settings.backend.identity_max_age_ms,
            ),
            sold_out: Cache::builder()
                .max_capacity(10_000)
                .time_to_live(SOLD_OUT_FLAG_TTL)
                .build(),
            relay_wakeup: relay_wakeup.clone(),
        };
        let probes = readiness_probes(db, redis.clone(), broker_connected.clone());
        let router = seckill_http::layers::instrument(
            crate::routes::router(state).merge(ops::router(probes)),
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
            topology: Topology::new(&settings.backend.namespace),
            batch: settings.relay_batch,
            reclaim_idle: Duration::from_millis(settings.relay_reclaim_idle_ms),
            wakeup: relay_wakeup,
            connected: broker_connected,
            consumer: format!("api-{}", uuid::Uuid::new_v4().simple()),
        };
        Ok(Self {
            listener,
            port,
            router,
            relay,
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
        served.context("serve http")
    }
}

fn readiness_probes(
    db: PgPool,
    redis: deadpool_redis::Pool,
    broker: Arc<AtomicBool>,
) -> Vec<(&'static str, Probe)> {
    vec![
        ("postgres", probes::postgres(db)),
        ("redis", probes::redis(redis)),
        ("rabbitmq", ops::flag_probe(broker, "relay not connected")),
    ]
}
