//! seckill-api settings: `SECKILL_*` shared with the other services, `SECKILL_API_*` its own.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use seckill_config::{BackendSettings, Validate};

/// Everything seckill-api reads at start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// Stores, namespace, identity key and logging, shared with order-service.
    #[serde(flatten)]
    pub backend: BackendSettings,
    /// Port to bind; 0 picks a free one (tests).
    pub port: u16,
    /// Multiplexed Redis connections (1–8; each carries any number of concurrent commands).
    pub redis_pool_size: usize,
    /// Postgres connections in the pool.
    pub db_pool_size: u32,
    /// Lazy-load lock lifetime; shorter than a request's deadline so a dead loader frees it.
    #[serde(rename = "load_lock_ttl_ms", with = "seckill_config::formats::millis")]
    pub load_lock_ttl: Duration,
    /// How long a request waits for another replica's load before answering 503.
    #[serde(rename = "load_wait_ms", with = "seckill_config::formats::millis")]
    pub load_wait: Duration,
    /// Product metadata L1 cache lifetime (randomised ±20 % per entry).
    #[serde(
        rename = "product_cache_ttl_secs",
        with = "seckill_config::formats::secs"
    )]
    pub product_cache_ttl: Duration,
    /// Product ids the bloom filter is sized for; past this its false-positive rate climbs,
    /// so a rebuild sizes it for twice the products found (and logs a warning).
    pub bloom_expected_products: usize,
    /// The bloom filter's false-positive rate at `bloom_expected_products` ids, in (0, 0.5].
    pub bloom_fp_rate: f64,
    /// How long Redis remembers "no such product" for an id the bloom filter let through
    /// (randomised ±20 %); also how long such an id may stay 404 after being created elsewhere
    /// than through this API.
    #[serde(rename = "null_cache_ttl_ms", with = "seckill_config::formats::millis")]
    pub null_cache_ttl: Duration,
    /// Outbox entries the relay reads and publishes per round.
    pub relay_batch: usize,
    /// Outbox entries pending this long are the relay's to publish: taken over from a replica
    /// that died, or (with `publish_on_accept`) left behind by a handler whose publish failed.
    /// Must exceed `publish_timeout_ms` (plus `redis_wait_timeout_ms` when a wait for copies is
    /// asked for), or the relay races the handlers.
    #[serde(
        rename = "relay_reclaim_idle_ms",
        with = "seckill_config::formats::millis"
    )]
    pub relay_reclaim_idle: Duration,
    /// Whether the purchase handler publishes the order message itself and answers `202`
    /// once RabbitMQ confirmed it (else the relay publishes everything, after the answer).
    pub publish_on_accept: bool,
    /// Longest a purchase waits for a channel and the broker's confirm before it answers
    /// `202` on the strength of the outbox alone (with `redis_wait_timeout_ms`, when a wait
    /// is asked for, below 6000: after Redis lost a ledger, its fence stands the wait and
    /// twice this long, see `stock::fence`).
    #[serde(
        rename = "publish_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub publish_timeout: Duration,
    /// Channels the handlers' messages are published on, each by a worker that publishes
    /// whatever waits for it as one batch (see `crate::publisher`). One by default: every
    /// purchase that arrives while a batch waits for its confirms joins the next batch, so
    /// the broker confirms more messages at once (docs/benchmarks.md, "accepted path").
    pub publish_channels: usize,
    /// Purchases one order message carries at most (group commit, DESIGN.md §5): a
    /// publishing worker, and the relay, send what they gather at once as messages of up to
    /// this many, each purchase signed on its own, so the broker stores, confirms, delivers
    /// and acks one message for all of them. 1 sends one message per purchase, the only
    /// format an order-service older than batches reads: set it while one may still consume.
    pub publish_batch_max: usize,
    /// How long a publishing worker that found fewer than `publish_batch_max` purchases
    /// waiting waits for more before it publishes (microseconds, at most 1000). 0 by default:
    /// purchases that arrive while a batch waits for its confirm form the next batch anyway,
    /// so under load batches fill without any wait, and a lone purchase is not delayed.
    pub publish_linger_us: u64,
    /// Refuse to start when Redis could lose an acknowledged write: `appendonly no`, or a
    /// `maxmemory-policy` other than `noeviction` (read with `CONFIG GET` on the server, or on
    /// every seed node of a cluster; a Redis that refuses `CONFIG` is refused too). Off, such
    /// a Redis is logged loudly and counted (`seckill_redis_lossy_settings`). `appendfsync`
    /// other than `always` is only warned about (an OS crash loses the unsynced second).
    pub require_durable_redis: bool,
    /// Replicas that must hold an accepted purchase's Redis write before it is answered
    /// (`WAIT`, on the connection that wrote it; on a Cluster, the master of its slot); 0:
    /// none asked for. It narrows what a failover to a lagging replica can lose of the ledger
    /// and of a `202` that rests on the outbox. The purchase stands either way: a short count
    /// is logged and counted (`seckill_redis_wait_short_total`).
    pub redis_wait_replicas: u32,
    /// Whether the Redis server's own append-only file must have the write fsynced first
    /// (`WAITAOF 1 <replicas>`, Redis 7.2 or later).
    pub redis_wait_aof: bool,
    /// Longest such a wait (at least 1; with `publish_timeout_ms` below
    /// `relay_reclaim_idle_ms` and below 6000): a lagging replica slows the purchases that
    /// wait by up to this much, and only them (each waits on a connection of its own, see
    /// `redis_wait_connections`).
    #[serde(
        rename = "redis_wait_timeout_ms",
        with = "seckill_config::formats::millis"
    )]
    pub redis_wait_timeout: Duration,
    /// Dedicated Redis connections (1-1024) the purchases that wait for copies of their
    /// write run on, script and `WAIT` together (a `WAIT` holds back whatever else its
    /// connection carries, and counts that connection's writes only); unused without a
    /// wait. A purchase finding none free within 2 s answers `503`.
    pub redis_wait_connections: usize,
    /// Buckets a new product's stock is split into unless its creation names a count (fixed
    /// per product, 1-1024).
    pub stock_buckets: i16,
    /// How long after its reservation a sweep may still take a unit from another bucket.
    #[serde(rename = "sweep_fence_ms", with = "seckill_config::formats::millis")]
    pub sweep_fence: Duration,
    /// Added to the fence before an abandoned reservation is resolved: covers clock skew
    /// between Redis Cluster nodes.
    #[serde(
        rename = "sweep_skew_margin_ms",
        with = "seckill_config::formats::millis"
    )]
    pub sweep_skew_margin: Duration,
    /// How long this replica answers 410 from memory after seeing a product sold out. A
    /// unit put back (cancellation) is on sale again everywhere after at most this long
    /// (at most 500: `seckill_config::MAX_SOLD_OUT_MEMORY`); forgotten at once when units
    /// go back on sale, as announced on the pub/sub of `redis_url`.
    #[serde(
        rename = "sold_out_local_ttl_ms",
        with = "seckill_config::formats::millis"
    )]
    pub sold_out_local_ttl: Duration,
    /// How often every replica writes the set-up of the waiting rooms that are on (products
    /// whose `waiting_room` is not `open` and whose sale has not ended) into Redis again, so
    /// a Redis that lost a room has it back within this long (DESIGN.md §9). One `SELECT`
    /// and one write per such room each time; at least 100.
    #[serde(rename = "room_sync_ms", with = "seckill_config::formats::millis")]
    pub room_sync: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            backend: BackendSettings::default(),
            port: 8081,
            redis_pool_size: 64,
            db_pool_size: 10,
            load_lock_ttl: Duration::from_millis(3_000),
            load_wait: Duration::from_millis(5_000),
            product_cache_ttl: Duration::from_secs(30),
            bloom_expected_products: 1_000_000,
            bloom_fp_rate: 0.001,
            null_cache_ttl: Duration::from_millis(30_000),
            relay_batch: 256,
            relay_reclaim_idle: Duration::from_millis(5_000),
            publish_on_accept: true,
            publish_timeout: Duration::from_millis(1_000),
            publish_channels: 1,
            publish_batch_max: 64,
            publish_linger_us: 0,
            require_durable_redis: false,
            redis_wait_replicas: 0,
            redis_wait_aof: false,
            redis_wait_timeout: Duration::from_millis(100),
            redis_wait_connections: 64,
            stock_buckets: 16,
            sweep_fence: Duration::from_millis(5_000),
            sweep_skew_margin: Duration::from_millis(10_000),
            sold_out_local_ttl: Duration::from_millis(500),
            room_sync: Duration::from_millis(2_000),
        }
    }
}

impl Settings {
    /// The copies an accepted purchase's write waits for, if any are asked for.
    pub fn redis_wait(&self) -> Option<seckill_store::WaitFor> {
        (self.redis_wait_replicas > 0 || self.redis_wait_aof).then_some(seckill_store::WaitFor {
            replicas: self.redis_wait_replicas,
            local_aof: self.redis_wait_aof,
            timeout: self.redis_wait_timeout,
        })
    }

    /// The longest a purchase waits for copies of its Redis write before it publishes (zero
    /// without a wait).
    pub fn copy_wait(&self) -> Duration {
        self.redis_wait()
            .map_or(Duration::ZERO, |wait| wait.timeout)
    }
}

impl Validate for Settings {
    fn validate(&self) -> Result<(), String> {
        self.backend.validate()?;
        if self.redis_pool_size == 0 || self.db_pool_size == 0 || self.relay_batch == 0 {
            return Err("pool sizes and relay_batch must be positive".into());
        }
        // A handler publishes once its copies are waited for; the relay must not take its
        // outbox entry over before then.
        let handler_holds = self.copy_wait() + self.publish_timeout;
        if self.publish_on_accept && self.relay_reclaim_idle <= handler_holds {
            return Err(
                "relay_reclaim_idle_ms must exceed publish_timeout_ms plus redis_wait_timeout_ms \
                 (when a wait is asked for): a handler holds its outbox entry that long, and \
                 the relay would publish it a second time"
                    .into(),
            );
        }
        // After Redis lost a ledger, a fence stands the wait and twice the publish timeout
        // for purchases begun before the loss (`stock::fence::grace`).
        if handler_holds >= Duration::from_secs(6) {
            return Err(
                "publish_timeout_ms plus redis_wait_timeout_ms (when a wait is asked for) must \
                 stay below 6000: after Redis lost a ledger, the product's sales pause for the \
                 wait and twice the publish timeout"
                    .into(),
            );
        }
        if !(1..=seckill_messaging::batch::MAX_ORDERS).contains(&self.publish_batch_max) {
            return Err(format!(
                "publish_batch_max must be between 1 and {}",
                seckill_messaging::batch::MAX_ORDERS
            ));
        }
        if self.publish_linger_us > 1_000 {
            return Err("publish_linger_us must be at most 1000".into());
        }
        if !(1..=crate::catalog::MAX_BUCKETS).contains(&self.stock_buckets) {
            return Err("stock_buckets must be between 1 and 1024".into());
        }
        // WAIT with a zero timeout blocks for ever. It runs on a dedicated connection,
        // whose command timeout is the wait's and 2 s more.
        if self.redis_wait().is_some() && self.redis_wait_timeout < Duration::from_millis(1) {
            return Err(
                "redis_wait_timeout_ms must be at least 1 when a wait is asked for (0 would \
                 wait for ever)"
                    .into(),
            );
        }
        if !(1..=1024).contains(&self.redis_wait_connections) {
            return Err("redis_wait_connections must be between 1 and 1024".into());
        }
        if self.sweep_fence.is_zero() {
            return Err("sweep_fence_ms must be positive".into());
        }
        // Bounded so a typo cannot make every replica allocate gigabytes (10^8 ids at 0.001
        // is about 180 MB); the bloomfilter crate panics outside (0, 1).
        if !(1..=100_000_000).contains(&self.bloom_expected_products) {
            return Err("bloom_expected_products must be between 1 and 100000000".into());
        }
        if !(self.bloom_fp_rate > 0.0 && self.bloom_fp_rate <= 0.5) {
            return Err("bloom_fp_rate must be above 0 and at most 0.5".into());
        }
        if !(Duration::from_millis(1)..=Duration::from_secs(3600)).contains(&self.null_cache_ttl) {
            return Err("null_cache_ttl_ms must be between 1 and 3600000".into());
        }
        if self.sold_out_local_ttl > seckill_config::MAX_SOLD_OUT_MEMORY {
            return Err(format!(
                "sold_out_local_ttl_ms must be at most {} (how long a unit put back on sale \
                 may still be answered sold out)",
                seckill_config::MAX_SOLD_OUT_MEMORY.as_millis()
            ));
        }
        if self.room_sync < Duration::from_millis(100) {
            return Err("room_sync_ms must be at least 100".into());
        }
        if self.load_lock_ttl.is_zero() || self.load_lock_ttl >= self.load_wait {
            return Err("load_lock_ttl_ms must be positive and below load_wait_ms".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(Settings::default().validate(), Ok(()));
    }

    #[test]
    fn a_sold_out_memory_beyond_500_ms_is_refused() {
        let with = |ms| Settings {
            sold_out_local_ttl: Duration::from_millis(ms),
            ..Settings::default()
        };
        assert_eq!(with(0).validate(), Ok(()));
        assert_eq!(with(500).validate(), Ok(()));
        let refused = with(501).validate().expect_err("501 ms is past the bound");
        assert!(refused.contains("sold_out_local_ttl_ms"), "{refused}");
        assert!(with(600_000).validate().is_err());
    }

    /// With a wait asked for: one replica, `wait` ms, the other settings as given.
    fn waiting(wait: u64, publish: u64, reclaim: u64) -> Settings {
        Settings {
            redis_wait_replicas: 1,
            redis_wait_timeout: Duration::from_millis(wait),
            publish_timeout: Duration::from_millis(publish),
            relay_reclaim_idle: Duration::from_millis(reclaim),
            ..Settings::default()
        }
    }

    #[test]
    fn a_wait_for_copies_may_last_seconds_but_not_past_the_relay_or_the_fence() {
        // A wait runs on a connection of its own: longer than a second is fine.
        assert_eq!(waiting(3_000, 1_000, 5_000).validate(), Ok(()));
        assert_eq!(waiting(1, 1_000, 5_000).validate(), Ok(()));
        let forever = waiting(0, 1_000, 5_000)
            .validate()
            .expect_err("0 waits for ever");
        assert!(forever.contains("redis_wait_timeout_ms"), "{forever}");
        // The relay would take over an entry whose handler is still waiting or publishing.
        let relay = waiting(4_000, 1_000, 5_000)
            .validate()
            .expect_err("reclaim too soon");
        assert!(relay.contains("relay_reclaim_idle_ms"), "{relay}");
        // The fence would pause a wiped product's sales for too long.
        let fence = waiting(5_000, 1_000, 60_000)
            .validate()
            .expect_err("fence too long");
        assert!(fence.contains("6000"), "{fence}");
        // Without a wait asked for, its timeout counts for nothing.
        let mut unused = waiting(5_000, 1_000, 5_000);
        unused.redis_wait_replicas = 0;
        assert_eq!(unused.validate(), Ok(()));
    }

    #[test]
    fn the_dedicated_connections_are_between_1_and_1024() {
        let with = |n| Settings {
            redis_wait_connections: n,
            ..Settings::default()
        };
        assert_eq!(with(1).validate(), Ok(()));
        assert_eq!(with(1024).validate(), Ok(()));
        assert!(with(0).validate().is_err());
        assert!(with(1025).validate().is_err());
    }
}
