//! order-service binary: load settings, set up telemetry, run.

use order_service::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings: Settings = seckill_config::load("order")?;
    seckill_telemetry::init_tracing(
        "order-service",
        &settings.backend.log_filter,
        &settings.backend.log_format,
    );
    if settings.backend.internal_key.expose() == seckill_config::DEV_INTERNAL_KEY {
        tracing::warn!("running with the development internal key; set SECKILL_INTERNAL_KEY");
    }
    tracing::info!(?settings, "starting");
    let app = Application::build(settings).await?;
    app.run_until_stopped().await
}
