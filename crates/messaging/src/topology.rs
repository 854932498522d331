//! Exchange and queue names under a namespace, declared the same way by every service.
//!
//! ```text
//! {ns}.orders (direct) --order.created--> {ns}.orders.created (DLX below)
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
//!
//! The queues are quorum queues unless `SECKILL_AMQP_QUEUE_TYPE=classic` (see [`QueueType`]):
//! durable, non-exclusive, not auto-deleted, as quorum queues must be. The two that
//! dead-letter — the main queue (into the DLX) and each retry tier (back to the main
//! exchange) — do so `at-least-once`: the broker keeps a dead letter in its source queue
//! until the target queue confirmed it, instead of dropping it when the target is missing
//! or full. RabbitMQ allows that only with `x-overflow = reject-publish` on the source.
//! The main queue also has a delivery limit, [`DELIVERY_LIMIT`]: a backstop for a message
//! whose every delivery crashes its consumer, never the consumer's own way of giving up.
//! A queue's type and arguments cannot change once declared: an existing namespace must
//! be drained and its classic queues deleted before services declaring quorum queues start
//! in it (or keep `classic`).

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, ExchangeKind};

pub use seckill_config::AmqpQueueType as QueueType;

/// The most times order-service hands one delivery back to the main queue itself (a nack
/// with requeue: the database unavailable, the breaker refusing calls, a pause). A delivery
/// the queue has already returned this often is instead published again as a fresh copy
/// and acked (`x-delivery-count` starts over), so the consumer never nears the limit below.
pub const MAX_REQUEUES: u32 = 10;

/// `x-delivery-limit` of the main quorum queue: returns after which the broker dead-letters
/// a message itself. Twice [`MAX_REQUEUES`], so it is reached only by a message that went
/// unsettled — its consumer crashed or lost its channel — on at least `MAX_REQUEUES` more
/// deliveries in a row: a poison message. Retries never count toward it: a retry is a new
/// message published to a tier and comes back with a count of its own.
pub const DELIVERY_LIMIT: u32 = 2 * MAX_REQUEUES;

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
    /// The type of every queue above.
    pub queue_type: QueueType,
}

/// The retry tiers used unless a service configures others.
pub const DEFAULT_RETRY_TIERS_MS: [u64; 3] = [1_000, 5_000, 30_000];

impl Topology {
    /// The names under `namespace`, with quorum queues.
    pub fn new(namespace: &str) -> Self {
        Self {
            exchange: format!("{namespace}.orders"),
            routing_key: "order.created".to_string(),
            queue: format!("{namespace}.orders.created"),
            dead_letter_exchange: format!("{namespace}.orders.dlx"),
            dead_letter_queue: format!("{namespace}.orders.dlq"),
            retry_exchange: format!("{namespace}.orders.retry"),
            retry_tiers_ms: DEFAULT_RETRY_TIERS_MS.to_vec(),
            queue_type: QueueType::Quorum,
        }
    }

    /// The same names with these retry tiers (shortest first).
    pub fn with_retry_tiers(mut self, tiers_ms: Vec<u64>) -> Self {
        self.retry_tiers_ms = tiers_ms;
        self
    }

    /// The same names with queues of this type.
    pub fn with_queue_type(mut self, queue_type: QueueType) -> Self {
        self.queue_type = queue_type;
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
                self.arguments(),
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
        let mut args = self.dead_lettering_arguments(&self.dead_letter_exchange, None);
        if self.queue_type == QueueType::Quorum {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(i64::from(DELIVERY_LIMIT)),
            );
        }
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
            let mut args = self.dead_lettering_arguments(&self.exchange, Some(&self.routing_key));
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
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

    /// `x-queue-type` for quorum; nothing for classic, exactly as classic queues were
    /// declared before the setting existed, so they redeclare without a clash.
    fn arguments(&self) -> FieldTable {
        let mut args = FieldTable::default();
        if self.queue_type == QueueType::Quorum {
            args.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        args
    }

    /// The arguments of a queue that dead-letters into `exchange` (with `routing_key`, else
    /// the message's own): at least once on a quorum queue, which requires reject-publish.
    fn dead_lettering_arguments(&self, exchange: &str, routing_key: Option<&str>) -> FieldTable {
        let mut args = self.arguments();
        args.insert(
            "x-dead-letter-exchange".into(),
            AMQPValue::LongString(exchange.into()),
        );
        if let Some(key) = routing_key {
            args.insert(
                "x-dead-letter-routing-key".into(),
                AMQPValue::LongString(key.into()),
            );
        }
        if self.queue_type == QueueType::Quorum {
            args.insert(
                "x-dead-letter-strategy".into(),
                AMQPValue::LongString("at-least-once".into()),
            );
            args.insert(
                "x-overflow".into(),
                AMQPValue::LongString("reject-publish".into()),
            );
        }
        args
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
