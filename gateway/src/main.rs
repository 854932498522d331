//! gateway binary: load settings, refuse public development secrets, set up telemetry, run.

use gateway::{Application, Settings};
use seckill_auth::JwtAlgorithm;
use seckill_config::{DEV_INTERNAL_KEY, DEV_JWT_SECRET, SecretCheck};

#[global_allocator]
static ALLOCATOR: seckill_alloc::MiMalloc = seckill_alloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // First, before the runtime allocates: in huge pages, mimalloc's arena is resident in
    // 2 MiB steps (`seckill_alloc::no_huge_pages`).
    seckill_alloc::no_huge_pages();
    // Connections are served on worker threads of their own (`serve`); this runtime only
    // accepts and runs housekeeping.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    let settings: Settings = seckill_config::load("gateway")?;
    let mut secrets: Vec<SecretCheck<'_>> = vec![(
        "SECKILL_INTERNAL_KEY",
        &settings.internal_key,
        DEV_INTERNAL_KEY,
    )];
    // A public-key algorithm never reads the HMAC secret, so its default is harmless there.
    if settings.jwt_algorithm == JwtAlgorithm::HS256 {
        secrets.insert(
            0,
            ("SECKILL_JWT_SECRET", &settings.jwt_secret, DEV_JWT_SECRET),
        );
    }
    let public = seckill_config::refuse_public_secrets(&secrets, settings.allow_dev_secrets)?;
    seckill_telemetry::init_tracing("gateway", &settings.log_filter, settings.log_format);
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
