//! Following the announcements of units going back on sale.
//!
//! `reopen.lua` publishes `<product id> <gen>` on [`crate::RedisKeys::reopened_channel`] in
//! the same script that bumps the product's generation and lowers its sold-out flag. Whoever
//! remembers a sold-out product outside Redis (seckill-api's local flags, the gateway's edge
//! answers) follows the channel with [`follow`] and forgets the product when it hears of it.
//!
//! Redis pub/sub delivers at most once: a message published while the subscription is down
//! is lost. So [`Event::Subscribed`] comes on every (re)subscription and [`Event::Lost`]
//! when one ends, and a follower forgets everything it remembered on both. A connection that
//! fails silently is found by a `PING` every [`PING_EVERY`] answered within [`PING_TIMEOUT`];
//! until then a follower's memory is bounded by its own TTL.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the subscribed connection is pinged.
pub const PING_EVERY: Duration = Duration::from_secs(1);

/// How long a ping may take before the subscription counts as lost.
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// What the follower reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Subscribed (again): announcements from now on arrive; earlier ones may have been missed.
    Subscribed,
    /// Units of `product_id` went back on sale; its generation is now `generation`.
    Reopened {
        /// The product.
        product_id: i64,
        /// Its generation after the reopen.
        generation: u64,
    },
    /// The subscription ended; announcements are missed until the next `Subscribed`.
    Lost,
}

/// Parses an announcement's payload, `<product id> <gen>`.
pub fn parse(payload: &[u8]) -> Option<(i64, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    let (product, generation) = text.split_once(' ')?;
    Some((product.parse().ok()?, generation.parse().ok()?))
}

/// A product's generation as `HGET ... gen` gives it: unset (`''`) is 0.
pub fn generation(text: &str) -> u64 {
    text.parse().unwrap_or(0)
}

/// The servers [`follow`] may subscribe on: `url`, or with `cluster` each of its
/// comma-separated seed nodes.
pub fn urls(url: &str, cluster: bool) -> Vec<String> {
    if !cluster {
        return vec![url.to_string()];
    }
    url.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// Subscribes to `channel` on the first reachable of `urls` (one server, or any node of a
/// Redis Cluster, where a publish reaches every node) and reports to `on_event` until
/// `cancel`, subscribing again after a failure (one second apart).
pub async fn follow(
    urls: Vec<String>,
    channel: String,
    cancel: CancellationToken,
    on_event: impl Fn(Event) + Send + 'static,
) {
    if urls.is_empty() {
        tracing::warn!(%channel, "no Redis to follow the reopened announcements on");
        return;
    }
    let mut next = 0usize;
    loop {
        let url = &urls[next % urls.len()];
        next += 1;
        let ended = tokio::select! {
            () = cancel.cancelled() => return,
            ended = subscribed(url, &channel, &on_event) => ended,
        };
        on_event(Event::Lost);
        if let Err(e) = ended {
            tracing::warn!(error = %e, %channel, "reopened announcements: subscription failed");
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// One subscription, until its connection ends.
async fn subscribed(url: &str, channel: &str, on_event: &impl Fn(Event)) -> redis::RedisResult<()> {
    let client = redis::Client::open(url)?;
    let connect = client.get_async_pubsub();
    let pubsub = tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .map_err(|_| {
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
        })??;
    let (mut sink, mut messages) = pubsub.split();
    sink.subscribe(channel).await?;
    on_event(Event::Subscribed);
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = futures_util::StreamExt::next(&mut messages) => {
                let Some(message) = message else { return Ok(()) };
                match parse(message.get_payload_bytes()) {
                    Some((product_id, generation)) => on_event(Event::Reopened {
                        product_id,
                        generation,
                    }),
                    None => tracing::warn!(%channel, "unreadable reopened announcement"),
                }
            }
            _ = ping.tick() => {
                match tokio::time::timeout(PING_TIMEOUT, sink.ping::<redis::Value>()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        return Err(redis::RedisError::from(std::io::Error::from(
                            std::io::ErrorKind::TimedOut,
                        )));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_parse_and_garbage_does_not() {
        assert_eq!(parse(b"42 7"), Some((42, 7)));
        assert_eq!(parse(b"42"), None);
        assert_eq!(parse(b"x 7"), None);
        assert_eq!(parse(b"42 -1"), None);
        assert_eq!(generation(""), 0);
        assert_eq!(generation("12"), 12);
    }
}
