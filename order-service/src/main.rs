//! order-service binary: load settings, set up telemetry, run — or an operator command
//! (see [`order_service::cli`]).

use clap::Parser;

use order_service::cli::Cli;
use order_service::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let settings: Settings = seckill_config::load("order")?;
    if let Some(command) = cli.command {
        return command.run(&settings).await;
    }
    seckill_telemetry::init_tracing(
        "order-service",
        &settings.backend.log_filter,
        settings.backend.log_format,
    );
    if settings.backend.internal_key.expose() == seckill_config::DEV_INTERNAL_KEY {
        tracing::warn!("running with the development internal key; set SECKILL_INTERNAL_KEY");
    }
    tracing::info!(?settings, "starting");
    let app = Application::build(settings).await?;
    app.run_until_stopped().await
}
