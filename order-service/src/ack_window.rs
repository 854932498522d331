//! Coalesced acks: one `basic.ack(multiple)` for a run of finished deliveries.
//!
//! Acking every delivery costs the broker (and us) a frame and a bookkeeping step per
//! message; at drain speed that is a large share of RabbitMQ's CPU. `multiple = true` acks
//! every unsettled delivery up to a tag, so it is only safe up to the lowest tag that is
//! still being worked on: batches finish out of order, and a later batch's commit must
//! never ack an earlier batch's messages. The window tracks the tags in hand and acks the
//! finished prefix below the lowest one in hand; a delivery settled another way (requeued,
//! rejected, dead-lettered with its own ack) leaves the window at once.
//!
//! Acks are sent under the window's lock, so they leave in tag order: an ack for a lower
//! tag can never follow one that already covered it (which the broker would refuse as an
//! unknown tag, closing the channel).

use std::collections::BTreeSet;

use lapin::Channel;
use lapin::options::BasicAckOptions;

/// The tags of one channel's deliveries in hand and finished-but-unacked.
#[derive(Debug, Default)]
pub struct Tags {
    in_hand: BTreeSet<u64>,
    finished: BTreeSet<u64>,
}

impl Tags {
    /// A delivery arrived.
    pub fn delivered(&mut self, tag: u64) {
        self.in_hand.insert(tag);
    }

    /// A delivery is done and may be acked; returns the tag to ack up to and how many
    /// deliveries that ack covers, if any.
    pub fn finished(&mut self, tag: u64) -> Option<(u64, usize)> {
        if self.in_hand.remove(&tag) {
            self.finished.insert(tag);
        }
        self.flushable()
    }

    /// A delivery was settled on its own (nack, reject); returns the tag to ack up to (and
    /// the count), if its leaving uncovered a finished prefix.
    pub fn settled_elsewhere(&mut self, tag: u64) -> Option<(u64, usize)> {
        self.in_hand.remove(&tag);
        self.flushable()
    }

    /// Takes every finished tag below the lowest one in hand; returns the highest of them
    /// and their number.
    fn flushable(&mut self) -> Option<(u64, usize)> {
        let limit = self.in_hand.first().copied().unwrap_or(u64::MAX);
        let rest = self.finished.split_off(&limit);
        let flushed = std::mem::replace(&mut self.finished, rest);
        flushed.last().map(|&last| (last, flushed.len()))
    }
}

/// A channel's ack window.
#[derive(Debug)]
pub struct AckWindow {
    channel: Channel,
    tags: tokio::sync::Mutex<Tags>,
}

impl AckWindow {
    /// An empty window on `channel`.
    pub fn new(channel: Channel) -> Self {
        Self {
            channel,
            tags: tokio::sync::Mutex::new(Tags::default()),
        }
    }

    /// Records a delivery that arrived (in the consuming loop, before any batch runs).
    pub async fn delivered(&self, tag: u64) {
        self.tags.lock().await.delivered(tag);
    }

    /// Marks a delivery done; sends the ack it makes possible, if any.
    pub async fn ack(&self, tag: u64) {
        let mut tags = self.tags.lock().await;
        if let Some((up_to, count)) = tags.finished(tag) {
            self.send(up_to, count).await;
        }
    }

    /// Notes that a delivery was settled another way; sends any ack that uncovers.
    pub async fn settled_elsewhere(&self, tag: u64) {
        let mut tags = self.tags.lock().await;
        if let Some((up_to, count)) = tags.settled_elsewhere(tag) {
            self.send(up_to, count).await;
        }
    }

    /// Which of `tags` are still in hand (neither finished nor settled).
    pub async fn still_in_hand(&self, tags: &[u64]) -> Vec<u64> {
        let held = self.tags.lock().await;
        tags.iter()
            .copied()
            .filter(|tag| held.in_hand.contains(tag))
            .collect()
    }

    async fn send(&self, up_to: u64, count: usize) {
        let multiple = BasicAckOptions { multiple: true };
        if let Err(e) = self.channel.basic_ack(up_to, multiple).await {
            // The channel died: the broker redelivers everything unacked, and the writes
            // are idempotent.
            tracing::warn!(error = %e, up_to, "could not ack deliveries");
            metrics::counter!(crate::metrics::ORDERS_ACK_FAILURES).increment(count as u64);
        } else {
            metrics::counter!("orders_acked_total").increment(count as u64);
            metrics::counter!("orders_ack_frames_total").increment(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_finished_prefix_below_the_lowest_tag_in_hand_is_acked() {
        let mut tags = Tags::default();
        for tag in 1..=6 {
            tags.delivered(tag);
        }
        // A later batch finishes first: nothing may be acked while 1 is in hand.
        assert_eq!(tags.finished(4), None);
        assert_eq!(tags.finished(5), None);
        assert_eq!(tags.finished(2), None);
        // 1 finishes: 1 and 2 go; 3 is still in hand, so 4 and 5 wait.
        assert_eq!(tags.finished(1), Some((2, 2)));
        // 3 is requeued on its own: 4 and 5 are uncovered.
        assert_eq!(tags.settled_elsewhere(3), Some((5, 2)));
        assert_eq!(tags.finished(6), Some((6, 1)));
        assert_eq!(tags.finished(6), None, "a tag is acked once");
    }

    #[test]
    fn a_tag_settled_elsewhere_is_never_acked() {
        let mut tags = Tags::default();
        tags.delivered(1);
        tags.delivered(2);
        assert_eq!(tags.settled_elsewhere(1), None);
        assert_eq!(tags.finished(1), None, "1 was settled already");
        assert_eq!(tags.finished(2), Some((2, 1)));
    }
}
