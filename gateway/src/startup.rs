//! Building and running the gateway.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::error_handling::HandleErrorLayer;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceBuilder;

use seckill_auth::{IdentitySigner, JwtVerifier};
use seckill_http::ops::{self, Probe};

use crate::Settings;
use crate::proxy::{self, ProxyState, UpstreamClient, Upstreams};

/// A built, not yet running, gateway.
#[derive(Debug)]
pub struct Application {
    listener: TcpListener,
    port: u16,
    router: Router,
    cancel: CancellationToken,
}

impl Application {
    /// Builds the proxy state and binds the port. Upstreams need not be up yet.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        let client: UpstreamClient = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(1024)
            .build(connector);
        let state = ProxyState {
            verifier: JwtVerifier::hs256(settings.jwt_secret.expose(), settings.jwt_leeway_secs),
            signer: IdentitySigner::new(settings.internal_key.expose(), 30_000),
            seckill_api: Arc::new(Upstreams::new(
                "seckill-api",
                settings.seckill_api_upstreams(),
            )),
            order_service: Arc::new(Upstreams::new(
                "order-service",
                settings.order_service_upstreams(),
            )),
            client,
            max_body_bytes: settings.max_body_bytes,
        };
        let probes = readiness_probes(&state);

        // Outermost first: errors of the two layers below become JSON → shed when full
        // (never queue) → bound in-flight requests → per-request deadline.
        let overload = ServiceBuilder::new()
            .layer(HandleErrorLayer::new(proxy::handle_overload))
            .load_shed()
            .concurrency_limit(settings.max_in_flight)
            .timeout(Duration::from_millis(settings.request_timeout_ms));
        let router = ops::router(probes)
            .fallback(proxy::forward)
            .with_state(state)
            .layer(overload);
        let router = seckill_http::layers::instrument(router, "gateway");

        let listener = TcpListener::bind((settings.host.as_str(), settings.port))
            .await
            .with_context(|| format!("bind {}:{}", settings.host, settings.port))?;
        let port = listener.local_addr()?.port();
        Ok(Self {
            listener,
            port,
            router,
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

    /// Serves until SIGINT/SIGTERM or the shutdown token, letting in-flight requests finish.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        tracing::info!(port = self.port, "gateway listening");
        seckill_http::shutdown::serve(self.listener, self.router, self.cancel)
            .await
            .context("serve http")?;
        tracing::info!("gateway stopped");
        Ok(())
    }
}

/// Ready when one replica of each upstream answers `/healthz`.
fn readiness_probes(state: &ProxyState) -> Vec<(&'static str, Probe)> {
    let probe = |base: String, client: UpstreamClient| -> Probe {
        Arc::new(move || {
            let url = format!("{base}/healthz");
            let client = client.clone();
            Box::pin(async move {
                let uri = url.parse().map_err(|e| format!("{e}"))?;
                let response = client.get(uri).await.map_err(|e| e.to_string())?;
                if response.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("answered {}", response.status()))
                }
            })
        })
    };
    vec![
        (
            "seckill-api",
            probe(state.seckill_api.first().to_string(), state.client.clone()),
        ),
        (
            "order-service",
            probe(
                state.order_service.first().to_string(),
                state.client.clone(),
            ),
        ),
    ]
}
