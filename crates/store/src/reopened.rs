//! Following the announcements of units going back on sale.
//!
//! `reopen.lua` publishes `<product id> <gen>` on [`crate::RedisKeys::reopened_channel`] in
//! the same script that bumps the product's generation and lowers its sold-out flag. Whoever
//! remembers a sold-out product outside Redis (seckill-api's local flags, the gateway's edge
//! answers) follows the channel with [`follow`] and forgets the product when it hears of it.
//!
//! Redis pub/sub delivers at most once: a message published while the subscription is down
//! is lost. So [`Event::Subscribed`] comes on every (re)subscription and [`Event::Lost`]
//! when one ends, and a follower forgets everything it remembered on both. A silent network
//! failure is not seen here; a follower's memory is time-bounded as well (its flag TTL).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

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
    let mut next = 0usize;
    loop {
        let url = &urls[next % urls.len().max(1)];
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
    let mut pubsub = tokio::time::timeout(Duration::from_secs(2), connect)
        .await
        .map_err(|_| {
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
        })??;
    pubsub.subscribe(channel).await?;
    on_event(Event::Subscribed);
    let mut messages = pubsub.into_on_message();
    while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
        match parse(message.get_payload_bytes()) {
            Some((product_id, generation)) => on_event(Event::Reopened {
                product_id,
                generation,
            }),
            None => tracing::warn!(%channel, "unreadable reopened announcement"),
        }
    }
    Ok(())
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
