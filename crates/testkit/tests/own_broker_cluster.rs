//! A private 3-node cluster: quorum queues span it, and losing the leader's node keeps a
//! queue's messages.

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use seckill_testkit::OwnBrokerCluster;

#[tokio::test]
async fn a_quorum_queue_keeps_its_messages_when_its_leaders_node_is_killed() {
    let cluster = OwnBrokerCluster::start(3).await;
    let url = cluster.node(0).amqp_url();
    let connection = Connection::connect(&url, ConnectionProperties::default())
        .await
        .expect("connect to node 0");
    let channel = connection.create_channel().await.expect("channel");
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let queue = "cluster-survivor";
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await
        .expect("declare a quorum queue");
    let leader = cluster.move_leader_off_first_node(queue).await;
    assert_ne!(leader, 0);
    channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"kept",
            BasicProperties::default().with_delivery_mode(2),
        )
        .await
        .expect("publish")
        .await
        .expect("confirmed");

    cluster.node(leader).kill().await;
    // A new leader is elected among the two members left; the message is still there. A
    // get that meets the queue between leaders fails the whole connection (a hard error,
    // `nodedown`): connect again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut channel = channel;
    let message = loop {
        match channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
        {
            Ok(Some(message)) => break message,
            failed if std::time::Instant::now() >= deadline => {
                panic!("no message after the leader's node died: {failed:?}")
            }
            Ok(None) => {}
            Err(_) => {
                let again = Connection::connect(&url, ConnectionProperties::default())
                    .await
                    .expect("connect to node 0 again");
                channel = again.create_channel().await.expect("a new channel");
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(message.delivery.data, b"kept");
}
