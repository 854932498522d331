//! A publishing worker against the real broker (each test its own namespace), fed by hand so
//! the test decides what waits for it and when: what it must not publish.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use seckill_testkit::{LatencyProxy, TestNamespace};

use super::*;

/// A publisher of `ns` whose workers wait `timeout` for a batch's confirms.
async fn publisher(ns: &TestNamespace, timeout: Duration) -> OrderPublisher {
    OrderPublisher::new(
        ns.amqp_url.clone(),
        ns.topology(),
        OrderSigner::new("publisher-test-key"),
        seckill_store::postgres::connect_and_migrate(&ns.database_url, 2, Duration::from_secs(10))
            .await
            .expect("migrated database"),
        seckill_store::Redis::new(&ns.redis_url, ns.redis_cluster, 1).expect("redis handle"),
        PublishOptions {
            timeout,
            channels: 1,
            batch_max: 64,
            linger: Duration::ZERO,
        },
        Arc::new(AtomicBool::new(false)),
    )
}

/// A job as a handler queues it, and the handler's end of its answer. Its outbox entry is
/// in no stream (deleting it deletes nothing) unless the test writes one.
fn job(request_id: &str) -> (Job, oneshot::Receiver<Result<(), PublishError>>) {
    let (done, answer) = oneshot::channel();
    let job = Job {
        purchase: seckill_messaging::batch::Purchase {
            request_id: request_id.to_string(),
            http_request_id: format!("http-{request_id}"),
            payload: format!(r#"{{"request_id":"{request_id}"}}"#).into_bytes(),
            ..Default::default()
        },
        product_id: 1,
        entry: OutboxEntry {
            stream: "publisher-test:no-such-stream".to_string(),
            entry_id: "0-1".to_string(),
        },
        deadline: Instant::now() + Duration::from_secs(60),
        done,
    };
    (job, answer)
}

/// Its answer, which must come.
async fn answered(answer: oneshot::Receiver<Result<(), PublishError>>) -> Result<(), PublishError> {
    tokio::time::timeout(Duration::from_secs(30), answer)
        .await
        .expect("an answer within 30 s")
        .expect("the worker answers every job")
}

#[tokio::test]
async fn a_job_whose_handler_stopped_waiting_is_left_to_the_relay() {
    let ns = TestNamespace::new();
    let (connection, channel) = ns.channel().await;
    let confirmed = ConfirmedPublisher::open(&connection, Duration::from_secs(10))
        .await
        .expect("confirm channel");
    let (jobs, queued) = mpsc::channel(16);
    // This handler answered its 202 already (its wait timed out, or its request went away):
    // the purchase rests on the outbox, which the relay publishes.
    let (abandoned, gone) = job("abandoned");
    drop(gone);
    let (waited, answer) = job("waited");
    jobs.send(abandoned).await.expect("queue");
    jobs.send(waited).await.expect("queue");
    let worker = tokio::spawn(publisher(&ns, Duration::from_secs(10)).await.work(
        confirmed,
        queued,
        CancellationToken::new(),
    ));
    assert!(answered(answer).await.is_ok());
    // A batch goes out in order and is confirmed whole: whatever the worker published before
    // the answer above is in the queue by now.
    let queue = ns.topology().queue;
    assert_eq!(
        ns.queue_depth(&channel, &queue).await,
        1,
        "a purchase whose handler stopped waiting was published too"
    );
    drop(jobs);
    worker.await.expect("worker");
    let _ = connection.close(200, "test done".into()).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_job_past_its_deadline_is_answered_unpublished() {
    let ns = TestNamespace::new();
    let (connection, channel) = ns.channel().await;
    let confirmed = ConfirmedPublisher::open(&connection, Duration::from_secs(10))
        .await
        .expect("confirm channel");
    let (jobs, queued) = mpsc::channel(16);
    // Its handler is about to give up: a confirm could only come after it answered.
    let (mut late, late_answer) = job("late");
    late.deadline = Instant::now();
    let (waited, answer) = job("waited");
    jobs.send(late).await.expect("queue");
    jobs.send(waited).await.expect("queue");
    let worker = tokio::spawn(publisher(&ns, Duration::from_secs(10)).await.work(
        confirmed,
        queued,
        CancellationToken::new(),
    ));
    assert!(answered(answer).await.is_ok());
    assert!(matches!(
        answered(late_answer).await,
        Err(PublishError::TimedOut)
    ));
    let queue = ns.topology().queue;
    assert_eq!(ns.queue_depth(&channel, &queue).await, 1);
    drop(jobs);
    worker.await.expect("worker");
    let _ = connection.close(200, "test done".into()).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn no_batch_goes_out_on_a_channel_after_one_timed_out() {
    let ns = TestNamespace::new();
    ns.channel().await; // the topology declared
    // The worker's connection goes through a proxy that holds what it sends for a while
    // once the channel is open: with a bound of zero, no confirm can come before the bound
    // passes. (Without the proxy a confirm could: the bound is checked after the batch's
    // first poll, and a thread held up inside that poll on a busy machine let the broker's
    // confirm arrive in it, so the batch was confirmed, not timed out.)
    let broker = ns
        .amqp_url
        .rsplit_once('@')
        .map_or(ns.amqp_url.as_str(), |(_, at)| at)
        .trim_start_matches("amqp://")
        .split('/')
        .next()
        .expect("the broker's address")
        .to_string();
    let proxy = LatencyProxy::start(
        tokio::net::lookup_host(&broker)
            .await
            .expect("the broker's address")
            .next()
            .expect("an address"),
    )
    .await
    .expect("proxy");
    let through = ns.amqp_url.replacen(&broker, &proxy.addr().to_string(), 1);
    let connection = seckill_messaging::connect(&through, "test", Duration::from_secs(10))
        .await
        .expect("connect through the proxy");
    let publisher = publisher(&ns, Duration::ZERO).await;
    // Which of two ready branches a `select!` takes can be left to chance; so many rounds
    // that a worker leaving it to chance publishes again in one of them.
    for round in 0..16 {
        proxy.set_delay(Duration::ZERO);
        let confirmed = ConfirmedPublisher::open(&connection, Duration::from_secs(10))
            .await
            .expect("confirm channel");
        proxy.set_delay(Duration::from_millis(500));
        let (jobs, queued) = mpsc::channel(2 * MAX_BATCH);
        // One more than a batch: the last one waits while the first batch times out.
        let mut answers = Vec::with_capacity(MAX_BATCH + 1);
        for n in 0..=MAX_BATCH {
            let (queued_job, answer) = job(&format!("{round}-{n}"));
            jobs.send(queued_job).await.expect("queue");
            answers.push(answer);
        }
        publisher
            .clone()
            .work(confirmed, queued, CancellationToken::new())
            .await;
        let last = answers.pop().expect("the job past the first batch");
        for answer in answers {
            assert!(matches!(
                answered(answer).await,
                Err(PublishError::TimedOut)
            ));
        }
        let last = answered(last).await;
        assert!(
            matches!(last, Err(PublishError::NotConnected)),
            "round {round}: a batch went out on the channel after one timed out ({last:?})"
        );
        drop(jobs);
    }
    let _ = connection.close(200, "test done".into()).await;
    ns.cleanup().await;
}

#[tokio::test]
async fn purchases_waiting_together_go_out_as_batch_messages_of_at_most_the_maximum() {
    let ns = TestNamespace::new();
    let (connection, channel) = ns.channel().await;
    let confirmed = ConfirmedPublisher::open(&connection, Duration::from_secs(10))
        .await
        .expect("confirm channel");
    let (jobs, queued) = mpsc::channel(256);
    // 130 purchases waiting at once: two full messages of 64 and one of 2. A payload that
    // is no JSON value cannot stand inside a batch's body and goes alone. Each has its
    // outbox entry in one of three buckets' streams.
    let mut answers = Vec::new();
    let mut sent = Vec::new();
    let mut redis = ns.redis().await;
    let streams: Vec<String> = (0..3).map(|bucket| ns.keys().outbox(1, bucket)).collect();
    for n in 0..130 {
        let (mut queued_job, answer) = job(&format!("p{n:03}"));
        let stream = &streams[n % streams.len()];
        let entry_id: String = redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg("request_id")
            .arg(&queued_job.purchase.request_id)
            .query_async(&mut redis)
            .await
            .expect("XADD");
        queued_job.entry = OutboxEntry {
            stream: stream.clone(),
            entry_id,
        };
        sent.push(queued_job.purchase.request_id.clone());
        jobs.send(queued_job).await.expect("queue");
        answers.push(answer);
    }
    let (mut odd, odd_answer) = job("odd");
    odd.purchase.payload = b"not json".to_vec();
    jobs.send(odd).await.expect("queue");
    answers.push(odd_answer);
    let worker = tokio::spawn(publisher(&ns, Duration::from_secs(10)).await.work(
        confirmed,
        queued,
        CancellationToken::new(),
    ));
    for answer in answers {
        assert!(answered(answer).await.is_ok());
    }
    let queue = ns.topology().queue;
    let mut sizes = Vec::new();
    let mut published = Vec::new();
    while let Some(message) = channel
        .basic_get(
            queue.as_str().into(),
            lapin::options::BasicGetOptions { no_ack: true },
        )
        .await
        .expect("basic_get")
    {
        let delivery = message.delivery;
        if seckill_messaging::batch::is_batch(&delivery.properties) {
            let parts = seckill_messaging::batch::unpack(&delivery.data, &delivery.properties)
                .expect("a readable batch");
            sizes.push(parts.len());
            for part in parts {
                let body: serde_json::Value = serde_json::from_slice(&part.data).expect("json");
                published.push(body["request_id"].as_str().unwrap_or_default().to_string());
            }
        } else {
            sizes.push(1);
            assert_eq!(delivery.data, b"not json");
        }
    }
    assert_eq!(sizes, [64, 64, 2, 1]);
    assert_eq!(published, sent, "every purchase once, in order");
    // Confirmed before each answer, so deleted before it too: the relay has nothing left.
    for stream in &streams {
        let left: u64 = redis::cmd("XLEN")
            .arg(stream)
            .query_async(&mut redis)
            .await
            .expect("XLEN");
        assert_eq!(left, 0, "{stream} still holds published entries");
    }
    drop(jobs);
    worker.await.expect("worker");
    let _ = connection.close(200, "test done".into()).await;
    ns.cleanup().await;
}
