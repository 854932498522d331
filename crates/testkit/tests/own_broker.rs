//! A private broker can be stopped and restarted, and keeps what RabbitMQ promises to keep.

use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use seckill_testkit::OwnBroker;

const QUEUE: &str = "own-broker-survivor";
const BODY: &[u8] = b"still here after a restart";

async fn connect(broker: &OwnBroker) -> lapin::Result<Connection> {
    Connection::connect(&broker.amqp_url(), ConnectionProperties::default()).await
}

#[tokio::test]
async fn a_durable_queue_and_a_persistent_message_survive_stop_and_restart() {
    let clock = Instant::now();
    let broker = OwnBroker::start().await;
    let started = clock.elapsed();

    let connection = connect(&broker).await.expect("connect");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("enable confirms");
    channel
        .queue_declare(
            QUEUE.into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare durable queue");
    let confirmation = channel
        .basic_publish(
            "".into(),
            QUEUE.into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            BODY,
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    // An ack for a persistent message on a durable queue means it is on disk: only then
    // is its survival the broker's promise rather than luck.
    assert!(
        confirmation.is_ack(),
        "broker did not ack: {confirmation:?}"
    );
    // Left open on purpose: the stop must cope with live clients.
    let _connection = connection;

    let clock = Instant::now();
    broker.stop().await;
    let stopped = clock.elapsed();
    let refused = tokio::time::timeout(Duration::from_secs(10), connect(&broker))
        .await
        .expect("a connect to a stopped broker fails at once");
    assert!(refused.is_err(), "connected to a stopped broker");

    let clock = Instant::now();
    broker.restart().await;
    let restarted = clock.elapsed();

    let connection = connect(&broker).await.expect("connect after restart");
    let channel = connection.create_channel().await.expect("channel");
    let message = channel
        .basic_get(QUEUE.into(), BasicGetOptions { no_ack: true })
        .await
        .expect("basic_get on the recovered queue")
        .expect("the persistent message survived the restart");
    assert_eq!(message.delivery.data, BODY);
    assert_eq!(
        message.message_count, 0,
        "exactly one message was published"
    );
    let _ = connection.close(200, "done".into()).await;

    eprintln!("own broker: start {started:.2?}, stop {stopped:.2?}, restart {restarted:.2?}");
}
