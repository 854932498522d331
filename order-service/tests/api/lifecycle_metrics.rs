//! The message-lifecycle metrics on `/metrics`: the queues' depth and consumers as the
//! broker reports them, and a retry's wait timed by its tier.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, QueueDeleteOptions};
use seckill_messaging::Topology;
use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::{TestApp, spawn_app_with};

/// The value of the sample of `name` whose labels include every one of `labels`.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        let (series, value) = rest.rsplit_once(' ')?;
        let matches = (series.starts_with('{') || series.is_empty())
            && labels
                .iter()
                .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")));
        matches.then(|| value.parse().ok()).flatten()
    })
}

async fn scrape(app: &TestApp) -> String {
    reqwest::get(format!("{}/metrics", app.address))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text")
}

#[tokio::test]
async fn queue_gauges_report_each_queues_depth_and_consumers() {
    // A tier no message leaves during the test: its depth is exactly what was put there.
    let tier = Duration::from_secs(600);
    let app = spawn_app_with(TestNamespace::new(), |s| {
        s.retry_tiers = vec![tier];
        s.queue_watch = Duration::from_millis(100);
    })
    .await;
    let topology = app.ns.topology();
    let retry_queue = topology.retry_queue(600_000);
    for _ in 0..3 {
        app.channel
            .basic_publish(
                topology.retry_exchange.as_str().into(),
                Topology::retry_routing_key(600_000).as_str().into(),
                BasicPublishOptions::default(),
                b"{}",
                BasicProperties::default(),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm");
    }

    let expected = [
        ("amqp_queue_messages", retry_queue.as_str(), "retry", 3.0),
        ("amqp_queue_consumers", retry_queue.as_str(), "retry", 0.0),
        ("amqp_queue_consumers", topology.queue.as_str(), "main", 1.0),
        ("amqp_queue_messages", topology.queue.as_str(), "main", 0.0),
        (
            "amqp_queue_consumers",
            topology.dead_letter_queue.as_str(),
            "dead_letter",
            1.0,
        ),
    ];
    let text = eventually("the queue gauges", Duration::from_secs(10), || async {
        let text = scrape(&app).await;
        expected
            .iter()
            .all(|(name, queue, role, value)| {
                sample(&text, name, &[("queue", queue), ("role", role)]) == Some(*value)
            })
            .then_some(text)
    })
    .await;
    assert!(text.contains("# HELP amqp_queue_messages"), "{text}");

    let _ = app
        .channel
        .queue_delete(retry_queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    app.shutdown().await;
}

#[tokio::test]
async fn a_retry_is_timed_from_its_publish_to_its_return_under_its_tier() {
    // A tier no other test uses, so its series is this test's alone.
    let app = spawn_app_with(TestNamespace::new(), |s| {
        s.retry_tiers = vec![Duration::from_millis(1234)];
        s.max_attempts = 5;
        s.lock_timeout = Duration::from_millis(150);
    })
    .await;
    let product = app.product(5).await;
    let mut lock = app.db.begin().await.expect("begin");
    sqlx::query("SELECT 1 FROM products WHERE id = $1 FOR UPDATE")
        .bind(product)
        .execute(&mut *lock)
        .await
        .expect("lock");
    app.publish(&app.message(product, 11)).await;
    let tier = [("tier", "1234ms")];
    eventually("a retry", Duration::from_secs(10), || async {
        let text = scrape(&app).await;
        (sample(&text, "orders_retried_total", &tier)? >= 1.0).then_some(())
    })
    .await;
    drop(lock);
    eventually("the order", Duration::from_secs(15), || async {
        (app.order_count(product).await == 1).then_some(())
    })
    .await;
    let text = scrape(&app).await;
    let count = sample(&text, "orders_retry_latency_seconds_count", &tier).expect("count");
    let sum = sample(&text, "orders_retry_latency_seconds_sum", &tier).expect("sum");
    assert!(count >= 1.0, "{text}");
    assert!(
        sum / count >= 1.2,
        "a retry waits at least its tier: {sum} s over {count}"
    );

    let retry_queue = app.ns.topology().retry_queue(1234);
    let _ = app
        .channel
        .queue_delete(retry_queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    app.shutdown().await;
}
