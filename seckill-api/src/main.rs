//! seckill-api binary: load settings, set up telemetry, run.

use seckill_api::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings: Settings = seckill_config::load("api")?;
    seckill_telemetry::init_tracing(
        "seckill-api",
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
