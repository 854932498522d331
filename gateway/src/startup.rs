//! Building and running the gateway.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use seckill_auth::IdentitySigner;
use seckill_http::ops::{self, Probe};
use seckill_http1::{ConnectionLimits, HeadLimits, Outgoing};

use crate::Settings;
use crate::auth::{self, Authenticator};
use crate::in_flight::{InFlight, Purchases};
use crate::pipeline::Pipeline;
use crate::proxy::upstream::Replica;
use crate::proxy::{PoolSettings, ProxyState, Service, Upstreams};
use crate::ratelimit::RateLimits;
use crate::room::Rooms;
use crate::serve;
use crate::sold_out::SoldOutEdge;

/// A built, not yet running, gateway.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    /// The operator listener (`/metrics`, the detailed `/readyz`), apart from the public port.
    admin: TcpListener,
    admin_addr: std::net::SocketAddr,
    admin_router: axum::Router,
    pipeline: Arc<Pipeline>,
    cancel: CancellationToken,
    limits: ConnectionLimits,
    workers: std::num::NonZeroUsize,
}

impl Application {
    /// Builds the proxy state and binds the port. Upstreams need not be up yet.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // Installed before any handle is taken (the authenticator's, the sold-out edge's): a
        // handle taken with no recorder counts into nothing for good.
        let _ = seckill_telemetry::metrics_handle();
        let pool = PoolSettings {
            connect_timeout: settings.upstream_connect_timeout,
            idle_timeout: settings.upstream_idle_timeout,
            ..PoolSettings::default()
        };
        let trusted_proxies = Arc::new(settings.trusted_proxy_list().map_err(anyhow::Error::msg)?);
        let eject_for = settings.upstream_eject;
        let resolve_names = !settings.upstream_resolve_interval.is_zero();
        let resolver = settings.resolver().map_err(anyhow::Error::msg)?;
        let state = ProxyState {
            seckill_api_signer: IdentitySigner::new(
                settings.service_key(Service::SeckillApi).expose(),
                Service::SeckillApi.name(),
            ),
            order_service_signer: IdentitySigner::new(
                settings.service_key(Service::OrderService).expose(),
                Service::OrderService.name(),
            ),
            seckill_api: Arc::new(Upstreams::with_names(
                "seckill-api",
                settings.seckill_api_urls.clone(),
                eject_for,
                pool,
                resolve_names,
            )),
            order_service: Arc::new(Upstreams::with_names(
                "order-service",
                settings.order_service_urls.clone(),
                eject_for,
                pool,
                resolve_names,
            )),
            upstream_timeout: settings.upstream_request_timeout,
            trusted_proxies: trusted_proxies.clone(),
        };
        let probes = readiness_probes(&state);
        let cancel = CancellationToken::new();
        let rate_limits = RateLimits::build(&settings).await?;
        let housekeeping = rate_limits.clone();
        let pipeline = Arc::new(Pipeline {
            ops: crate::ops::public_router(),
            auth: Authenticator::new(auth::verifier(&settings)?, settings.jwt_cache_entries),
            trusted_proxies,
            rate_limits,
            proxy: state,
            in_flight: InFlight::new(settings.max_in_flight),
            purchases: Purchases::new(settings.max_purchases_per_user),
            request_timeout: settings.request_timeout,
            sold_out: Arc::new(SoldOutEdge::new(settings.sold_out_ttl)),
            rooms: Arc::new(Rooms::new(
                settings.room_key(),
                seckill_store::Redis::new(settings.redis_url.expose(), settings.redis_cluster, 2)
                    .context("redis_url (the waiting rooms' Redis)")?,
                &settings.namespace,
                settings.room_settings(),
            )),
        });

        let listener = TcpListener::bind((settings.host.as_str(), settings.port))
            .await
            .with_context(|| format!("bind {}:{}", settings.host, settings.port))?;
        let port = listener.local_addr()?.port();
        let admin = TcpListener::bind((settings.admin_host.as_str(), settings.admin_port))
            .await
            .with_context(|| {
                format!("bind admin {}:{}", settings.admin_host, settings.admin_port)
            })?;
        let admin_addr = admin.local_addr()?;
        // Only now: a build that failed leaves no task behind.
        housekeeping.spawn_housekeeping(cancel.clone());
        tokio::spawn(pipeline.rooms.clone().run(cancel.clone()));
        if pipeline.sold_out.enabled() {
            tokio::spawn(crate::sold_out::follow(
                pipeline.sold_out.clone(),
                seckill_store::reopened::urls(settings.redis_url.expose(), settings.redis_cluster),
                seckill_store::RedisKeys::new(&settings.namespace).reopened_channel(),
                cancel.clone(),
            ));
        }
        for upstreams in [&pipeline.proxy.seckill_api, &pipeline.proxy.order_service] {
            upstreams
                .start_resolver(
                    resolver.clone(),
                    settings.upstream_resolve_interval,
                    cancel.clone(),
                )
                .await;
        }
        Ok(Self {
            listener,
            port,
            admin,
            admin_addr,
            admin_router: seckill_http::layers::instrument(
                ops::router("gateway", probes),
                "gateway",
            ),
            pipeline,
            cancel,
            limits: ConnectionLimits {
                head: HeadLimits {
                    max_header_bytes: settings.max_header_bytes,
                    max_headers: settings.max_headers,
                },
                header_timeout: settings.client_header_timeout,
                idle_timeout: settings.client_idle_timeout,
                max_body_bytes: settings.max_body_bytes,
                first_byte_timeout: settings.client_first_byte_timeout,
                max_connections: settings.max_connections,
                max_connections_per_ip: settings.max_connections_per_ip,
            },
            workers: settings.worker_threads(),
        })
    }

    /// The bound port (useful with port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The bound operator port (useful with `admin_port` 0).
    pub fn admin_port(&self) -> u16 {
        self.admin_addr.port()
    }

    /// The operator listener's bound address (loopback unless `admin_host` says otherwise).
    pub fn admin_addr(&self) -> std::net::SocketAddr {
        self.admin_addr
    }

    /// A token that stops the application when cancelled (tests; signals do the same).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Serves until SIGINT/SIGTERM or the shutdown token, letting in-flight requests finish.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        tracing::info!(
            port = self.port,
            admin = %self.admin_addr,
            "gateway listening"
        );
        // Stops with the public server: `serve` cancels the token on its way out. A failure
        // is logged when it happens; the public port keeps serving without it.
        let (admin, admin_router, cancel) = (self.admin, self.admin_router, self.cancel.clone());
        let admin = tokio::spawn(async move {
            if let Err(e) = crate::ops::serve_admin(admin, admin_router, cancel).await {
                tracing::error!(error = %e, "operator listener failed");
            }
        });
        serve::serve(
            self.listener,
            self.pipeline,
            self.cancel,
            self.limits,
            self.workers,
        )
        .await
        .context("serve http")?;
        let _ = admin.await;
        tracing::info!("gateway stopped");
        Ok(())
    }
}

/// Ready when one replica of each upstream answers `/healthz` (tried in rotation order: one
/// hung replica behind a name does not make the gateway unready while another serves).
fn readiness_probes(state: &ProxyState) -> Vec<(&'static str, Probe)> {
    let probe = |upstreams: Arc<Upstreams>| -> Probe {
        Arc::new(move || {
            let upstreams = upstreams.clone();
            Box::pin(async move {
                let mut last = String::from("no replica");
                for replica in upstreams.all().iter() {
                    match probe_replica(replica).await {
                        Ok(()) => return Ok(()),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            })
        })
    };
    vec![
        ("seckill-api", probe(state.seckill_api.clone())),
        ("order-service", probe(state.order_service.clone())),
    ]
}

/// One replica's `/healthz`.
async fn probe_replica(replica: &Replica) -> Result<(), String> {
    let pool = replica.pool();
    let request = format!("GET /healthz HTTP/1.1\r\nhost: {}\r\n\r\n", pool.host());
    let response = pool
        .exchange(Outgoing::new(request.as_bytes()))
        .await
        .map_err(|e| e.to_string())?;
    if response.status.is_success() {
        Ok(())
    } else {
        Err(format!("answered {}", response.status))
    }
}

/// How the binary starts: the steps every service shares (`seckill_service::main`).
impl seckill_service::Service for Settings {
    const NAME: &'static str = "gateway";
    const PREFIX: &'static str = "gateway";
    // Connections are served on worker threads of their own (`serve`); the runtime only
    // accepts and keeps house.
    const RUNTIME: seckill_service::Runtime = seckill_service::Runtime::CurrentThread;

    fn logging(&self) -> (&str, seckill_config::LogFormat) {
        (&self.log_filter, self.log_format)
    }

    fn refuse_public_secrets(&self) -> Result<Vec<&str>, seckill_config::ConfigError> {
        Settings::refuse_public_secrets(self)
    }

    async fn run(self) -> anyhow::Result<()> {
        Application::build(self).await?.run_until_stopped().await
    }
}
