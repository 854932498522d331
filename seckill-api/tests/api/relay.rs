//! The outbox relay on its own: what it costs with a large registry, what it finds without
//! hints, and the consumer names it prunes.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use seckill_api::relay::{GROUP, Relay, RelayHints, RelayWork, create_group, register};
use seckill_store::RedisConn;
use seckill_testkit::{TestNamespace, eventually};

/// A relay over `ns` that nobody hints, behind handlers that publish (the default).
async fn relay(ns: &TestNamespace, redis: seckill_store::Redis) -> (Relay, Arc<RelayWork>) {
    let work = Arc::new(RelayWork::default());
    let relay = Relay {
        redis,
        keys: ns.keys(),
        amqp_url: ns.amqp_url.clone(),
        topology: ns.topology(),
        signer: seckill_messaging::OrderSigner::new(
            ns.backend_settings().order_signing_key.expose(),
        ),
        db: seckill_store::postgres::connect_and_migrate(
            &ns.database_url,
            2,
            Duration::from_secs(10),
        )
        .await
        .expect("migrated database"),
        batch: 256,
        batch_max: 64,
        reclaim_idle: Duration::from_millis(200),
        hints: Arc::new(RelayHints::default()),
        connected: Arc::new(AtomicBool::new(false)),
        consumer: format!("test-{}", uuid::Uuid::new_v4().simple()),
        handlers_publish: true,
        scan_every: Duration::from_millis(200),
        consumer_idle: Duration::from_millis(100),
        work: work.clone(),
    };
    (relay, work)
}

fn redis_of(ns: &TestNamespace) -> seckill_store::Redis {
    let backend = ns.backend_settings();
    seckill_store::Redis::new(backend.redis_url.expose(), backend.redis_cluster, 2)
        .expect("redis handle")
}

fn unix_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Writes an outbox entry the way `purchase.lua` does.
async fn write_entry(conn: &mut RedisConn, stream: &str, request_id: &str) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("request_id")
        .arg(request_id)
        .arg("payload")
        .arg(format!(r#"{{"request_id":"{request_id}"}}"#))
        .arg("http_request_id")
        .arg("test")
        .query_async(conn)
        .await
        .expect("xadd");
}

async fn consumers(conn: &mut RedisConn, stream: &str) -> Vec<String> {
    let reply: redis::streams::StreamInfoConsumersReply = redis::cmd("XINFO")
        .arg("CONSUMERS")
        .arg(stream)
        .arg(GROUP)
        .query_async(conn)
        .await
        .expect("xinfo consumers");
    reply.consumers.into_iter().map(|c| c.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_pass_costs_nothing_per_finished_sale_in_a_registry_of_10000() {
    let ns = TestNamespace::new();
    let keys = ns.keys();
    let mut conn = ns.redis().await;
    // 10,000 products whose sales ended ten minutes ago, their outbox streams empty.
    let ended = unix_ms() - 600_000;
    for chunk in (1..=10_000i64).collect::<Vec<_>>().chunks(1_000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(keys.outbox_registry());
        for &product in chunk {
            zadd.arg(ended).arg(keys.outbox(product, 0));
        }
        let _: i64 = zadd.query_async(&mut conn).await.expect("zadd");
    }
    // One product still on sale, with an entry nobody hinted about.
    let live = keys.outbox(10_001, 0);
    register(&mut conn, &keys, &live, unix_ms() + 3_600_000)
        .await
        .expect("register");
    create_group(&mut conn, &live).await.expect("group");
    write_entry(&mut conn, &live, "live-1").await;

    let (relay, work) = relay(&ns, redis_of(&ns)).await;
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay.run(cancel.clone()));
    // The first safety scan probes all 10,001 streams and retires the finished ones.
    eventually(
        "the finished sales retired",
        Duration::from_secs(60),
        || async {
            let mut conn = ns.redis().await;
            let left: i64 = redis::cmd("ZCARD")
                .arg(keys.outbox_registry())
                .query_async(&mut conn)
                .await
                .ok()?;
            (left == 1).then_some(())
        },
    )
    .await;
    let queued = seckill_testkit::TakenPurchases::from(&ns).await;
    eventually(
        "the live entry relayed",
        Duration::from_secs(20),
        || async { (queued.count().await == 1).then_some(()) },
    )
    .await;
    // From now on: a window of passes and safety scans, and the commands they sent.
    let scans = work.scans();
    let commands = work.commands();
    eventually(
        "five more safety scans",
        Duration::from_secs(20),
        || async { (work.scans() >= scans + 5).then_some(()) },
    )
    .await;
    let spent = work.commands() - commands;
    let per_scan = spent as f64 / (work.scans() - scans) as f64;
    eprintln!("relay: {per_scan:.1} Redis commands per safety scan with 10,000 finished sales");
    // A scan is a page of the registry, a probe of the one live stream and a look at the
    // legacy registry; before, every pass read each of the 10,001 streams.
    assert!(
        per_scan <= 8.0,
        "{spent} commands over {} scans",
        work.scans() - scans
    );
    cancel.cancel();
    task.await.expect("join").expect("relay");
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_of_a_dead_replica_are_relayed_without_any_hint() {
    let ns = TestNamespace::new();
    let keys = ns.keys();
    let mut conn = ns.redis().await;
    // A replica registered and loaded bucket 3, wrote two purchases and died: one before
    // its relay read it, one read by its relay (pending on its consumer name) and not
    // published.
    let stream = keys.outbox(7, 3);
    register(&mut conn, &keys, &stream, unix_ms() + 3_600_000)
        .await
        .expect("register");
    create_group(&mut conn, &stream).await.expect("group");
    write_entry(&mut conn, &stream, "read-by-the-dead").await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("api-dead")
        .arg("COUNT")
        .arg(10)
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("dead read");
    write_entry(&mut conn, &stream, "never-read").await;

    let (relay, _) = relay(&ns, redis_of(&ns)).await;
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay.run(cancel.clone()));
    let queued = seckill_testkit::TakenPurchases::from(&ns).await;
    eventually("both entries relayed", Duration::from_secs(20), || async {
        let mut conn = ns.redis().await;
        let left: i64 = redis::cmd("XLEN")
            .arg(&stream)
            .query_async(&mut conn)
            .await
            .ok()?;
        (left == 0 && queued.count().await == 2).then_some(())
    })
    .await;
    cancel.cancel();
    task.await.expect("join").expect("relay");
    ns.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_names_of_dead_replicas_are_pruned_once_they_hold_nothing() {
    let ns = TestNamespace::new();
    let keys = ns.keys();
    let mut conn = ns.redis().await;
    let stream = keys.outbox(8, 0);
    register(&mut conn, &keys, &stream, unix_ms() + 3_600_000)
        .await
        .expect("register");
    create_group(&mut conn, &stream).await.expect("group");
    // Ten restarts' worth of names: "idle-*" read nothing, "holder" holds an entry.
    for restart in 0..10 {
        let _: redis::Value = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&stream)
            .arg(GROUP)
            .arg(format!("idle-{restart}"))
            .query_async(&mut conn)
            .await
            .expect("createconsumer");
    }
    write_entry(&mut conn, &stream, "held").await;
    let _: redis::Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(GROUP)
        .arg("holder")
        .arg("STREAMS")
        .arg(&stream)
        .arg(">")
        .query_async(&mut conn)
        .await
        .expect("holder read");
    tokio::time::sleep(Duration::from_millis(150)).await;
    // A consumer holding an entry is never pruned, however idle.
    let pruned = seckill_api::relay::prune_consumers(
        &mut conn,
        &stream,
        "someone-else",
        Duration::from_millis(100),
    )
    .await
    .expect("prune");
    assert_eq!(pruned, 10);
    assert_eq!(
        consumers(&mut conn, &stream).await,
        vec!["holder".to_string()]
    );

    // The relay takes the holder's entry over, publishes it, and prunes the holder too.
    let (relay, _) = relay(&ns, redis_of(&ns)).await;
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay.run(cancel.clone()));
    let queued = seckill_testkit::TakenPurchases::from(&ns).await;
    eventually("the holder pruned", Duration::from_secs(20), || async {
        let mut conn = ns.redis().await;
        let names = consumers(&mut conn, &stream).await;
        (queued.count().await == 1 && !names.contains(&"holder".to_string())).then_some(())
    })
    .await;
    cancel.cancel();
    task.await.expect("join").expect("relay");
    ns.cleanup().await;
}

/// The relay notes what it publishes in transit first: should Redis lose the entry while
/// the broker holds the copy unconfirmed, the ledger fence still waits for it to land.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_notes_each_purchase_in_transit_before_publishing_it() {
    let ns = TestNamespace::new();
    let keys = ns.keys();
    let mut conn = ns.redis().await;
    let stream = keys.outbox(7, 0);
    register(&mut conn, &keys, &stream, unix_ms() + 3_600_000)
        .await
        .expect("register");
    create_group(&mut conn, &stream).await.expect("group");
    // A purchase its handler left behind: in the outbox, nobody publishing it.
    let request_id = uuid::Uuid::now_v7();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("request_id")
        .arg(request_id.to_string())
        .arg("payload")
        .arg(
            serde_json::to_string(&seckill_messaging::OrderMessage {
                request_id,
                user_id: 1,
                product_id: 7,
                price_cents: 100,
                created_at: chrono::Utc::now(),
                bucket: Some(0),
            })
            .expect("json"),
        )
        .arg("http_request_id")
        .arg("test")
        .query_async(&mut conn)
        .await
        .expect("xadd");
    let (relay, _) = relay(&ns, redis_of(&ns)).await;
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay.run(cancel.clone()));
    let queued = seckill_testkit::TakenPurchases::from(&ns).await;
    eventually("the entry relayed", Duration::from_secs(20), || async {
        (queued.count().await == 1).then_some(())
    })
    .await;
    let db = ns.db().await;
    let noted: Vec<(uuid::Uuid, i64)> =
        sqlx::query_as("SELECT request_id, product_id FROM order_transit WHERE request_id = $1")
            .bind(request_id)
            .fetch_all(&db)
            .await
            .expect("transit notes");
    assert_eq!(
        noted,
        [(request_id, 7)],
        "the relayed purchase was not noted"
    );
    db.close().await;
    cancel.cancel();
    task.await.expect("join").expect("relay");
    ns.cleanup().await;
}
