//! Reading a scenario's stores after the fault: when is the system quiet, and what does the
//! ledger hold then. Straight from Postgres, Redis and RabbitMQ's management API, never
//! through the services under test.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use uuid::Uuid;

use crate::stores::Probe;

/// How often the quiet wait looks.
const POLL_EVERY: Duration = Duration::from_millis(500);
/// How long everything must stay still: longer than the management API's figures can lag.
/// (A scenario's later buyers start only after it, so a product's time to resume measured
/// from the start of the stillness includes these 6 s.)
const STILL_FOR: Duration = Duration::from_secs(6);

/// One order row of the product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderRow {
    /// The purchase it records.
    pub request_id: Uuid,
    /// Its buyer.
    pub user_id: i64,
    /// Not cancelled: it holds a unit.
    pub live: bool,
}

/// The product's ledger once quiet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ledger {
    /// `products.stock_total`.
    pub stock_total: i64,
    /// Every order row of the product, cancelled ones included.
    pub orders: Vec<OrderRow>,
    /// Purchases parked as dead letters not given up: each holds its unit until an operator
    /// redrives or ignores it.
    pub parked: Vec<Uuid>,
    /// The Redis buckets' `remaining`, added up.
    pub redis_remaining: i64,
}

/// What is still moving, for the quiet wait and its progress line.
#[derive(Debug, Clone, Copy, Default)]
pub struct Motion {
    /// Accepted purchases with neither an order row nor a dead letter yet.
    pub unrecorded: i64,
    /// Entries in the product's outbox streams.
    pub outbox: i64,
    /// Messages in the namespace's queues, ready or unacknowledged.
    pub queued: u64,
    /// Compensations not yet carried out.
    pub compensating: i64,
    /// Unpaid orders whose payment window is still open, where the scenario waits for them
    /// to expire (their units come back when it does).
    pub expiring: i64,
}

impl Motion {
    fn still(&self) -> bool {
        self.unrecorded == 0
            && self.outbox == 0
            && self.queued == 0
            && self.compensating == 0
            && self.expiring == 0
    }
}

/// Read-only handles on a scenario's stores.
pub struct Books {
    /// Postgres and Redis, shared with the load tester's own reader.
    probe: Probe,
    http: reqwest::Client,
    /// `<management>/api/queues/%2f?columns=...`, without credentials.
    queues_url: String,
    /// The management API's user and password.
    credentials: (String, Option<String>),
    namespace: String,
    /// Whether open payment windows count as motion.
    awaiting_expiry: bool,
}

#[derive(Deserialize)]
struct QueueFigures {
    name: String,
    messages: Option<u64>,
}

impl Books {
    /// Connects to the scenario's database, Redis and the broker's management API.
    pub async fn connect(
        database_url: &str,
        redis_url: &str,
        namespace: &str,
        management_url: &str,
    ) -> anyhow::Result<Self> {
        let probe = Probe::connect(database_url, redis_url, namespace).await?;
        let mut management = reqwest::Url::parse(management_url).context("management URL")?;
        let credentials = (
            management.username().to_string(),
            management.password().map(str::to_string),
        );
        let _ = management.set_username("");
        let _ = management.set_password(None);
        Ok(Self {
            probe,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()?,
            queues_url: format!(
                "{}/api/queues/%2f?columns=name,messages",
                management.as_str().trim_end_matches('/')
            ),
            credentials,
            namespace: namespace.to_string(),
            awaiting_expiry: false,
        })
    }

    /// The same books, counting unpaid orders whose payment window is open as motion when
    /// `awaiting` (a scenario whose orders expire waits for their units to come back).
    pub fn awaiting_expiry(mut self, awaiting: bool) -> Self {
        self.awaiting_expiry = awaiting;
        self
    }

    /// Entries in the product's outbox streams now.
    pub async fn outbox_len(&self, product_id: i64) -> anyhow::Result<i64> {
        self.probe.outbox_len(product_id).await
    }

    /// The request ids in the product's outbox streams now.
    pub async fn outbox_request_ids(&self, product_id: i64) -> anyhow::Result<Vec<Uuid>> {
        self.probe.outbox_request_ids(product_id).await
    }

    /// Of the request ids `forged`: how many have an order row, and how many a parking-lot
    /// entry.
    pub async fn forgeries(&self, forged: &[Uuid]) -> anyhow::Result<(i64, i64)> {
        let ordered: i64 =
            sqlx::query_scalar("SELECT count(*) FROM orders WHERE request_id = ANY($1)")
                .bind(forged)
                .fetch_one(self.probe.db())
                .await
                .context("looking up forged orders")?;
        let ids: Vec<String> = forged.iter().map(Uuid::to_string).collect();
        let parked: i64 =
            sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE event_id = ANY($1)")
                .bind(&ids)
                .fetch_one(self.probe.db())
                .await
                .context("looking up parked forgeries")?;
        Ok((ordered, parked))
    }

    /// Waits until every accepted purchase is recorded, the outbox is empty, the queues hold
    /// nothing and no compensation is pending, without a change for [`STILL_FOR`] (the
    /// management API's figures lag), or until `timeout`. A store that does not answer counts as "not yet":
    /// the wait goes on across an outage. Returns whether it went quiet, and the last motion.
    pub async fn wait_until_quiet(
        &self,
        product_id: i64,
        accepted: &[Uuid],
        timeout: Duration,
    ) -> (bool, Motion) {
        let (quiet, motion, _) = self.quiet_since(product_id, accepted, timeout).await;
        (quiet, motion)
    }

    /// [`Self::wait_until_quiet`], also returning since when it was still (the first of the
    /// readings that found nothing in flight).
    pub async fn quiet_since(
        &self,
        product_id: i64,
        accepted: &[Uuid],
        timeout: Duration,
    ) -> (bool, Motion, Option<Instant>) {
        let started = Instant::now();
        let mut still_since: Option<Instant> = None;
        let mut last = Motion::default();
        loop {
            match self.motion(product_id, accepted).await {
                Ok(motion) if motion.still() => {
                    last = motion;
                    let since = *still_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= STILL_FOR {
                        return (true, last, Some(since));
                    }
                }
                Ok(motion) => {
                    last = motion;
                    still_since = None;
                }
                Err(_) => still_since = None,
            }
            if started.elapsed() >= timeout {
                return (false, last, still_since);
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    async fn motion(&self, product_id: i64, accepted: &[Uuid]) -> anyhow::Result<Motion> {
        let unrecorded: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM unnest($1::uuid[]) AS a(id) \
             WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.request_id = a.id) \
               AND NOT EXISTS (SELECT 1 FROM dead_letters d WHERE d.event_id = a.id::text)",
        )
        .bind(accepted)
        .fetch_one(self.probe.db())
        .await
        .context("looking up accepted purchases")?;
        let compensating: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM compensations WHERE product_id = $1 AND done_at IS NULL",
        )
        .bind(product_id)
        .fetch_one(self.probe.db())
        .await
        .context("counting pending compensations")?;
        let expiring: i64 = if self.awaiting_expiry {
            sqlx::query_scalar(
                "SELECT count(*) FROM orders \
                 WHERE product_id = $1 AND status = 'created' AND pay_by > now()",
            )
            .bind(product_id)
            .fetch_one(self.probe.db())
            .await
            .context("counting orders in their payment window")?
        } else {
            0
        };
        Ok(Motion {
            unrecorded,
            outbox: self.probe.outbox_len(product_id).await?,
            queued: self.queued().await?,
            compensating,
            expiring,
        })
    }

    /// Messages in the namespace's queues, ready or unacknowledged.
    async fn queued(&self) -> anyhow::Result<u64> {
        let queues: Vec<QueueFigures> = self
            .http
            .get(&self.queues_url)
            .basic_auth(&self.credentials.0, self.credentials.1.as_ref())
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let prefix = format!("{}.", self.namespace);
        Ok(queues
            .iter()
            .filter(|q| q.name.starts_with(&prefix))
            // No figures: RabbitMQ 3.10 stops reporting a quorum queue's figures once its
            // leader's node died, and never reports them again while that node is down (seen
            // in rabbitmq-node-lost). Counted as empty; a new queue's missing first figures
            // cannot pass for quiet anyway, because quiet needs STILL_FOR (6 s) at figures
            // refreshed every 500 ms, and every 202 recorded.
            .map(|q| q.messages.unwrap_or(0))
            .sum())
    }

    /// The product's ledger as the stores hold it now.
    pub async fn ledger(&self, product_id: i64) -> anyhow::Result<Ledger> {
        let stock_total = self
            .probe
            .stock_total(product_id)
            .await?
            .with_context(|| format!("product {product_id} vanished"))?;
        let orders = sqlx::query_as::<_, (Uuid, i64, String)>(
            "SELECT request_id, user_id, status FROM orders WHERE product_id = $1",
        )
        .bind(product_id)
        .fetch_all(self.probe.db())
        .await
        .context("reading orders")?
        .into_iter()
        .map(|(request_id, user_id, status)| OrderRow {
            request_id,
            user_id,
            live: status != "cancelled",
        })
        .collect();
        // A message refused for its signature holds nothing: nobody bought under it.
        let parked = sqlx::query_scalar::<_, String>(
            "SELECT event_id FROM dead_letters \
             WHERE product_id = $1 AND status IN ('pending', 'quarantined', 'redriven') \
               AND error_code NOT IN ('unsigned', 'bad_signature') \
               AND NOT EXISTS (SELECT 1 FROM orders o WHERE o.request_id::text = event_id)",
        )
        .bind(product_id)
        .fetch_all(self.probe.db())
        .await
        .context("reading dead letters")?
        .iter()
        .filter_map(|id| id.parse().ok())
        .collect();
        Ok(Ledger {
            stock_total,
            orders,
            parked,
            redis_remaining: self.probe.redis_remaining(product_id).await?,
        })
    }
}
