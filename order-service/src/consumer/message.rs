//! What a delivery carries: one purchase's message, or a batch of them
//! (`seckill_messaging::batch`), and which of a batch's parts are settled.
//!
//! Every purchase is handled as its own message ([`Msg`]) whichever way it came: its
//! signature checked against its own body, its order written, retried or dead-lettered by
//! itself. A batch delivery is settled with the broker once all its parts are: acked if
//! each was written or passed on (to a retry tier or the dead-letter exchange, as its own
//! message), handed back whole if any part had to go back to the queue (its written
//! neighbours are then duplicates on redelivery, which the idempotent write absorbs).

use std::collections::HashMap;
use std::sync::Mutex;

use lapin::BasicProperties;
use lapin::message::Delivery;

use seckill_messaging::batch::{self, Part};

/// A delivery and the messages it carries.
pub(super) struct Received {
    pub(super) delivery: Delivery,
    /// A batch's parts, in order; empty when the delivery is a message of its own (or a
    /// batch that cannot be read, which is then handled as one message: unsigned, it is
    /// dead-lettered whole).
    parts: Vec<Part>,
}

impl Received {
    /// Reads what `delivery` carries.
    pub(super) fn new(delivery: Delivery) -> Self {
        let parts = if batch::is_batch(&delivery.properties) {
            match batch::unpack(&delivery.data, &delivery.properties) {
                Ok(parts) => parts,
                Err(e) => {
                    tracing::error!(error = %e, "unreadable order batch, handling it as one message");
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        Self { delivery, parts }
    }

    /// The delivery's tag.
    pub(super) fn tag(&self) -> u64 {
        self.delivery.delivery_tag
    }

    /// How many parts settle separately (0: the delivery is one message).
    pub(super) fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// The purchases' messages it carries.
    pub(super) fn messages(&self) -> Vec<Msg<'_>> {
        if self.parts.is_empty() {
            return vec![Msg {
                delivery: &self.delivery,
                part: None,
                data: &self.delivery.data,
                properties: &self.delivery.properties,
            }];
        }
        self.parts
            .iter()
            .enumerate()
            .map(|(index, part)| Msg {
                delivery: &self.delivery,
                part: Some(index),
                data: &part.data,
                properties: &part.properties,
            })
            .collect()
    }

    /// The messages not settled yet: the delivery's own, or the batch's parts `parts` has
    /// not seen settled.
    pub(super) fn unsettled(&self, parts: &Parts) -> Vec<Msg<'_>> {
        if self.parts.is_empty() {
            return self.messages();
        }
        let open = parts.unsettled(self.tag());
        self.messages()
            .into_iter()
            .filter(|m| m.part.is_some_and(|index| open.contains(&index)))
            .collect()
    }
}

/// One purchase's message: a whole delivery, or one part of a batch delivery.
#[derive(Clone, Copy)]
pub(super) struct Msg<'a> {
    /// The delivery it came in.
    pub(super) delivery: &'a Delivery,
    /// Its place in the batch; `None`: the delivery is this message.
    pub(super) part: Option<usize>,
    /// Its body, as signed.
    pub(super) data: &'a [u8],
    /// Its properties (a part's: the batch's, made its own).
    pub(super) properties: &'a BasicProperties,
}

impl Msg<'_> {
    /// Its delivery's tag.
    pub(super) fn tag(&self) -> u64 {
        self.delivery.delivery_tag
    }
}

/// Which parts of each batch delivery in hand are settled.
#[derive(Debug, Default)]
pub(super) struct Parts {
    open: Mutex<HashMap<u64, Open>>,
}

#[derive(Debug)]
struct Open {
    settled: Vec<bool>,
    /// A part must go back to the queue: so does the delivery.
    back: bool,
    /// Every part is settled and the delivery's own settling was handed out; the entry
    /// stays until that ack or nack is sent ([`Parts::forget`]), so a panic in between
    /// still finds what the delivery was to become.
    done: bool,
}

/// What is left to do for a batch delivery in hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Pending {
    /// These parts are not settled yet.
    Parts(Vec<usize>),
    /// Every part is; the delivery itself is still to be settled so.
    Whole(Whole),
    /// Not a batch this ledger knows.
    Unknown,
}

/// What a batch delivery becomes once its last part is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Whole {
    /// Every part was written or passed on: ack it.
    Ack,
    /// A part must be delivered again: hand the delivery back.
    HandBack,
}

impl Parts {
    /// A batch delivery of `count` parts arrived.
    pub(super) fn open(&self, tag: u64, count: usize) {
        self.lock().insert(
            tag,
            Open {
                settled: vec![false; count],
                back: false,
                done: false,
            },
        );
    }

    /// Part `index` of delivery `tag` is settled (`back`: it must be delivered again).
    /// Returns what the delivery becomes, once, when this was its last part unsettled: the
    /// caller settles the delivery so and then [`Self::forget`]s it. A part settled twice
    /// counts once.
    pub(super) fn settle(&self, tag: u64, index: usize, back: bool) -> Option<Whole> {
        let mut open = self.lock();
        let parts = open.get_mut(&tag)?;
        if let Some(settled) = parts.settled.get_mut(index) {
            *settled = true;
        }
        parts.back |= back;
        if parts.done || !parts.settled.iter().all(|&s| s) {
            return None;
        }
        parts.done = true;
        Some(whole(parts))
    }

    /// What is left to do for delivery `tag`.
    pub(super) fn pending(&self, tag: u64) -> Pending {
        match self.lock().get(&tag) {
            None => Pending::Unknown,
            Some(parts) if parts.done => Pending::Whole(whole(parts)),
            Some(parts) => Pending::Parts(
                parts
                    .settled
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| !**s)
                    .map(|(index, _)| index)
                    .collect(),
            ),
        }
    }

    /// The parts of delivery `tag` not settled yet (none if it is not a batch in hand, or
    /// if all are).
    pub(super) fn unsettled(&self, tag: u64) -> Vec<usize> {
        match self.pending(tag) {
            Pending::Parts(parts) => parts,
            Pending::Whole(_) | Pending::Unknown => Vec::new(),
        }
    }

    /// Whether a part of delivery `tag` already has to go back to the queue (and so the
    /// whole delivery will).
    pub(super) fn going_back(&self, tag: u64) -> bool {
        self.lock().get(&tag).is_some_and(|parts| parts.back)
    }

    /// Delivery `tag` was settled with the broker: its parts no longer matter.
    pub(super) fn forget(&self, tag: u64) {
        self.lock().remove(&tag);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn whole(parts: &Open) -> Whole {
    if parts.back {
        Whole::HandBack
    } else {
        Whole::Ack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_acked_once_every_part_is_settled() {
        let parts = Parts::default();
        parts.open(7, 3);
        assert_eq!(parts.settle(7, 0, false), None);
        assert_eq!(parts.settle(7, 0, false), None, "a part counts once");
        assert_eq!(parts.unsettled(7), [1, 2]);
        assert_eq!(parts.settle(7, 2, false), None);
        assert_eq!(parts.settle(7, 1, false), Some(Whole::Ack));
        assert!(parts.unsettled(7).is_empty());
        assert_eq!(parts.settle(7, 1, false), None, "handed out once");
        // Until its ack is sent, what it was to become is still known.
        assert_eq!(parts.pending(7), Pending::Whole(Whole::Ack));
        parts.forget(7);
        assert_eq!(parts.pending(7), Pending::Unknown);
    }

    #[test]
    fn one_part_going_back_hands_the_batch_back() {
        let parts = Parts::default();
        parts.open(1, 2);
        parts.open(2, 1);
        assert_eq!(parts.settle(1, 1, true), None);
        assert!(parts.going_back(1));
        assert_eq!(parts.pending(1), Pending::Parts(vec![0]));
        assert_eq!(parts.settle(2, 0, false), Some(Whole::Ack));
        assert_eq!(parts.settle(1, 0, false), Some(Whole::HandBack));
        assert_eq!(parts.pending(1), Pending::Whole(Whole::HandBack));
    }
}
