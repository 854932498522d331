//! The Redis key layout.
//!
//! A product's stock is split into buckets. Every key of one bucket shares the hash tag
//! `{p<id>.b<n>}`, so a Lua script that touches a bucket's stock, buyers, outbox and results
//! stays inside one Redis Cluster slot, and buckets of one product spread over the cluster.
//! Product-wide keys (load lock, sold-out state, null cache) use the tag `{p<id>}`. The
//! namespace prefix lets tests (and tenants) share one Redis without touching each other.
//! What each key of the stock ledger holds, field by field, is defined in [`crate::ledger`].

/// Builds the keys of one namespace.
#[derive(Debug, Clone)]
pub struct RedisKeys {
    ns: String,
}

impl RedisKeys {
    /// Keys under `namespace` (letters, digits, `_`, `-`, `.`; checked by service config).
    pub fn new(namespace: &str) -> Self {
        Self {
            ns: namespace.to_string(),
        }
    }

    fn product(&self, product_id: i64, suffix: &str) -> String {
        format!("{}:{{p{}}}:{}", self.ns, product_id, suffix)
    }

    fn bucket(&self, product_id: i64, bucket: u16, suffix: &str) -> String {
        format!("{}:{{p{}.b{}}}:{}", self.ns, product_id, bucket, suffix)
    }

    /// Hash `remaining`, `loaded_units`, `v`, `start_ms`, `end_ms`, `expire_at`: the units
    /// this bucket can still sell. Its existence means "this bucket is loaded".
    pub fn stock(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "stock")
    }

    /// Hash user id → purchase marker (see [`crate::ledger`]), for the users whose home is
    /// this bucket.
    pub fn buyers(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "buyers")
    }

    /// Hash user id → `<reservation ms>:<request id>`, for units this bucket gave to users
    /// homed elsewhere.
    pub fn takers(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "takers")
    }

    /// Stream of this bucket's accepted purchases not yet confirmed by RabbitMQ (the outbox).
    pub fn outbox(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "outbox")
    }

    /// Hash event id → ledger version, of given-up purchases whose unit came back to this
    /// bucket, so each is returned once however often its compensation runs, and a load can
    /// tell which of them its snapshot already counted (see [`crate::ledger`]).
    pub fn returns(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "returns")
    }

    /// Hash request id → `1` of given-up purchases whose buyer (homed in this bucket) was
    /// released, so a load whose snapshot still held them does not mark their buyers again
    /// (see [`crate::ledger`]).
    pub fn released(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "released")
    }

    /// Hash user id → [`crate::PurchaseResult`] text, for the users homed in this bucket.
    pub fn results(&self, product_id: i64, bucket: u16) -> String {
        self.bucket(product_id, bucket, "results")
    }

    /// The product's buyer-visible result key for `user_id` (in the user's home bucket).
    pub fn result_of(&self, product_id: i64, buckets: u16, user_id: i64) -> String {
        self.results(product_id, home_bucket(user_id, buckets))
    }

    /// Hash `gen` (bumped whenever units go back on sale), `sold_out` and `loaded`.
    pub fn product_state(&self, product_id: i64) -> String {
        self.product(product_id, "state")
    }

    /// The pub/sub channel on which `reopen.lua` announces `<product id> <gen>` whenever units
    /// of a product go back on sale (see [`crate::reopened`]). A channel, not a key: in a
    /// Redis Cluster a publish reaches the subscribers of every node.
    pub fn reopened_channel(&self) -> String {
        format!("{}:reopened", self.ns)
    }

    /// Hash of a product's waiting room (see the design's waiting-room section). seckill-api
    /// writes its set-up — `mode` (`open`, `fifo`, `raffle`), `start_ms`, `end_ms`, `stock`,
    /// `buckets` — from Postgres; the gateway's scripts keep its counters: `joined` (tickets
    /// handed out), `cursor` (places below it are admitted), `advanced_ms`, `credit`,
    /// `sold_out`, and for the rate's ceiling `rate_ms`, `rate_bought`, `accepted_per_sec`
    /// and `pushback_ms` (when the backends last could not take a purchase with a pass). In
    /// the product's slot, so one script reads it with [`Self::product_state`].
    pub fn room(&self, product_id: i64) -> String {
        self.product(product_id, "room")
    }

    /// Hash user id → place in line (0-based) of the room's tickets: one per user.
    pub fn room_tickets(&self, product_id: i64) -> String {
        self.product(product_id, "room-tickets")
    }

    /// Sorted set of the room's admissions: member the cursor after one, score its unix ms.
    pub fn room_admits(&self, product_id: i64) -> String {
        self.product(product_id, "room-admits")
    }

    /// Sorted set of the admitted buyers whose purchase was accepted: member the user id,
    /// score the place in line.
    pub fn room_bought(&self, product_id: i64) -> String {
        self.product(product_id, "room-bought")
    }

    /// The lazy-load lock.
    pub fn load_lock(&self, product_id: i64) -> String {
        self.product(product_id, "load-lock")
    }

    /// Null-cache entry: "no such product" (a bloom filter false positive), short-lived.
    pub fn missing_product(&self, product_id: i64) -> String {
        self.product(product_id, "missing")
    }

    /// Sorted set of the outbox streams the relay must watch, each scored with the unix ms
    /// until which a purchase may write to it (its sale's end). A stream is registered
    /// before its bucket is loaded or its window moved, so no accepted purchase can sit in
    /// an unknown stream; the relay retires streams whose sale ended and that are empty.
    pub fn outbox_registry(&self) -> String {
        format!("{}:outbox-registry", self.ns)
    }

    /// The registry of earlier versions: a plain set of every outbox stream ever loaded.
    /// The relay moves its members into [`RedisKeys::outbox_registry`].
    pub fn legacy_outbox_registry(&self) -> String {
        format!("{}:outboxes", self.ns)
    }

    /// The stock hash of the bucket whose outbox stream is `outbox` (None if it is not one).
    pub fn stock_of_outbox(&self, outbox: &str) -> Option<String> {
        outbox
            .strip_suffix(":outbox")
            .map(|bucket| format!("{bucket}:stock"))
    }

    /// A purchase's `Idempotency-Key` record, scoped to its user (one key per user, whatever
    /// the product, so reusing a key for another product is detectable).
    pub fn idempotency(&self, user_id: i64, key: &str) -> String {
        format!("{}:idem:{{u{}}}:{}", self.ns, user_id, key)
    }

    /// order-service's circuit breaker override (`open` or `closed`; absent = automatic),
    /// shared by every replica and surviving restarts.
    pub fn breaker_forced(&self) -> String {
        format!("{}:breaker:forced", self.ns)
    }

    /// A `SCAN` pattern matching every key of the namespace (test clean-up).
    pub fn pattern(&self) -> String {
        format!("{}:*", self.ns)
    }
}

/// The bucket that holds `user_id`'s purchase marker and result among `buckets` buckets.
///
/// Shared by every service (order-service writes results there). The id is mixed first
/// (SplitMix64's finaliser) so that sequential or patterned ids spread evenly.
pub fn home_bucket(user_id: i64, buckets: u16) -> u16 {
    let mut z = (user_id as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z % u64::from(buckets.max(1))) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_bucket_share_one_hash_tag() {
        let keys = RedisKeys::new("t1");
        for key in [
            keys.stock(9, 3),
            keys.buyers(9, 3),
            keys.takers(9, 3),
            keys.outbox(9, 3),
            keys.results(9, 3),
            keys.returns(9, 3),
            keys.released(9, 3),
        ] {
            assert!(key.starts_with("t1:{p9.b3}:"), "{key}");
        }
        for key in [
            keys.product_state(9),
            keys.room(9),
            keys.room_tickets(9),
            keys.room_admits(9),
            keys.room_bought(9),
        ] {
            assert!(key.starts_with("t1:{p9}:"), "{key}");
        }
        assert_eq!(
            keys.stock_of_outbox(&keys.outbox(9, 3)),
            Some(keys.stock(9, 3))
        );
        assert_ne!(keys.stock(9, 3), keys.stock(9, 4));
        assert_ne!(keys.stock(9, 0), keys.stock(90, 0));
    }

    #[test]
    fn home_buckets_are_stable_in_range_and_spread() {
        let mut counts = [0u32; 16];
        for user in 1..=16_000 {
            let home = home_bucket(user, 16);
            assert_eq!(home, home_bucket(user, 16));
            counts[usize::from(home)] += 1;
        }
        // Sequential ids land within 10 % of the even share.
        assert!(
            counts.iter().all(|&c| (900..=1100).contains(&c)),
            "{counts:?}"
        );
        assert_eq!(home_bucket(-5, 1), 0);
        assert_eq!(home_bucket(42, 0), 0);
    }
}
