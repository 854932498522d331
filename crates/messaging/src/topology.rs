//! Exchange and queue names under a namespace, declared the same way by every service.
//!
//! ```text
//! {ns}.orders (direct) --order.created--> {ns}.orders.created (durable, DLX below)
//! {ns}.orders.dlx (fanout) ------------> {ns}.orders.dlq
//! {ns}.orders.retry (direct) --retry.<ms>ms--> {ns}.orders.retry.<ms>ms
//!     (one queue per tier, x-message-ttl = <ms>, dead-lettered back to {ns}.orders with
//!      order.created: a message waits out its tier, then is consumed again)
//! ```
//! Each retry tier has one fixed TTL on its queue, never a per-message TTL: RabbitMQ expires
//! messages only at the head of a queue, so mixed per-message TTLs would let one long delay
//! hold back every shorter one behind it. A tier is named by its delay, so changing the
//! tiers declares new queues instead of clashing with the old ones' arguments.
//! Declarations are idempotent: whichever service starts first creates them, the others
//! confirm the same arguments (RabbitMQ refuses a redeclaration with different ones).

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

/// The names of one namespace's AMQP objects.
#[derive(Debug, Clone)]
pub struct Topology {
    /// Where seckill-api publishes accepted purchases.
    pub exchange: String,
    /// The routing key of an accepted purchase.
    pub routing_key: String,
    /// What order-service consumes.
    pub queue: String,
    /// Receives what the queue rejects without requeue.
    pub dead_letter_exchange: String,
    /// Holds dead letters for the operator.
    pub dead_letter_queue: String,
    /// Where transient failures are published to wait out a retry tier.
    pub retry_exchange: String,
    /// Retry tier delays, shortest first.
    pub retry_tiers_ms: Vec<u64>,
}

/// The retry tiers used unless a service configures others.
pub const DEFAULT_RETRY_TIERS_MS: [u64; 3] = [1_000, 5_000, 30_000];

impl Topology {
    /// The names under `namespace`.
    pub fn new(namespace: &str) -> Self {
        Self {
            exchange: format!("{namespace}.orders"),
            routing_key: "order.created".to_string(),
            queue: format!("{namespace}.orders.created"),
            dead_letter_exchange: format!("{namespace}.orders.dlx"),
            dead_letter_queue: format!("{namespace}.orders.dlq"),
            retry_exchange: format!("{namespace}.orders.retry"),
            retry_tiers_ms: DEFAULT_RETRY_TIERS_MS.to_vec(),
        }
    }

    /// The same names with these retry tiers (shortest first).
    pub fn with_retry_tiers(mut self, tiers_ms: Vec<u64>) -> Self {
        self.retry_tiers_ms = tiers_ms;
        self
    }

    /// The queue of the retry tier that waits `delay_ms`.
    pub fn retry_queue(&self, delay_ms: u64) -> String {
        format!("{}.{delay_ms}ms", self.retry_exchange)
    }

    /// The routing key of the retry tier that waits `delay_ms`.
    pub fn retry_routing_key(delay_ms: u64) -> String {
        format!("retry.{delay_ms}ms")
    }

    /// Declares every exchange, queue and binding (durable).
    pub async fn declare(&self, channel: &Channel) -> lapin::Result<()> {
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                self.dead_letter_exchange.as_str().into(),
                ExchangeKind::Fanout,
                durable,
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_declare(
                self.dead_letter_queue.as_str().into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await?;
        channel
            .queue_bind(
                self.dead_letter_queue.as_str().into(),
                self.dead_letter_exchange.as_str().into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;

        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Direct,
                durable,
                FieldTable::default(),
            )
            .await?;
        let mut args = FieldTable::default();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(self.dead_letter_exchange.as_str().into()),
        );
        channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions::durable(),
                args,
            )
            .await?;
        channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                self.routing_key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        self.declare_retry_tiers(channel).await
    }

    async fn declare_retry_tiers(&self, channel: &Channel) -> lapin::Result<()> {
        channel
            .exchange_declare(
                self.retry_exchange.as_str().into(),
                ExchangeKind::Direct,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await?;
        for &delay_ms in &self.retry_tiers_ms {
            let mut args = FieldTable::default();
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
            );
            args.insert(
                "x-dead-letter-exchange".into(),
                AMQPValue::LongString(self.exchange.as_str().into()),
            );
            args.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(self.routing_key.as_str().into()),
            );
            let queue = self.retry_queue(delay_ms);
            channel
                .queue_declare(queue.as_str().into(), QueueDeclareOptions::durable(), args)
                .await?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    self.retry_exchange.as_str().into(),
                    Self::retry_routing_key(delay_ms).as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await?;
        }
        Ok(())
    }

    /// Deletes everything [`Topology::declare`] created (tests clean up after themselves).
    pub async fn delete(&self, channel: &Channel) -> lapin::Result<()> {
        let retry_queues: Vec<String> = self
            .retry_tiers_ms
            .iter()
            .map(|&ms| self.retry_queue(ms))
            .collect();
        for queue in [&self.queue, &self.dead_letter_queue]
            .into_iter()
            .chain(&retry_queues)
        {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        for exchange in [
            &self.exchange,
            &self.dead_letter_exchange,
            &self.retry_exchange,
        ] {
            channel
                .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                .await?;
        }
        Ok(())
    }
}
