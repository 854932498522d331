//! The order queues as RabbitMQ holds them: quorum queues by default, dead-lettering at
//! least once, a delivery limit on the main queue; classic queues when configured.

use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicNackOptions};
use serde_json::{Value, json};

use seckill_messaging::{DELIVERY_LIMIT, OrderSigner, QueueType, Topology};
use seckill_testkit::TestNamespace;

use crate::helpers::spawn_app;

/// A queue as the management API shows it (its type, flags and arguments).
async fn queue_info(ns: &TestNamespace, queue: &str) -> Value {
    let amqp = reqwest::Url::parse(&ns.amqp_url).expect("amqp url");
    let vhost = match amqp.path().trim_start_matches('/') {
        "" => "%2F".to_string(),
        encoded => encoded.to_string(),
    };
    let host = amqp.host_str().unwrap_or("127.0.0.1");
    let response = reqwest::Client::new()
        .get(format!("http://{host}:15672/api/queues/{vhost}/{queue}"))
        .basic_auth(amqp.username(), amqp.password())
        .send()
        .await
        .expect("management API (enabled by scripts/infra.sh)");
    assert_eq!(response.status(), 200, "{queue}");
    response.json().await.expect("json")
}

#[tokio::test]
async fn the_order_queues_are_quorum_queues_that_dead_letter_at_least_once() {
    let app = spawn_app().await;
    let topology = app.ns.topology();
    let info = queue_info(&app.ns, &topology.queue).await;
    assert_eq!(info["type"], "quorum");
    assert_eq!(
        (&info["durable"], &info["auto_delete"], &info["exclusive"]),
        (&json!(true), &json!(false), &json!(false))
    );
    assert_eq!(
        info["arguments"],
        json!({
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": topology.dead_letter_exchange,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
            "x-delivery-limit": DELIVERY_LIMIT,
        })
    );
    for delay_ms in [1_000, 5_000, 30_000] {
        let tier = queue_info(&app.ns, &topology.retry_queue(delay_ms)).await;
        assert_eq!(tier["type"], "quorum");
        assert_eq!(
            tier["arguments"],
            json!({
                "x-queue-type": "quorum",
                "x-message-ttl": delay_ms,
                "x-dead-letter-exchange": topology.exchange,
                "x-dead-letter-routing-key": topology.routing_key,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            }),
            "{delay_ms} ms tier"
        );
    }
    let dlq = queue_info(&app.ns, &topology.dead_letter_queue).await;
    assert_eq!(dlq["type"], "quorum");
    assert_eq!(dlq["arguments"], json!({ "x-queue-type": "quorum" }));
    app.shutdown().await;
}

#[tokio::test]
async fn classic_queues_are_declared_as_before_and_cannot_turn_quorum_in_place() {
    let ns = TestNamespace::new();
    let classic = ns.topology().with_queue_type(QueueType::Classic);
    let connection = seckill_messaging::connect(&ns.amqp_url, "test", Duration::from_secs(10))
        .await
        .expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    classic.declare(&channel).await.expect("declare classic");
    let info = queue_info(&ns, &classic.queue).await;
    assert_eq!(info["type"], "classic");
    assert_eq!(
        info["arguments"],
        json!({ "x-dead-letter-exchange": classic.dead_letter_exchange })
    );
    let tier = queue_info(&ns, &classic.retry_queue(1_000)).await;
    assert_eq!(tier["type"], "classic");
    assert_eq!(
        tier["arguments"],
        json!({
            "x-message-ttl": 1_000,
            "x-dead-letter-exchange": classic.exchange,
            "x-dead-letter-routing-key": classic.routing_key,
        })
    );
    // Why an upgrade must delete (or drain and migrate) the old classic queues first.
    let quorum_channel = connection.create_channel().await.expect("channel");
    let clash = ns
        .topology()
        .declare(&quorum_channel)
        .await
        .expect_err("a classic queue redeclared as quorum");
    assert!(clash.to_string().contains("PRECONDITION_FAILED"), "{clash}");

    classic.delete(&channel).await.expect("delete classic");
    let _ = connection.close(200, "done".into()).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn the_broker_dead_letters_a_message_returned_more_than_the_delivery_limit() {
    // No order-service here: a consumer that hands the message back on every delivery, as
    // one that crashes on it would.
    let ns = TestNamespace::new();
    let (connection, channel) = ns.channel().await;
    let topology: Topology = ns.topology();
    let signer = OrderSigner::new(ns.backend_settings().order_signing_key.expose());
    let confirm =
        seckill_messaging::publish_order(&channel, &signer, &topology, "poison", "r", b"{}")
            .await
            .expect("publish")
            .await
            .expect("confirm");
    seckill_messaging::taken(&confirm).expect("routed");
    let mut deliveries = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(std::time::Instant::now() < deadline, "never dead-lettered");
        let got = channel
            .basic_get(topology.queue.as_str().into(), BasicGetOptions::default())
            .await
            .expect("get");
        let Some(message) = got else {
            // Between a return and its redelivery, or dead-lettered at last.
            if ns.queue_depth(&channel, &topology.dead_letter_queue).await == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        deliveries += 1;
        message
            .delivery
            .nack(BasicNackOptions {
                requeue: true,
                multiple: false,
            })
            .await
            .expect("nack");
    }
    assert_eq!(
        deliveries,
        DELIVERY_LIMIT + 1,
        "the first delivery and one per return up to the limit"
    );
    let _ = connection.close(200, "done".into()).await;
    ns.cleanup().await;
}
