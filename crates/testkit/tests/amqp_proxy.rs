//! The AMQP proxy between a real client and RabbitMQ: it credits the purchases of the
//! confirms it lets through, follows only the connection it watches, and once armed loses
//! exactly one batch's confirm (the broker still takes the message), then severs that
//! connection.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use seckill_messaging::batch::Outgoing;
use seckill_messaging::{ConfirmedPublisher, OrderSigner, TraceHeaders};
use seckill_testkit::{AmqpProxy, TestNamespace};

const WATCHED: &str = "proxied publisher";
const SILENCE: Duration = Duration::from_millis(500);

/// Purchases with fresh request ids, as order message bodies naming them.
fn purchases(n: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|_| {
            let id = uuid::Uuid::new_v4().to_string();
            let body = format!(r#"{{"request_id":"{id}","user_id":1}}"#).into_bytes();
            (id, body)
        })
        .collect()
}

fn ids(purchases: &[(String, Vec<u8>)]) -> HashSet<String> {
    purchases.iter().map(|(id, _)| id.clone()).collect()
}

/// Publishes `purchases` as one message (a batch, or a single order for one) and waits for
/// its confirm.
async fn publish(
    publisher: &ConfirmedPublisher,
    namespace: &TestNamespace,
    purchases: &[(String, Vec<u8>)],
) -> Result<(), seckill_messaging::PublishError> {
    let signer = OrderSigner::new("proxy-test-key");
    let orders: Vec<Outgoing<'_>> = purchases
        .iter()
        .map(|(id, body)| Outgoing {
            request_id: id,
            http_request_id: "",
            payload: body,
            trace: TraceHeaders::default(),
        })
        .collect();
    let confirm = publisher
        .send_orders(&signer, &namespace.topology(), &orders)
        .await?;
    publisher.confirmed(confirm).await
}

#[tokio::test]
async fn one_batch_confirm_is_lost_and_its_connection_severed() {
    let namespace = TestNamespace::new();
    let (_direct, channel) = namespace.channel().await;
    let proxy = AmqpProxy::start(&namespace.amqp_url, WATCHED, SILENCE)
        .await
        .expect("start the proxy");
    let connection = seckill_messaging::connect(proxy.amqp_url(), WATCHED, Duration::from_secs(10))
        .await
        .expect("connect through the proxy");
    let publisher = ConfirmedPublisher::open(&connection, Duration::from_secs(10))
        .await
        .expect("a confirming channel");

    // A batch and a single order, confirmed and credited.
    let (batch, single) = (purchases(2), purchases(1));
    publish(&publisher, &namespace, &batch)
        .await
        .expect("batch confirmed");
    publish(&publisher, &namespace, &single)
        .await
        .expect("single confirmed");
    let report = proxy.report();
    assert_eq!(report.connections, 1);
    assert_eq!(report.passed_messages, 2);
    assert_eq!(report.passed, &ids(&batch) | &ids(&single));

    // Armed for a confirm of at least 2 purchases: a single order's still passes, then a
    // batch of 3 never hears its confirm, and the connection dies after the silence.
    proxy.lose_next_confirm(2);
    let alone = purchases(1);
    publish(&publisher, &namespace, &alone)
        .await
        .expect("a confirm of one purchase passes");
    let lost = purchases(3);
    let began = Instant::now();
    let outcome = publish(&publisher, &namespace, &lost).await;
    assert!(
        outcome.is_err(),
        "the swallowed confirm arrived: {outcome:?}"
    );
    assert!(proxy.wait_severed(Duration::from_secs(10)).await);
    assert!(
        began.elapsed() >= SILENCE,
        "severed after {:?}",
        began.elapsed()
    );
    let report = proxy.report();
    let swallowed: HashSet<String> = report
        .swallowed
        .clone()
        .expect("a confirm was swallowed")
        .into_iter()
        .collect();
    assert_eq!(swallowed, ids(&lost));
    assert_eq!(
        report.passed,
        &(&ids(&batch) | &ids(&single)) | &ids(&alone)
    );
    assert_eq!((report.passed_messages, report.severed), (3, 1));

    // The broker took all four messages, the one whose confirm was lost included.
    let queue = namespace.topology().queue;
    let deadline = Instant::now() + Duration::from_secs(10);
    while namespace.queue_depth(&channel, &queue).await < 4 {
        assert!(Instant::now() < deadline, "the queue never held 4 messages");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(namespace.queue_depth(&channel, &queue).await, 4);

    // Another client's connection is forwarded, not followed; the proxy is disarmed.
    let other = seckill_messaging::connect(proxy.amqp_url(), "bystander", Duration::from_secs(10))
        .await
        .expect("connect through the proxy");
    let bystander = ConfirmedPublisher::open(&other, Duration::from_secs(10))
        .await
        .expect("a confirming channel");
    publish(&bystander, &namespace, &purchases(2))
        .await
        .expect("its confirm passes");
    let after = proxy.report();
    assert_eq!((after.connections, after.passed_messages), (1, 3));
    namespace.cleanup().await;
}
