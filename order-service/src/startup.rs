//! Building and running order-service: the HTTP server and the consumer under one token.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use seckill_auth::IdentityVerifier;
use seckill_http::ops::{self, Probe};
use seckill_messaging::{OrderSigner, Topology};
use seckill_store::{RedisKeys, probes};

use crate::Settings;
use crate::breaker::CircuitBreaker;
use crate::compensation::Compensator;
use crate::consumer::OrderConsumer;
use crate::http::{self, AppState};
use crate::parking::Redriver;
use crate::queue_watch::QueueWatch;
use crate::recorder::Recorder;
use crate::retry::{RetryBudget, RetryPolicy};

/// A built, not yet running, order-service.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    router: axum::Router,
    consumer: OrderConsumer,
    recorder: Recorder,
    compensator: Compensator,
    queue_watch: QueueWatch,
    mode_poll: Duration,
    cancel: CancellationToken,
}

impl Application {
    /// Connects to Postgres (waiting while it comes up, then migrating) and binds the port.
    /// The consumer connects to RabbitMQ in the background; `/readyz` reports it.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let db = seckill_store::postgres::connect_and_migrate(
            settings.backend.database_url.expose(),
            settings.db_pool_size,
            settings.backend.startup_patience,
        )
        .await?;
        let redis = seckill_store::Redis::new(
            settings.backend.redis_url.expose(),
            settings.backend.redis_cluster,
            settings.redis_pool_size,
        )?;
        let connected = Arc::new(AtomicBool::new(false));
        let keys = RedisKeys::new(&settings.backend.namespace);
        let breaker = Arc::new(CircuitBreaker::new(settings.breaker()));
        let state = AppState {
            breaker: breaker.clone(),
            redis: redis.clone(),
            keys: keys.clone(),
            db: db.clone(),
            identity: IdentityVerifier::new(
                settings.backend.internal_key.expose(),
                "order-service",
                settings.backend.identity_window,
            ),
            redriver: Arc::new(redriver(&settings)),
        };
        let probes = readiness_probes(db.clone(), redis.clone(), connected.clone());
        let router = http::router(state, probes);
        let listener = TcpListener::bind((settings.backend.host.as_str(), settings.port))
            .await
            .with_context(|| format!("bind {}:{}", settings.backend.host, settings.port))?;
        let port = listener.local_addr()?.port();
        let consumer = OrderConsumer {
            db,
            redis,
            keys,
            buckets: moka::future::Cache::new(100_000),
            amqp_url: settings.backend.amqp_url.expose().to_string(),
            topology: topology(&settings),
            signer: OrderSigner::new(settings.backend.order_signing_key.expose())
                .accepting_previous(settings.backend.order_signing_key_previous.expose())
                .accepting_unsigned(settings.accept_unsigned),
            prefetch: settings.prefetch,
            batch_size: settings.batch_size,
            batch_linger: settings.batch_linger,
            requeue_delay: settings.requeue_delay,
            retry: Arc::new(RetryPolicy::new(
                settings.retry_tiers_ms(),
                settings.max_attempts,
                RetryBudget::new(
                    settings.retry_budget_ratio,
                    settings.retry_budget_min_per_sec,
                ),
            )),
            write: crate::orders::WriteOptions {
                lock_timeout: settings.lock_timeout,
                payment_window: settings.payment_window(),
            },
            breaker,
            connected,
        };
        let recorder = Recorder {
            db: consumer.db.clone(),
            amqp_url: consumer.amqp_url.clone(),
            topology: consumer.topology.clone(),
            signer: consumer.signer.clone(),
            quarantine_after: settings.quarantine_after_redrives,
            retry_delay: consumer.requeue_delay,
        };
        let queue_watch = QueueWatch {
            amqp_url: consumer.amqp_url.clone(),
            topology: consumer.topology.clone(),
            every: settings.queue_watch,
        };
        crate::metrics::describe(&consumer.topology);
        crate::breaker::register_transition_counters();
        let compensator = Compensator {
            db: consumer.db.clone(),
            redis: consumer.redis.clone(),
            keys: consumer.keys.clone(),
            poll: settings.compensation_poll,
            batch: 100,
        };
        Ok(Self {
            listener,
            port,
            router,
            consumer,
            recorder,
            compensator,
            queue_watch,
            mode_poll: settings.breaker_mode_poll,
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

    /// Serves and consumes until SIGINT/SIGTERM or the shutdown token; then stops taking
    /// deliveries, finishes and acks the ones in hand, and closes the channel.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let cancel = self.cancel.clone();
        // The operator's forced mode, shared by every replica through Redis.
        tokio::spawn(self.consumer.breaker.clone().follow_mode(
            self.consumer.redis.clone(),
            self.consumer.keys.breaker_forced(),
            self.mode_poll,
            cancel.clone(),
        ));
        let consumer = tokio::spawn(self.consumer.run(cancel.clone()));
        let recorder = tokio::spawn(self.recorder.run(cancel.clone()));
        let compensator = tokio::spawn(self.compensator.run(cancel.clone()));
        // Only reads: stopped with the token, nothing to finish.
        tokio::spawn(self.queue_watch.run(cancel.clone()));
        tracing::info!(port = self.port, "order-service listening");
        let served = seckill_http::shutdown::serve(self.listener, self.router, cancel).await;
        match tokio::time::timeout(Duration::from_secs(15), consumer).await {
            Ok(Ok(Ok(()))) => tracing::info!("consumer finished"),
            Ok(Ok(Err(e))) => tracing::error!(error = format!("{e:#}"), "consumer failed"),
            Ok(Err(e)) => tracing::error!(error = %e, "consumer panicked"),
            Err(_) => tracing::warn!(
                "consumer did not stop within 15s; unacked messages will be redelivered"
            ),
        }
        // Both stop at their next await once cancelled; a row in flight stays uncommitted
        // (its dead letter unacked, its compensation unclaimed) and is redone later.
        let _ = tokio::time::timeout(Duration::from_secs(5), recorder).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), compensator).await;
        served.context("serve http")
    }
}

/// The AMQP names and queue arguments this service declares and uses.
fn topology(settings: &Settings) -> Topology {
    Topology::new(&settings.backend.namespace)
        .with_retry_tiers(settings.retry_tiers_ms())
        .with_queue_type(settings.backend.amqp_queue_type)
}

/// The redrive publisher and its pace, from the settings (shared by the admin API and the CLI).
pub fn redriver(settings: &Settings) -> Redriver {
    Redriver::new(
        settings.backend.amqp_url.expose().to_string(),
        topology(settings),
        settings.redrive_per_sec,
        settings.redrive_burst,
    )
}

fn readiness_probes(
    db: PgPool,
    redis: seckill_store::Redis,
    consumer: Arc<AtomicBool>,
) -> Vec<(&'static str, Probe)> {
    vec![
        ("postgres", probes::postgres(db)),
        ("redis", probes::redis(redis)),
        (
            "rabbitmq",
            ops::flag_probe(consumer, "consumer not connected"),
        ),
    ]
}

/// How the binary starts: the steps every service shares (`seckill_service::main`).
impl seckill_service::Service for Settings {
    const NAME: &'static str = "order-service";
    const PREFIX: &'static str = "order";
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
