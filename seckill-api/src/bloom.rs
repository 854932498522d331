//! The bloom filter of product ids: "certainly not a product" without asking Redis or Postgres.
//!
//! A request for an id the filter never saw is answered 404 from memory, so a flood of
//! random ids (a scraper, an attack) costs nothing downstream. A "maybe" goes on to the
//! caches; the false positives among them are caught by the Redis null cache.
//!
//! The filter only ever grows between rebuilds (ids are never deleted from `products`). It is
//! rebuilt from Postgres at start, after the change listener reconnects (notifications sent
//! while it was away are lost) and when it holds more ids than it was sized for.

use std::sync::{PoisonError, RwLock};

use bloomfilter::Bloom;

/// How a filter is sized.
#[derive(Debug, Clone, Copy)]
pub struct BloomSizing {
    /// Ids the filter is built for at least.
    pub expected: usize,
    /// Wanted false-positive rate while it holds at most that many, in (0, 1).
    pub fp_rate: f64,
}

/// The filter and what it was sized for; replaced whole on a rebuild.
struct Filter {
    bloom: Bloom<i64>,
    /// Ids it was sized for: past this the false-positive rate climbs.
    capacity: usize,
    /// Ids set so far (an id set twice counts twice: an upper bound, which is the safe side).
    items: usize,
}

/// The product-id filter, shared by the request path (reads) and the change listener (writes).
///
/// Behind a std `RwLock`: a check or a set hashes one `i64` a few times, so every hold is
/// microseconds, and a rebuild builds the new filter outside the lock and only swaps it in.
pub struct ProductBloom {
    sizing: BloomSizing,
    inner: RwLock<Filter>,
}

impl std::fmt::Debug for ProductBloom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProductBloom")
            .field("sizing", &self.sizing)
            .finish_non_exhaustive()
    }
}

impl ProductBloom {
    /// An empty filter sized by `sizing` (validated by the settings; see [`Self::filter_for`]).
    pub fn new(sizing: BloomSizing) -> anyhow::Result<Self> {
        Ok(Self {
            sizing,
            inner: RwLock::new(Self::filter_for(sizing, 0)?),
        })
    }

    /// False: `id` is certainly not a product. True: it may be.
    pub fn might_contain(&self, id: i64) -> bool {
        self.read(|f| f.bloom.check(&id))
    }

    /// Records that `id` is a product.
    pub fn insert(&self, id: i64) {
        let mut filter = self.inner.write().unwrap_or_else(PoisonError::into_inner);
        filter.bloom.set(&id);
        filter.items += 1;
    }

    /// Whether more ids were set than the filter was sized for (time to rebuild it larger).
    pub fn over_capacity(&self) -> bool {
        self.read(|f| f.items > f.capacity)
    }

    /// Replaces the filter by one holding exactly `ids`, sized for the larger of the configured
    /// count and twice `ids.len()`, so a catalogue that outgrew the setting keeps its
    /// false-positive rate (with room to grow before the next rebuild).
    pub fn rebuild(&self, ids: &[i64]) -> anyhow::Result<()> {
        if ids.len() > self.sizing.expected {
            tracing::warn!(
                products = ids.len(),
                bloom_expected_products = self.sizing.expected,
                "more products than bloom_expected_products: sizing the bloom filter for twice \
                 the products; raise the setting to size it up front"
            );
        }
        let mut fresh = Self::filter_for(self.sizing, ids.len())?;
        for id in ids {
            fresh.bloom.set(id);
        }
        fresh.items = ids.len();
        metrics::gauge!("seckill_bloom_capacity").set(fresh.capacity as f64);
        metrics::gauge!("seckill_bloom_items").set(fresh.items as f64);
        *self.inner.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// An empty filter for `sizing`, grown to twice `count` when that is larger.
    fn filter_for(sizing: BloomSizing, count: usize) -> anyhow::Result<Filter> {
        let capacity = sizing.expected.max(count.saturating_mul(2)).max(1);
        let bloom = Bloom::new_for_fp_rate(capacity, sizing.fp_rate)
            .map_err(|e| anyhow::anyhow!("bloom filter for {capacity} ids: {e}"))?;
        Ok(Filter {
            bloom,
            capacity,
            items: 0,
        })
    }

    fn read<T>(&self, f: impl FnOnce(&Filter) -> T) -> T {
        f(&self.inner.read().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ProductBloom {
        ProductBloom::new(BloomSizing {
            expected: 100,
            fp_rate: 0.001,
        })
        .expect("bloom")
    }

    #[test]
    fn an_inserted_id_is_always_maybe_and_an_empty_filter_says_no() {
        let bloom = small();
        assert!(!bloom.might_contain(7));
        bloom.insert(7);
        assert!(bloom.might_contain(7));
    }

    #[test]
    fn a_rebuild_holds_exactly_the_given_ids() {
        let bloom = small();
        bloom.insert(1);
        bloom.rebuild(&[2, 3]).expect("rebuild");
        assert!(bloom.might_contain(2) && bloom.might_contain(3));
        // Id 1 is gone too (a rebuild mirrors Postgres), but any single id may be a false
        // positive under a random seed, so count false positives over many ids instead.
        let strangers = (1_000..2_000).filter(|id| bloom.might_contain(*id)).count();
        assert!(strangers < 10, "{strangers} false positives in 1000");
    }

    #[test]
    fn a_catalogue_larger_than_configured_gets_a_larger_filter() {
        let bloom = small();
        let ids: Vec<i64> = (1..=500).collect();
        bloom.rebuild(&ids).expect("rebuild");
        assert!(!bloom.over_capacity());
        assert!(ids.iter().all(|id| bloom.might_contain(*id)));
        let strangers = (10_000..20_000)
            .filter(|id| bloom.might_contain(*id))
            .count();
        assert!(strangers < 100, "{strangers} false positives in 10000");
        for id in 501..=1_001 {
            bloom.insert(id);
        }
        assert!(bloom.over_capacity());
    }
}
