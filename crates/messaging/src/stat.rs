//! A queue's ready messages and consumers, read by a passive declare, and when to believe
//! the answer.
//!
//! A quorum queue answers a stat by asking its Raft leader, and when the leader does not
//! answer within 250 ms (it is busy, or being elected) it says "0 messages, 0 consumers"
//! instead of failing. Such a zero is indistinguishable from a real one except by its
//! delay: a "0, 0" answered slower than [`TRUSTED_ANSWER`] is treated as no answer.

use std::time::{Duration, Instant};

use lapin::Channel;
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;

/// A "0 messages, 0 consumers" answered slower than this may be a quorum queue's default.
pub const TRUSTED_ANSWER: Duration = Duration::from_millis(200);

/// What a passive declare says of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStat {
    /// Messages ready (not those delivered and unacked, nor dead letters in transit).
    pub messages: u32,
    /// Consumers attached.
    pub consumers: u32,
}

/// Reads `queue` by a passive declare: `Ok(None)` when the answer cannot be believed (see
/// the module docs); an error (a queue that does not exist among them) closes the channel.
pub async fn queue_stat(channel: &Channel, queue: &str) -> lapin::Result<Option<QueueStat>> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let asked = Instant::now();
    let found = channel
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await?;
    Ok(believed(
        QueueStat {
            messages: found.message_count(),
            consumers: found.consumer_count(),
        },
        asked.elapsed(),
    ))
}

/// The answer, unless it is a slow "0, 0".
fn believed(stat: QueueStat, took: Duration) -> Option<QueueStat> {
    let empty = stat.messages == 0 && stat.consumers == 0;
    (!empty || took < TRUSTED_ANSWER).then_some(stat)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_empty_answer_is_no_answer_and_every_other_is_believed() {
        let stat = |messages, consumers| QueueStat {
            messages,
            consumers,
        };
        let (fast, slow) = (Duration::from_millis(5), Duration::from_millis(260));
        assert_eq!(believed(stat(0, 0), fast), Some(stat(0, 0)));
        assert_eq!(believed(stat(0, 0), slow), None);
        assert_eq!(believed(stat(3, 0), slow), Some(stat(3, 0)));
        assert_eq!(believed(stat(0, 1), slow), Some(stat(0, 1)));
    }
}
