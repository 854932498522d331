//! `outbox_oldest_age_seconds{replica}`: how long the oldest outbox entry has waited for
//! the broker's confirm, the one figure that says the outbox is draining or not.
//!
//! An entry leaves its stream once the broker confirmed it (deleted by its handler or by
//! the relay), so the oldest entry of any stream is the oldest unconfirmed one; its id is
//! its `XADD` time (`<unix ms>-<seq>`, the purchase script lets Redis choose it). Every
//! `every`, the watch reads the registry a page at a time and each stream's first id
//! (`XRANGE - + COUNT 1`, all of a page in flight together). It runs apart from the
//! relay, which stops while the broker is unreachable: that is exactly when the age must
//! keep growing on the dashboard. Each replica reports the age it sees, labelled with its
//! relay consumer name; they see the same streams, so alerts take the max.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use seckill_store::RedisKeys;

use crate::metrics::OUTBOX_OLDEST_AGE;

/// Streams read from the registry per round trip.
const PAGE: isize = 1_000;

/// Watches the age of the oldest outbox entry; see the module docs.
#[derive(Clone)]
pub struct OutboxAge {
    /// Where the outbox streams are.
    pub redis: seckill_store::Redis,
    /// Key names.
    pub keys: RedisKeys,
    /// The `replica` label: this replica's relay consumer name.
    pub replica: String,
    /// Interval between two readings.
    pub every: Duration,
}

impl std::fmt::Debug for OutboxAge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboxAge")
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl OutboxAge {
    /// Sets the gauge every `every` until `cancel`; a failed reading (Redis away) is
    /// logged and leaves the last value.
    pub async fn run(self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            match self.oldest_ms().await {
                Ok(oldest) => {
                    let age_ms = oldest.map_or(0, |at| (super::unix_ms() - at).max(0));
                    metrics::gauge!(OUTBOX_OLDEST_AGE, "replica" => self.replica.clone())
                        .set(age_ms as f64 / 1000.0);
                }
                Err(e) => tracing::warn!(error = %e, "could not read the outbox's oldest entry"),
            }
        }
    }

    /// The `XADD` time (unix ms) of the oldest entry over every registered stream; `None`
    /// when all are empty.
    pub async fn oldest_ms(&self) -> anyhow::Result<Option<i64>> {
        let mut conn = self.redis.get().await?;
        let mut oldest: Option<i64> = None;
        let mut start = 0isize;
        loop {
            let page: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.keys.outbox_registry())
                .arg(start)
                .arg(start + PAGE - 1)
                .query_async(&mut conn)
                .await?;
            let firsts = futures_util::future::try_join_all(page.iter().map(|stream| async move {
                let mut conn = self.redis.get().await?;
                let first: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                    .arg(stream)
                    .arg("-")
                    .arg("+")
                    .arg("COUNT")
                    .arg(1)
                    .query_async(&mut conn)
                    .await?;
                anyhow::Ok(first.ids.first().and_then(|entry| id_ms(&entry.id)))
            }))
            .await?;
            for at in firsts.into_iter().flatten() {
                oldest = Some(oldest.map_or(at, |o| o.min(at)));
            }
            if (page.len() as isize) < PAGE {
                return Ok(oldest);
            }
            start += PAGE;
        }
    }
}

/// The time part of a stream entry id (`<unix ms>-<seq>`).
fn id_ms(id: &str) -> Option<i64> {
    id.split_once('-')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::id_ms;

    #[test]
    fn an_entry_id_gives_its_time() {
        assert_eq!(id_ms("1700000000123-7"), Some(1_700_000_000_123));
        assert_eq!(id_ms("garbage"), None);
    }
}
