//! order-service binary: load settings, set up telemetry, run.
//!
//! `order-service breaker open|closed|auto|status` instead sets (or shows) the circuit
//! breaker mode every replica follows, through the configured Redis, and exits.

use order_service::breaker::{self, Mode};
use order_service::{Application, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings: Settings = seckill_config::load("order")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(command) = args.first() {
        anyhow::ensure!(
            command == "breaker" && args.len() == 2,
            "usage: order-service [breaker open|closed|auto|status]"
        );
        return breaker_command(&settings, &args[1]).await;
    }
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

/// `breaker <mode>`: writes the mode where every replica reads it (within its poll period).
async fn breaker_command(settings: &Settings, verb: &str) -> anyhow::Result<()> {
    let redis = seckill_store::Redis::new(
        settings.backend.redis_url.expose(),
        settings.backend.redis_cluster,
        1,
    )?;
    let key = seckill_store::RedisKeys::new(&settings.backend.namespace).breaker_forced();
    let mode = match verb {
        "open" => Mode::Open,
        "closed" => Mode::Closed,
        "auto" => Mode::Auto,
        "status" => {
            let mode = breaker::read_mode(&redis, &key).await?;
            println!("{}", serde_json::json!({ "mode": mode }));
            return Ok(());
        }
        other => anyhow::bail!("unknown breaker mode {other:?}: open, closed, auto or status"),
    };
    breaker::write_mode(&redis, &key, mode).await?;
    println!("{}", serde_json::json!({ "mode": mode }));
    Ok(())
}
