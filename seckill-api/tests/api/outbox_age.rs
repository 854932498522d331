//! `outbox_oldest_age_seconds`: the age of the oldest entry over every registered outbox
//! stream, whether or not a relay runs.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use seckill_api::relay::{OutboxAge, register};
use seckill_testkit::{TestNamespace, eventually};

/// The gauge's value for `replica` in the process' metrics.
fn age_of(replica: &str) -> Option<f64> {
    let text = seckill_telemetry::metrics_handle().render();
    let series = format!("outbox_oldest_age_seconds{{replica=\"{replica}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn the_outbox_age_is_that_of_the_oldest_entry_over_every_stream() {
    let ns = TestNamespace::new();
    let backend = ns.backend_settings();
    let redis = seckill_store::Redis::new(backend.redis_url.expose(), backend.redis_cluster, 2)
        .expect("redis handle");
    let keys = ns.keys();
    let watch = OutboxAge {
        redis,
        keys: keys.clone(),
        replica: format!("test-{}", uuid::Uuid::new_v4().simple()),
        every: Duration::from_millis(50),
    };
    assert_eq!(
        watch.oldest_ms().await.expect("read"),
        None,
        "no stream yet"
    );

    // Two streams, entries written 90 s and 5 s ago (ids are their XADD times).
    let now = chrono::Utc::now().timestamp_millis();
    let mut conn = ns.redis().await;
    let (old, recent) = (keys.outbox(1, 0), keys.outbox(2, 0));
    for (stream, written) in [(&old, now - 90_000), (&recent, now - 5_000)] {
        register(&mut conn, &keys, stream, now + 3_600_000)
            .await
            .expect("register");
        let _: String = redis::cmd("XADD")
            .arg(stream)
            .arg(format!("{written}-0"))
            .arg("payload")
            .arg("{}")
            .query_async(&mut conn)
            .await
            .expect("xadd");
    }
    assert_eq!(watch.oldest_ms().await.expect("read"), Some(now - 90_000));

    let cancel = CancellationToken::new();
    let replica = watch.replica.clone();
    tokio::spawn(watch.run(cancel.clone()));
    eventually(
        "the age of the 90 s old entry",
        Duration::from_secs(5),
        || async { age_of(&replica).filter(|age| (90.0..120.0).contains(age)) },
    )
    .await;

    // Confirmed (deleted), the old entry no longer counts; then nothing is left.
    let _: i64 = redis::cmd("DEL")
        .arg(&old)
        .query_async(&mut conn)
        .await
        .expect("del");
    eventually(
        "the age of the 5 s old entry",
        Duration::from_secs(5),
        || async { age_of(&replica).filter(|age| (5.0..30.0).contains(age)) },
    )
    .await;
    let _: i64 = redis::cmd("DEL")
        .arg(&recent)
        .query_async(&mut conn)
        .await
        .expect("del");
    eventually("an age of 0", Duration::from_secs(5), || async {
        age_of(&replica).filter(|age| *age == 0.0)
    })
    .await;
    cancel.cancel();
    ns.cleanup().await;
}
