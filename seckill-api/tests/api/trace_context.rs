//! The purchase's trace context travels inside its outbox entry, so whichever replica's
//! relay publishes it, and whenever, the message carries the click's trace.

use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use lapin::options::BasicGetOptions;
use lapin::types::AMQPValue;

use seckill_telemetry::TraceParent;
use seckill_testkit::{SendAs, TestNamespace, eventually};

const CLIENT_TRACE: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// The text of `name` in a message's headers.
fn header(properties: &lapin::BasicProperties, name: &str) -> Option<String> {
    properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(name))
        .and_then(|v| match v {
            AMQPValue::LongString(s) => Some(s.to_string()),
            _ => None,
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_outbox_entry_carries_the_traceparent_and_the_relay_publishes_it() {
    let ns = TestNamespace::new();
    // A replica whose broker is a closed port: the purchase stays in the outbox.
    let mut settings = crate::helpers::settings_for(&ns);
    settings.backend.amqp_url = seckill_config::Secret::new("amqp://guest:guest@127.0.0.1:1/%2f");
    let offline = seckill_api::Application::build(settings)
        .await
        .expect("build");
    let address = format!("http://127.0.0.1:{}", offline.port());
    let stop = offline.shutdown_token();
    let task = tokio::spawn(offline.run_until_stopped());
    let client = reqwest::Client::new();
    let now = Utc::now();
    let product = crate::helpers::create_product_at(
        &client,
        &address,
        5,
        now - ChronoDuration::minutes(1),
        now + ChronoDuration::hours(1),
    )
    .await;
    let response = client
        .post(format!("{address}/api/seckill/{product}"))
        .header("traceparent", CLIENT_TRACE)
        .send_as("seckill-api", 7, &[])
        .await
        .expect("purchase");
    assert_eq!(response.status(), 202);
    stop.cancel();
    let _ = task.await;

    // The entry holds the purchase's context: the client's trace, a span of its own.
    let client_trace = TraceParent::parse_str(CLIENT_TRACE).expect("valid");
    let mut redis = ns.redis().await;
    // The unit came from the buyer's home bucket or, when that one was dry, from another:
    // look in every bucket's outbox for the one entry.
    let buckets: i16 = sqlx::query_scalar("SELECT stock_buckets FROM products WHERE id = $1")
        .bind(product)
        .fetch_one(&ns.db().await)
        .await
        .expect("stock_buckets");
    let mut found = Vec::new();
    for bucket in 0..u16::try_from(buckets).expect("positive") {
        let stream = ns.keys().outbox(product, bucket);
        let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(&stream)
            .arg("-")
            .arg("+")
            .query_async(&mut redis)
            .await
            .expect("xrange");
        if !entries.ids.is_empty() {
            found.push((stream, entries));
        }
    }
    assert_eq!(found.len(), 1, "one outbox holds the purchase");
    let (stream, entries) = found.pop().expect("one");
    assert_eq!(entries.ids.len(), 1);
    let stored: String = entries.ids[0]
        .get("traceparent")
        .expect("a traceparent field");
    let stored = TraceParent::parse_str(&stored).expect("a valid traceparent");
    assert_eq!(stored.trace_id, client_trace.trace_id);
    assert_ne!(stored.span_id, client_trace.span_id);
    // An entry of an older version, without the field, next to it.
    let older = uuid::Uuid::now_v7().to_string();
    let _: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("request_id")
        .arg(&older)
        .arg("payload")
        .arg(format!(r#"{{"request_id":"{older}"}}"#))
        .arg("http_request_id")
        .arg("old")
        .query_async(&mut redis)
        .await
        .expect("xadd");

    // A replica with a broker relays both, much later than the click.
    let mut settings = crate::helpers::settings_for(&ns);
    settings.relay_reclaim_idle = Duration::from_millis(200);
    let online = seckill_api::Application::build(settings)
        .await
        .expect("build");
    let stop = online.shutdown_token();
    let task = tokio::spawn(online.run_until_stopped());
    let (_connection, channel) = ns.channel().await;
    let queue = ns.topology().queue;
    let messages = std::sync::Mutex::new(Vec::new());
    eventually(
        "both entries published",
        Duration::from_secs(30),
        || async {
            while let Some(message) = channel
                .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .expect("basic.get")
            {
                let mut messages = messages.lock().expect("lock");
                // The relay may send both in one batch: each part carries its own headers.
                let parts = seckill_messaging::batch::messages(
                    &message.delivery.data,
                    &message.delivery.properties,
                )
                .expect("a readable message");
                messages.extend(parts.into_iter().map(|part| part.properties));
            }
            (messages.lock().expect("lock").len() >= 2).then_some(())
        },
    )
    .await;
    let messages = messages.into_inner().expect("lock");
    stop.cancel();
    let _ = task.await;
    assert_eq!(messages.len(), 2);
    for properties in &messages {
        let id = properties.message_id().as_ref().map(|m| m.to_string());
        if id.as_deref() == Some(older.as_str()) {
            assert_eq!(header(properties, "traceparent"), None, "no trace to carry");
            continue;
        }
        let sent = header(properties, "traceparent").expect("a traceparent header");
        let sent = TraceParent::parse_str(&sent).expect("valid");
        assert_eq!(sent.trace_id, client_trace.trace_id, "the click's trace");
        // The relay's publish span is the message's parent.
        assert_ne!(sent.span_id, stored.span_id);
        // The signature is of the body alone: still the one seckill-api made.
        assert!(header(properties, seckill_messaging::HEADER_SIGNATURE).is_some());
    }
    ns.cleanup().await;
}
