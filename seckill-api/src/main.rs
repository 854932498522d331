//! seckill-api binary: load settings, refuse public development secrets, set up telemetry,
//! run.

use seckill_api::{Application, Settings};

// glibc's malloc, free and consolidation were a fifth of this process' CPU under purchase load,
// mimalloc about an eighth (docs/benchmarks.md, "accepted path"); the gateway uses it too.
#[global_allocator]
static ALLOCATOR: seckill_alloc::MiMalloc = seckill_alloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // First, before the runtime allocates: in huge pages, mimalloc's arena is resident in
    // 2 MiB steps (`seckill_alloc::no_huge_pages`).
    seckill_alloc::no_huge_pages();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

async fn run() -> anyhow::Result<()> {
    // `FAILPOINTS=name=action;…` arms failpoints for a fault drill (docs/failpoints.md).
    #[cfg(feature = "failpoints")]
    let _failpoints = fail::FailScenario::setup();
    let settings: Settings = seckill_config::load("api")?;
    let public = settings.backend.refuse_public_secrets()?;
    seckill_telemetry::init_tracing(
        "seckill-api",
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
