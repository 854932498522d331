//! Start-up checks of the stores: a Redis that could lose acknowledged writes.

use std::time::Duration;

use seckill_api::Application;
use seckill_config::Secret;
use seckill_store::WaitFor;
use seckill_testkit::{OwnRedis, Persistence, TestNamespace};

use crate::helpers::{settings_for, spawn_app_with};

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

/// Makes `replica` a replica of `master` and waits until the master counts it online.
fn replicate(replica: &OwnRedis, master: &OwnRedis) {
    let mut conn = redis::Client::open(replica.url())
        .and_then(|c| c.get_connection())
        .expect("connect to the replica");
    redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port())
        .query::<()>(&mut conn)
        .expect("REPLICAOF");
    let mut master_conn = redis::Client::open(master.url())
        .and_then(|c| c.get_connection())
        .expect("connect to the master");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut master_conn)
            .expect("INFO replication");
        if info.contains("state=online") {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "replica never came online: {info}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[tokio::test]
async fn an_accepted_purchase_waits_for_its_redis_replica_and_a_missing_one_is_counted() {
    let master = OwnRedis::start(Persistence::AppendOnly);
    let mut replica = OwnRedis::start(Persistence::None);
    replicate(&replica, &master);
    let url = master.url();
    let app = spawn_app_with(|s| {
        s.backend.redis_url = Secret::new(url);
        s.backend.redis_cluster = false;
        s.redis_wait_replicas = 1;
        s.redis_wait_timeout = Duration::from_secs(2);
    })
    .await;
    let short = "seckill_redis_wait_short_total";
    let product = app.create_product(10).await;

    let before = app.metric(short).await;
    assert_eq!(app.purchase(product, 1).await.status(), 202);
    assert_eq!(
        app.metric(short).await,
        before,
        "the replica acknowledged the purchase's write"
    );

    // Without its replica the purchase still stands, and the short copy is counted.
    replica.kill();
    assert_eq!(app.purchase(product, 2).await.status(), 202);
    assert_eq!(app.metric(short).await, before + 1.0);
    assert_eq!(
        app.purchase(product, 2).await.status(),
        409,
        "the purchase was recorded"
    );
    app.stop().await;
}

#[tokio::test]
async fn a_wait_for_copies_is_answered_by_the_node_that_took_the_write() {
    // On a cluster WAIT must reach the master of the key's slot; anywhere else it would
    // count another connection's writes, or be refused.
    let ns = TestNamespace::new();
    let redis = seckill_store::Redis::new(&ns.redis_url, ns.redis_cluster, 1).expect("redis");
    let mut conn = redis.get().await.expect("connect");
    let key = format!("{}:wait-probe", ns.namespace);
    redis::cmd("SET")
        .arg(&key)
        .arg(1)
        .query_async::<()>(&mut conn)
        .await
        .expect("SET");
    let none = WaitFor {
        replicas: 0,
        local_aof: false,
        timeout: std::time::Duration::from_millis(100),
    };
    assert!(conn.wait_for(&key, none).await.expect("WAIT 0"));
    // The test servers have no replicas: one asked for is one missing, after the timeout.
    let one = WaitFor {
        replicas: 1,
        ..none
    };
    assert!(!conn.wait_for(&key, one).await.expect("WAIT 1"));
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<()>(&mut conn)
        .await
        .expect("DEL");
}
