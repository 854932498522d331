//! Redis lost a product's ledger: sell none of it until every purchase in flight has landed.
//!
//! A product whose stock was once loaded (`products.ledger_loaded`) and whose buckets
//! are gone before its keys could have expired was wiped from Redis: a restart without
//! persistence, a flush, an evicted stock hash. (A failover to a replica that lagged but kept
//! the bucket hashes is not seen here; docs/DESIGN.md says what guards that.) Loading it again at once
//! would count only the purchases already in Postgres; those still in the outbox or in
//! RabbitMQ (accepted, answered `202`) would be sold a second time, and their buyers could
//! buy twice. So such a load waits until nothing is in flight: the product's outbox streams
//! are empty and the namespace's order queues (main, retry tiers, dead letters) hold no
//! message — ready, unacknowledged, or dead-lettered and not yet confirmed by its target —
//! as RabbitMQ's management API counts them. Until then purchases of the product answer
//! `503 ledger_rebuilding` with `Retry-After`. Dead letters recorded in Postgres and
//! unfinished compensations are counted by the load itself (`seckill_store::ledger`).
//!
//! The management API publishes queue figures every few seconds, so one reading of zero
//! may be stale: the queues count as drained only after two zero readings at least
//! [`STATS_INTERVAL`] apart, the first taken once the fence has stood that long (by then
//! every publish begun before the loss has been confirmed or abandoned).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Context;
use reqwest::Url;
use serde::Deserialize;

/// How stale RabbitMQ's queue figures may be (its default statistics interval is 5 s).
pub const STATS_INTERVAL: Duration = Duration::from_secs(6);

/// Counts what is in flight in RabbitMQ and remembers each fenced product's readings.
#[derive(Debug)]
pub struct Fence {
    http: reqwest::Client,
    /// `<management>/api/queues/<vhost>`.
    queues: Url,
    user: String,
    password: String,
    /// Queues of the order flow start with this.
    prefix: String,
    readings: Mutex<HashMap<i64, Readings>>,
}

#[derive(Debug, Clone, Copy)]
struct Readings {
    since: Instant,
    first_zero: Option<Instant>,
    /// When the last check answered "not yet" (purchases meanwhile are refused at once).
    refused_at: Option<Instant>,
}

/// How long a "not yet" stands before the next purchase checks again.
const RECHECK_AFTER: Duration = Duration::from_millis(500);
/// A fence this long without a check has been left behind: another replica rebuilt the
/// ledger and purchases no longer come here. A later check starts a new fence, so an old
/// reading never speaks for a new loss.
const FORGOTTEN_AFTER: Duration = Duration::from_secs(12);

#[derive(Debug, Deserialize)]
struct Queue {
    name: String,
    /// Ready plus unacknowledged, plus for a quorum queue the dead letters it keeps until
    /// their target confirmed them (`messages_dlx`, `at-least-once`: counted in `messages`
    /// from RabbitMQ 3.10 on); absent until the broker has figures for the queue.
    messages: Option<u64>,
}

impl Fence {
    /// A fence reading the management API at `management_url` (empty: port 15672 on the
    /// AMQP URL's host, with its user, password and vhost).
    pub fn new(amqp_url: &str, management_url: &str, namespace: &str) -> anyhow::Result<Self> {
        let amqp = Url::parse(amqp_url).context("parse the AMQP URL")?;
        let vhost = match amqp.path().trim_start_matches('/') {
            "" => "/".to_string(),
            encoded => percent_decode(encoded),
        };
        let mut base = if management_url.is_empty() {
            let host = amqp.host_str().unwrap_or("127.0.0.1");
            Url::parse(&format!("http://{host}:15672")).context("management URL")?
        } else {
            Url::parse(management_url).context("parse the management URL")?
        };
        let source = if management_url.is_empty() {
            &amqp
        } else {
            &base
        };
        let user = percent_decode(source.username());
        let password = percent_decode(source.password().unwrap_or_default());
        let _ = base.set_username("");
        let _ = base.set_password(None);
        let mut queues = base;
        queues
            .path_segments_mut()
            .map_err(|()| anyhow::anyhow!("the management URL cannot take a path"))?
            .pop_if_empty()
            .extend(["api", "queues", &vhost]);
        Ok(Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()?,
            queues,
            user: if user.is_empty() {
                "guest".into()
            } else {
                user
            },
            password: if password.is_empty() {
                "guest".into()
            } else {
                password
            },
            prefix: format!("{namespace}.orders"),
            readings: Mutex::new(HashMap::new()),
        })
    }

    /// Whether everything in flight has landed, for a fenced product whose outbox streams
    /// hold `outbox` entries. The first call for a product starts its fence (so does one
    /// after the fence was left unchecked for [`FORGOTTEN_AFTER`]). A management API that
    /// cannot be asked means "not yet".
    pub async fn drained(&self, product_id: i64, outbox: i64) -> anyhow::Result<bool> {
        let now = Instant::now();
        let fresh = Readings {
            since: now,
            first_zero: None,
            refused_at: Some(now),
        };
        let readings = {
            let mut all = self.lock();
            let entry = all.entry(product_id).or_insert(fresh);
            if entry
                .refused_at
                .is_none_or(|at| now.duration_since(at) > FORGOTTEN_AFTER)
            {
                *entry = fresh;
            }
            *entry
        };
        let drained = if now.duration_since(readings.since) < STATS_INTERVAL {
            false
        } else {
            // An error (the management API down) is a "not yet" like any other.
            let queued = if outbox > 0 {
                1
            } else {
                self.queued().await.unwrap_or(1)
            };
            let mut all = self.lock();
            let entry = all.entry(product_id).or_insert(readings);
            match entry.first_zero {
                _ if outbox > 0 || queued > 0 => {
                    entry.first_zero = None;
                    false
                }
                None => {
                    entry.first_zero = Some(now);
                    false
                }
                Some(first) => now.duration_since(first) >= STATS_INTERVAL,
            }
        };
        if !drained && let Some(entry) = self.lock().get_mut(&product_id) {
            entry.refused_at = Some(now);
        }
        Ok(drained)
    }

    /// Whether the product is fenced and was found not drained a moment ago: refuse without
    /// asking again.
    pub fn refused_recently(&self, product_id: i64) -> bool {
        self.lock()
            .get(&product_id)
            .and_then(|r| r.refused_at)
            .is_some_and(|at| at.elapsed() < RECHECK_AFTER)
    }

    /// The product's ledger was rebuilt: a later loss starts a new fence.
    pub fn lift(&self, product_id: i64) {
        self.lock().remove(&product_id);
    }

    /// Whether a fence stands for the product on this replica (checked recently).
    pub fn is_up(&self, product_id: i64) -> bool {
        self.lock()
            .get(&product_id)
            .and_then(|r| r.refused_at)
            .is_some_and(|at| at.elapsed() <= FORGOTTEN_AFTER)
    }

    /// Messages in the namespace's order queues, ready or unacknowledged. A queue the broker
    /// has no figures for yet counts as one.
    async fn queued(&self) -> anyhow::Result<u64> {
        let mut url = self.queues.clone();
        url.set_query(Some("columns=name,messages"));
        let queues: Vec<Queue> = self
            .http
            .get(url)
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .context("ask the RabbitMQ management API")?
            .error_for_status()
            .context("RabbitMQ management API")?
            .json()
            .await
            .context("read the queue list")?;
        Ok(queues
            .iter()
            .filter(|q| q.name.starts_with(&self.prefix))
            .map(|q| q.messages.unwrap_or(1))
            .sum())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Readings>> {
        self.readings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `%2f` → `/` (URL user info and vhost paths are percent-encoded).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_management_url_follows_the_amqp_url() {
        let fence = Fence::new("amqp://alice:s%40cret@broker:5672/%2f", "", "ns").unwrap();
        assert_eq!(fence.queues.as_str(), "http://broker:15672/api/queues/%2F");
        assert_eq!(
            (fence.user.as_str(), fence.password.as_str()),
            ("alice", "s@cret")
        );
        let fence = Fence::new(
            "amqp://guest:guest@127.0.0.1:5672/sales",
            "http://ops:pw@mq.internal:8080",
            "ns",
        )
        .unwrap();
        assert_eq!(
            fence.queues.as_str(),
            "http://mq.internal:8080/api/queues/sales"
        );
        assert_eq!(
            (fence.user.as_str(), fence.password.as_str()),
            ("ops", "pw")
        );
        assert_eq!(fence.prefix, "ns.orders");
    }
}
