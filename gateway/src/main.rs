//! gateway binary: load settings, set up telemetry, run.

use gateway::{Application, Settings};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// Connections are served on worker threads of their own (`serve`); this runtime only accepts
// and runs housekeeping.
#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let settings: Settings = seckill_config::load("gateway")?;
    seckill_telemetry::init_tracing("gateway", &settings.log_filter, settings.log_format);
    let dev_jwt_secret = settings.jwt_algorithm == seckill_auth::JwtAlgorithm::HS256
        && settings.jwt_secret.expose() == seckill_config::DEV_JWT_SECRET;
    if dev_jwt_secret || settings.internal_key.expose() == seckill_config::DEV_INTERNAL_KEY {
        tracing::warn!(
            "running with development secrets; set SECKILL_JWT_SECRET and SECKILL_INTERNAL_KEY"
        );
    }
    tracing::info!(?settings, "starting");
    let app = Application::build(settings).await?;
    app.run_until_stopped().await
}
