//! Start-up checks of the stores: a Redis that could lose acknowledged writes.

use seckill_api::Application;
use seckill_config::Secret;
use seckill_testkit::{OwnRedis, Persistence, TestNamespace};

use crate::helpers::settings_for;

#[tokio::test]
async fn a_redis_that_can_lose_writes_is_refused_when_durability_is_required() {
    let ns = TestNamespace::new();
    let lossy = OwnRedis::start(Persistence::None);
    let mut settings = settings_for(&ns);
    settings.backend.redis_url = Secret::new(lossy.url());
    settings.backend.redis_cluster = false;
    settings.require_durable_redis = true;
    let refused = Application::build(settings.clone())
        .await
        .expect_err("no append-only file: refused");
    let message = format!("{refused:#}");
    assert!(
        message.contains("SECKILL_API_REQUIRE_DURABLE_REDIS"),
        "{message}"
    );
    assert!(message.contains("appendonly"), "{message}");

    // The same settings against a Redis with an append-only file start.
    let durable = OwnRedis::start(Persistence::AppendOnly);
    settings.backend.redis_url = Secret::new(durable.url());
    let app = Application::build(settings)
        .await
        .expect("a durable redis is accepted");
    drop(app);

    // Without the requirement a lossy Redis is only warned about.
    let mut settings = settings_for(&ns);
    settings.backend.redis_url = Secret::new(lossy.url());
    settings.backend.redis_cluster = false;
    Application::build(settings)
        .await
        .expect("only a warning when durability is not required");
    ns.cleanup().await;
}
