//! order-service binary: load settings, refuse public development secrets, set up telemetry,
//! run — or an operator command (see [`order_service::cli`]).

use clap::Parser;

use order_service::cli::Cli;
use order_service::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // `FAILPOINTS=name=action;…` arms failpoints for a fault drill (docs/failpoints.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let settings: Settings = seckill_config::load("order")?;
    if let Some(command) = cli.command {
        // An operator command serves nobody and signs nothing: no secret check.
        return command.run(&settings).await;
    }
    let public = settings.backend.refuse_public_secrets()?;
    seckill_telemetry::init_tracing(
        "order-service",
        &settings.backend.log_filter,
        settings.backend.log_format,
    );
    if !public.is_empty() {
        tracing::warn!(
            secrets = ?public,
            "running on public development secrets (SECKILL_ALLOW_DEV_SECRETS=true): never in production"
        );
    }
    tracing::info!(?settings, "starting");
    let app = Application::build(settings).await?;
    let stopped = app.run_until_stopped().await;
    // The last batch of spans, when they are exported.
    seckill_telemetry::shutdown_tracing().await;
    stopped
}
