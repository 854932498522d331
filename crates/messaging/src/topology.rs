//! Exchange and queue names under a namespace, declared the same way by every service.
//!
//! ```text
//! {ns}.orders (direct) --order.created--> {ns}.orders.created (durable, DLX below)
//! {ns}.orders.dlx (fanout) ------------> {ns}.orders.dlq
//! ```
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
}

impl Topology {
    /// The names under `namespace`.
    pub fn new(namespace: &str) -> Self {
        Self {
            exchange: format!("{namespace}.orders"),
            routing_key: "order.created".to_string(),
            queue: format!("{namespace}.orders.created"),
            dead_letter_exchange: format!("{namespace}.orders.dlx"),
            dead_letter_queue: format!("{namespace}.orders.dlq"),
        }
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
        Ok(())
    }

    /// Deletes everything [`Topology::declare`] created (tests clean up after themselves).
    pub async fn delete(&self, channel: &Channel) -> lapin::Result<()> {
        for queue in [&self.queue, &self.dead_letter_queue] {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        for exchange in [&self.exchange, &self.dead_letter_exchange] {
            channel
                .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                .await?;
        }
        Ok(())
    }
}
