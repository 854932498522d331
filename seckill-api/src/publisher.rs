//! Publishing accepted purchases from the request path, so that a `202` means "RabbitMQ has
//! it", not "Redis has it".
//!
//! The purchase script still records the order intent in the bucket's outbox stream in the
//! same atomic step that takes the unit (a crash right after it loses nothing). Then the
//! handler publishes the intent itself with a publisher confirm, bounded by
//! `publish_timeout_ms`, and only once the broker confirmed it answers `202` and deletes the
//! outbox entry. If the broker is unreachable, slow or refuses the message, the handler
//! answers `202` anyway and leaves the entry to the relay (`crate::relay`), which publishes
//! whatever the handlers left behind once it is older than the relay's grace: then, and only
//! then, the `202`'s durability is Redis' own (see `seckill_store::probes` for the start-up
//! check of Redis' persistence).
//!
//! Channels: a small pool, each with **one publish in flight at a time**. lapin attaches a
//! `mandatory` message the broker returned to whichever confirm it resolves next, so with
//! several publishes pending on one channel a returned message could be credited to another
//! request, whose entry would then be deleted although its message was lost. With one
//! pending publish per channel the confirm that carries the return is its own. Concurrency
//! comes from the pool (`publish_channels`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Confirmation, Connection};
use tokio::sync::{Mutex, Semaphore};
use tokio_util::sync::CancellationToken;

use seckill_messaging::Topology;

/// Publishes order messages with a confirm, from any request; cheap to clone.
#[derive(Clone)]
pub struct OrderPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    amqp_url: String,
    topology: Topology,
    /// Longest a request waits for a channel and the broker's confirm.
    timeout: Duration,
    /// Channels per connection.
    channels: usize,
    /// The open connection and its channels; `None` while the broker is unreachable.
    link: RwLock<Option<Arc<Link>>>,
    /// True while connected (read by `/readyz`).
    connected: Arc<AtomicBool>,
}

/// One broker connection and the idle channels of its pool.
struct Link {
    connection: Connection,
    idle: Mutex<Vec<Channel>>,
    permits: Semaphore,
}

/// A channel taken from the pool: closed when dropped unless given back.
struct Lent(Option<Channel>);

impl Lent {
    fn get(&self) -> &Channel {
        self.0
            .as_ref()
            .expect("a lent channel is present until given back")
    }

    fn give_back(&mut self) -> Channel {
        self.0.take().expect("given back once")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(channel) = self.0.take() {
            tokio::spawn(async move { channel.close(200, "publish abandoned".into()).await });
        }
    }
}

impl std::fmt::Debug for OrderPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderPublisher")
            .field("timeout", &self.inner.timeout)
            .field("channels", &self.inner.channels)
            .finish_non_exhaustive()
    }
}

/// Why a publish did not get a plain confirm: the handler leaves the intent to the relay.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// No connection to the broker right now.
    #[error("not connected to the broker")]
    NotConnected,
    /// No channel or no confirm within the timeout.
    #[error("no confirm within the timeout")]
    TimedOut,
    /// The broker nacked or returned it (unroutable).
    #[error("the broker did not take the message: {0}")]
    Refused(&'static str),
    /// The channel failed.
    #[error("channel: {0}")]
    Channel(#[from] lapin::Error),
}

impl OrderPublisher {
    /// A publisher to `amqp_url`; it connects once [`OrderPublisher::run`] runs.
    pub fn new(
        amqp_url: String,
        topology: Topology,
        timeout: Duration,
        channels: usize,
        connected: Arc<AtomicBool>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                amqp_url,
                topology,
                timeout,
                channels: channels.max(1),
                link: RwLock::new(None),
                connected,
            }),
        }
    }

    /// Publishes one order message and waits for the broker's confirm (bounded).
    pub async fn publish(
        &self,
        request_id: &str,
        http_request_id: &str,
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let link = self
            .inner
            .link
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .ok_or(PublishError::NotConnected)?;
        // Every step may stall (a broker that stops reading from publishers blocks even the
        // publish itself), so the whole of it is bounded.
        tokio::time::timeout(
            self.inner.timeout,
            self.publish_on(&link, request_id, http_request_id, payload),
        )
        .await
        .map_err(|_| PublishError::TimedOut)?
    }

    async fn publish_on(
        &self,
        link: &Link,
        request_id: &str,
        http_request_id: &str,
        payload: &[u8],
    ) -> Result<(), PublishError> {
        let _permit = link
            .permits
            .acquire()
            .await
            .map_err(|_| PublishError::NotConnected)?;
        let idle = link.idle.lock().await.pop();
        let channel = match idle {
            Some(channel) if channel.status().connected() => channel,
            _ => {
                let channel = link.connection.create_channel().await?;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                channel
            }
        };
        // Until its confirm is in, the channel is closed if this future is dropped (the
        // timeout): a late confirm would otherwise be taken for the next publish's.
        let mut channel = Lent(Some(channel));
        let confirm = seckill_messaging::publish_order(
            channel.get(),
            &self.inner.topology,
            request_id,
            http_request_id,
            payload,
        )
        .await?;
        let confirmation = confirm.await?;
        link.idle.lock().await.push(channel.give_back());
        match confirmation {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(_)) => Err(PublishError::Refused("returned as unroutable")),
            Confirmation::Nack(_) => Err(PublishError::Refused("nacked")),
            Confirmation::NotRequested => Err(PublishError::Refused("no confirm requested")),
        }
    }

    /// Keeps a connection open until `cancel`, reconnecting with backoff.
    pub async fn run(self, cancel: CancellationToken) -> anyhow::Result<()> {
        let mut backoff = Duration::from_millis(200);
        while !cancel.is_cancelled() {
            match self.connect().await {
                Ok(link) => {
                    backoff = Duration::from_millis(200);
                    self.set(Some(link.clone()));
                    tracing::info!("order publisher connected");
                    while link.connection.status().connected() {
                        tokio::select! {
                            _ = cancel.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                        }
                    }
                    self.set(None);
                    link.permits.close();
                    let _ = link
                        .connection
                        .close(200, "publisher stopping".into())
                        .await;
                    if !cancel.is_cancelled() {
                        tracing::warn!("order publisher lost its connection");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), ?backoff, "order publisher down");
                    tokio::select! {
                        _ = cancel.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
        Ok(())
    }

    fn set(&self, link: Option<Arc<Link>>) {
        self.inner
            .connected
            .store(link.is_some(), Ordering::Relaxed);
        *self
            .inner
            .link
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = link;
    }

    async fn connect(&self) -> anyhow::Result<Arc<Link>> {
        let connection = seckill_messaging::connect(
            &self.inner.amqp_url,
            "seckill-api publisher",
            Duration::ZERO,
        )
        .await?;
        let channel = connection.create_channel().await?;
        self.inner
            .topology
            .declare(&channel)
            .await
            .context("declare topology")?;
        let _ = channel.close(200, "declared".into()).await;
        Ok(Arc::new(Link {
            connection,
            idle: Mutex::new(Vec::with_capacity(self.inner.channels)),
            permits: Semaphore::new(self.inner.channels),
        }))
    }
}
