//! The Redis key layout.
//!
//! Every key of one product shares the hash tag `{p<id>}`, so a Lua script that touches a
//! product's stock, buyers, outbox and results stays inside one Redis Cluster slot. The
//! namespace prefix lets tests (and tenants) share one Redis without touching each other.

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

    /// Hash `remaining`, `total`, `start_ms`, `end_ms`: the sellable stock. Its existence
    /// means "loaded"; it has no TTL, so a reload can only follow a Redis data loss.
    pub fn stock(&self, product_id: i64) -> String {
        self.product(product_id, "stock")
    }

    /// Set of user ids that hold a unit of this product.
    pub fn buyers(&self, product_id: i64) -> String {
        self.product(product_id, "buyers")
    }

    /// Stream of accepted purchases not yet confirmed by RabbitMQ (the outbox).
    pub fn outbox(&self, product_id: i64) -> String {
        self.product(product_id, "outbox")
    }

    /// Hash user id → [`crate::PurchaseResult`] text.
    pub fn results(&self, product_id: i64) -> String {
        self.product(product_id, "results")
    }

    /// The lazy-load lock.
    pub fn load_lock(&self, product_id: i64) -> String {
        self.product(product_id, "load-lock")
    }

    /// Set of outbox stream keys the relay must drain. A stream is registered before its
    /// product's stock is loaded, so no accepted purchase can sit in an unknown stream.
    pub fn outbox_registry(&self) -> String {
        format!("{}:outboxes", self.ns)
    }

    /// A purchase's `Idempotency-Key` record, scoped to its user (one key per user, whatever
    /// the product, so reusing a key for another product is detectable).
    pub fn idempotency(&self, user_id: i64, key: &str) -> String {
        format!("{}:idem:{{u{}}}:{}", self.ns, user_id, key)
    }

    /// A `SCAN` pattern matching every key of the namespace (test clean-up).
    pub fn pattern(&self) -> String {
        format!("{}:*", self.ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_one_product_share_one_hash_tag() {
        let keys = RedisKeys::new("t1");
        for key in [
            keys.stock(9),
            keys.buyers(9),
            keys.outbox(9),
            keys.results(9),
        ] {
            assert!(key.starts_with("t1:{p9}:"), "{key}");
        }
        assert_ne!(keys.stock(9), keys.stock(90));
    }
}
