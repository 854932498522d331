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

    // The same on a dedicated connection (on a cluster, a cluster connection of its own).
    let dedicated = redis.dedicated(1, one.timeout).expect("pool");
    let mut own = dedicated.get().await.expect("checkout");
    redis::cmd("SET")
        .arg(&key)
        .arg(2)
        .query_async::<()>(&mut own)
        .await
        .expect("SET");
    assert!(own.wait_for(&key, none).await.expect("WAIT 0"));
    assert!(!own.wait_for(&key, one).await.expect("WAIT 1"));
    drop(own);
    // Given back, it serves the next checkout.
    let mut again = dedicated.get().await.expect("checkout again");
    let value: i64 = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut again)
        .await
        .expect("GET");
    assert_eq!(value, 2);
    redis::cmd("DEL")
        .arg(&key)
        .query_async::<()>(&mut conn)
        .await
        .expect("DEL");
}

/// Clients of `redis` blocked in `WAIT` right now (`CLIENT LIST`: last command `wait`,
/// flag `b`).
async fn blocked_in_wait(redis: &mut redis::aio::MultiplexedConnection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(redis)
        .await
        .expect("CLIENT LIST");
    list.lines()
        .filter(|client| {
            let field = |name: &str| {
                client
                    .split(' ')
                    .find_map(|kv| kv.strip_prefix(name))
                    .unwrap_or("")
            };
            field("cmd=") == "wait" && field("flags=").contains('b')
        })
        .count()
}

/// Waits until `count` clients of `redis` block in `WAIT`.
async fn until_blocked_in_wait(redis: &mut redis::aio::MultiplexedConnection, count: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let blocked = blocked_in_wait(redis).await;
        if blocked >= count {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{blocked} clients blocked in WAIT, not {count}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A Redis without the replica the app waits for: every accepted purchase's `WAIT` lasts
/// its whole timeout, `wait`.
async fn app_waiting_in_vain(
    redis: &OwnRedis,
    wait: Duration,
    connections: usize,
) -> crate::helpers::TestApp {
    let url = redis.url();
    spawn_app_with(|s| {
        s.backend.redis_url = Secret::new(url);
        s.backend.redis_cluster = false;
        // One multiplexed connection: anything queued behind a WAIT on it would show.
        s.redis_pool_size = 1;
        s.redis_wait_replicas = 1;
        s.redis_wait_timeout = wait;
        s.redis_wait_connections = connections;
        // Every sold-out answer asks Redis, not this replica's memory.
        s.sold_out_local_ttl = Duration::ZERO;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purchase_waiting_for_its_copies_stalls_no_other_purchase() {
    let own = OwnRedis::start(Persistence::AppendOnly);
    let mut redis = redis::Client::open(own.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let wait = Duration::from_secs(3);
    let app = std::sync::Arc::new(app_waiting_in_vain(&own, wait, 64).await);
    let on_sale = app.create_product_in_buckets(10, 1).await;
    // A product sold out in Redis: its one unit bought (a wait in vain), its flag raised.
    let gone = app.create_product_in_buckets(1, 1).await;
    assert_eq!(app.purchase(gone, 100).await.status(), 202);
    assert_eq!(app.purchase(gone, 101).await.status(), 410);

    // Two purchases block in WAIT, each on a connection of its own.
    let waiting: Vec<_> = [1, 2]
        .map(|user| {
            let app = app.clone();
            tokio::spawn(async move { app.purchase(on_sale, user).await.status() })
        })
        .into();
    until_blocked_in_wait(&mut redis, 2).await;

    // Meanwhile a purchase that sells nothing, and a result read, are answered at once.
    let started = std::time::Instant::now();
    assert_eq!(app.purchase(gone, 102).await.status(), 410);
    assert_eq!(app.purchase(gone, 100).await.status(), 409);
    let result = app.result(on_sale, 3).await;
    let answered = started.elapsed();
    assert!(
        answered < Duration::from_millis(1_000),
        "answered after {answered:?} (result: {result}), behind the WAITs"
    );
    assert_eq!(
        blocked_in_wait(&mut redis).await,
        2,
        "the purchases still wait"
    );
    for purchase in waiting {
        assert_eq!(purchase.await.expect("purchase"), 202);
    }
    std::sync::Arc::into_inner(app)
        .expect("no other handle")
        .stop()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purchases_that_wait_for_copies_are_decided_over_connections_of_their_own() {
    let own = OwnRedis::start(Persistence::AppendOnly);
    let mut redis = redis::Client::open(own.url())
        .expect("client")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let wait = Duration::from_secs(3);
    let app = std::sync::Arc::new(app_waiting_in_vain(&own, wait, 1).await);
    let product = app.create_product_in_buckets(10, 1).await;
    let remaining = |redis: &mut redis::aio::MultiplexedConnection| {
        let key = app.ns.keys().stock(product, 0);
        let mut redis = redis.clone();
        async move {
            redis::cmd("HGET")
                .arg(key)
                .arg("remaining")
                .query_async::<i64>(&mut redis)
                .await
                .expect("HGET remaining")
        }
    };

    // The first purchase holds the one dedicated connection through its WAIT.
    let first = {
        let app = app.clone();
        tokio::spawn(async move { app.purchase(product, 1).await.status() })
    };
    until_blocked_in_wait(&mut redis, 1).await;
    assert_eq!(remaining(&mut redis).await, 9);

    // The second finds none free within 2 s: it is refused before its script ran, and
    // takes nothing (not even once the first lets its connection go).
    let started = std::time::Instant::now();
    let refused = app.purchase(product, 2).await;
    let took = started.elapsed();
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().contains_key("retry-after"));
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(body["code"], "unavailable", "{body}");
    assert!(
        (Duration::from_millis(1_900)..Duration::from_millis(2_900)).contains(&took),
        "refused after {took:?}, not after the 2 s checkout wait"
    );
    assert_eq!(first.await.expect("purchase"), 202);
    assert_eq!(
        remaining(&mut redis).await,
        9,
        "the refused purchase took a unit"
    );

    // Retried, it is decided on the connection the first gave back.
    assert_eq!(app.purchase(product, 2).await.status(), 202);
    assert_eq!(remaining(&mut redis).await, 8);
    std::sync::Arc::into_inner(app)
        .expect("no other handle")
        .stop()
        .await;
}
