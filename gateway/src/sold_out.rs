//! Sold-out purchases answered at the edge.
//!
//! After a sale sells out, nearly every purchase is one more `410 sold_out`. seckill-api
//! marks the 410s its product's sold-out flag backs with [`SOLD_OUT_HEADER`]
//! (`<product id> <gen>`); the gateway remembers the product from such an answer and
//! answers its next purchases `410` itself — after authentication and the rate limits,
//! before the body bounds and the forward — with the same body and header.
//!
//! It forgets a product:
//! - when units of it go back on sale (a cancellation, a compensation): `reopen.lua`
//!   announces the product's new generation on Redis pub/sub and the gateway, subscribed
//!   ([`seckill_store::reopened::follow`]), drops the product at once, and takes no answer of
//!   an older generation (one decided before the reopen, arriving after it) for the next
//!   [`FLOOR_KEPT`];
//! - after `sold_out_ttl_ms` (500 ms, the replicas' own `sold_out_local_ttl_ms`) in any case,
//!   so a missed announcement costs no more than the replicas' flags already may;
//! - all of them whenever the subscription is down or was just (re)made, when announcements
//!   may have been missed; while it is down nothing is answered here.
//!
//! One answer in `sold_out_ttl_ms` per product goes to a replica: that is how the gateway
//! learns the product is still sold out, and what a flood costs the replicas.

use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use bytes::Bytes;
use seckill_http::SOLD_OUT_HEADER;
use seckill_http1::{Response, with_date};
use seckill_store::reopened::{self, Event};

/// How long a reopened product's generation is kept: longer than any answer decided
/// before the reopen can take to arrive (the upstream timeout).
pub const FLOOR_KEPT: Duration = Duration::from_secs(60);

/// Entries kept before expired ones are swept out on the next insert.
const SWEEP_ABOVE: usize = 1024;

/// What the gateway knows of a product.
#[derive(Debug, Clone, Copy)]
enum Known {
    /// Sold out under `generation`: answered here until `until`.
    SoldOut { generation: u64, until: Instant },
    /// Went back on sale as `generation`, at `at`: an answer of an older one is stale.
    Reopened { generation: u64, at: Instant },
}

/// The products whose purchases the gateway answers `410` itself.
#[derive(Debug)]
pub struct SoldOutEdge {
    /// How long an answer learnt from a replica is repeated; zero: never (the edge is off).
    ttl: Duration,
    known: RwLock<HashMap<i64, Known>>,
    /// Subscribed to the reopened announcements: nothing is answered here otherwise.
    live: AtomicBool,
    /// Bumped whenever the subscription is made or lost: an answer forwarded across such a
    /// gap may predate a reopen nobody heard, and is not learnt.
    epoch: AtomicU64,
    answered: metrics::Counter,
    following: metrics::Gauge,
}

impl SoldOutEdge {
    /// An edge that repeats a replica's sold-out answer for `ttl` (zero: off), once
    /// subscribed ([`Self::on_event`]).
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            known: RwLock::new(HashMap::new()),
            live: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            answered: metrics::counter!(crate::metrics::SOLD_OUT_ANSWERS),
            following: metrics::gauge!(crate::metrics::SOLD_OUT_FOLLOWING),
        }
    }

    /// Whether the edge answers anything at all (a non-zero TTL).
    pub fn enabled(&self) -> bool {
        !self.ttl.is_zero()
    }

    /// The answer to a purchase of `product_id`, if the gateway gives it itself.
    pub fn answer(&self, product_id: i64) -> Option<Response> {
        if !self.live.load(Ordering::Relaxed) {
            return None;
        }
        let known = *self.read().get(&product_id)?;
        let Known::SoldOut { generation, until } = known else {
            return None;
        };
        if Instant::now() >= until {
            return None;
        }
        self.answered.increment(1);
        Some(sold_out(product_id, generation))
    }

    /// The subscription's epoch, to read before a purchase is forwarded and hand back to
    /// [`Self::learn`] with its answer.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Learns from a replica's answer to a purchase of `product_id`, forwarded at `epoch`:
    /// a `410` with the flag's header (not of a generation older than a reopen heard since,
    /// nor sent across a gap in the subscription).
    pub fn learn(&self, product_id: i64, response: &Response, epoch: u64) {
        if response.status != StatusCode::GONE
            || !self.enabled()
            || !self.live.load(Ordering::Relaxed)
        {
            return;
        }
        let Some((product, generation)) =
            response.header(SOLD_OUT_HEADER).and_then(reopened::parse)
        else {
            return;
        };
        if product != product_id {
            return;
        }
        let now = Instant::now();
        let mut known = self.write();
        // Read under the lock the events take: a gap that began before this is seen.
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        if let Some(Known::Reopened {
            generation: floor,
            at,
        }) = known.get(&product_id)
            && generation < *floor
            && now < *at + FLOOR_KEPT
        {
            return;
        }
        sweep(&mut known, now);
        known.insert(
            product_id,
            Known::SoldOut {
                generation,
                until: now + self.ttl,
            },
        );
    }

    /// Takes an event of the reopened announcements' follower.
    pub fn on_event(&self, event: Event) {
        match event {
            Event::Reopened {
                product_id,
                generation,
            } => {
                let now = Instant::now();
                let mut known = self.write();
                let newer = match known.get(&product_id) {
                    Some(Known::Reopened { generation: g, .. }) => generation.max(*g),
                    _ => generation,
                };
                sweep(&mut known, now);
                known.insert(
                    product_id,
                    Known::Reopened {
                        generation: newer,
                        at: now,
                    },
                );
            }
            Event::Subscribed => {
                let mut known = self.write();
                known.clear();
                self.epoch.fetch_add(1, Ordering::AcqRel);
                drop(known);
                self.live.store(true, Ordering::Relaxed);
                self.following.set(1.0);
            }
            Event::Lost => {
                self.live.store(false, Ordering::Relaxed);
                self.following.set(0.0);
                let mut known = self.write();
                known.clear();
                self.epoch.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<i64, Known>> {
        self.known
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<i64, Known>> {
        self.known
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Drops what no longer matters once the map has grown: answers past their TTL and
/// generations kept past [`FLOOR_KEPT`].
fn sweep(known: &mut HashMap<i64, Known>, now: Instant) {
    if known.len() < SWEEP_ABOVE {
        return;
    }
    known.retain(|_, k| match k {
        Known::SoldOut { until, .. } => now < *until,
        Known::Reopened { at, .. } => now < *at + FLOOR_KEPT,
    });
}

/// seckill-api's `410 sold_out`, byte for byte, with the flag's header.
fn sold_out(product_id: i64, generation: u64) -> Response {
    let mut response = Response::new(StatusCode::GONE);
    response.push_header(b"content-type", b"application/json");
    with_date(|date| response.push_header(b"date", date));
    // `<product id> <gen>`, put together on the stack: this runs for every purchase of the
    // flood.
    let (mut product, mut gen_buf) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (product, generation) = (product.format(product_id), gen_buf.format(generation));
    let mut value = [0u8; 41];
    let len = product.len() + 1 + generation.len();
    value[..product.len()].copy_from_slice(product.as_bytes());
    value[product.len()] = b' ';
    value[product.len() + 1..len].copy_from_slice(generation.as_bytes());
    response.push_header(SOLD_OUT_HEADER.as_bytes(), &value[..len]);
    response.body = Bytes::from_static(br#"{"code":"sold_out","message":"sold out"}"#);
    response
}

/// Follows the reopened announcements on `urls` into `edge` until `cancel`.
pub async fn follow(
    edge: std::sync::Arc<SoldOutEdge>,
    urls: Vec<String>,
    channel: String,
    cancel: tokio_util::sync::CancellationToken,
) {
    reopened::follow(urls, channel, cancel, move |event| edge.on_event(event)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica_410(product: i64, generation: u64) -> Response {
        let mut response = Response::new(StatusCode::GONE);
        response.push_header(
            SOLD_OUT_HEADER.as_bytes(),
            format!("{product} {generation}").as_bytes(),
        );
        response
    }

    fn live(ttl: Duration) -> SoldOutEdge {
        let edge = SoldOutEdge::new(ttl);
        edge.on_event(Event::Subscribed);
        edge
    }

    #[test]
    fn a_flagged_410_is_repeated_until_its_ttl() {
        let edge = live(Duration::from_millis(50));
        assert!(edge.answer(7).is_none());
        edge.learn(7, &replica_410(7, 3), edge.epoch());
        let answer = edge.answer(7).expect("answered at the edge");
        assert_eq!(answer.status, StatusCode::GONE);
        assert_eq!(answer.header(SOLD_OUT_HEADER), Some(&b"7 3"[..]));
        assert_eq!(
            &answer.body[..],
            br#"{"code":"sold_out","message":"sold out"}"#
        );
        assert!(edge.answer(8).is_none(), "another product");
        std::thread::sleep(Duration::from_millis(60));
        assert!(edge.answer(7).is_none(), "forgotten after the TTL");
    }

    #[test]
    fn only_a_flagged_410_of_the_same_product_is_learnt() {
        let edge = live(Duration::from_secs(60));
        edge.learn(7, &Response::new(StatusCode::GONE), edge.epoch());
        edge.learn(7, &replica_410(8, 1), edge.epoch());
        let mut conflict = replica_410(7, 1);
        conflict.status = StatusCode::CONFLICT;
        edge.learn(7, &conflict, edge.epoch());
        assert!(edge.answer(7).is_none());
        assert!(edge.answer(8).is_none());
    }

    #[test]
    fn a_reopen_forgets_at_once_and_refuses_older_answers() {
        let edge = live(Duration::from_secs(60));
        edge.learn(7, &replica_410(7, 3), edge.epoch());
        assert!(edge.answer(7).is_some());
        edge.on_event(Event::Reopened {
            product_id: 7,
            generation: 4,
        });
        assert!(edge.answer(7).is_none(), "forgotten on the announcement");
        // Decided before the reopen, arriving after it.
        edge.learn(7, &replica_410(7, 3), edge.epoch());
        assert!(edge.answer(7).is_none(), "a stale answer is not learnt");
        // Sold out again, under the new generation.
        edge.learn(7, &replica_410(7, 4), edge.epoch());
        assert!(edge.answer(7).is_some());
    }

    #[test]
    fn nothing_is_answered_while_announcements_may_be_missed() {
        let edge = SoldOutEdge::new(Duration::from_secs(60));
        edge.learn(7, &replica_410(7, 1), edge.epoch());
        assert!(edge.answer(7).is_none(), "not subscribed yet");
        edge.on_event(Event::Subscribed);
        edge.learn(7, &replica_410(7, 1), edge.epoch());
        assert!(edge.answer(7).is_some());
        edge.on_event(Event::Lost);
        assert!(edge.answer(7).is_none(), "subscription lost");
        edge.on_event(Event::Subscribed);
        assert!(edge.answer(7).is_none(), "forgotten across the gap");
    }

    #[test]
    fn an_answer_forwarded_across_a_gap_in_the_subscription_is_not_learnt() {
        let edge = live(Duration::from_secs(60));
        let before = edge.epoch();
        // Lost and made again while the purchase was with the replica: a reopen may have
        // been missed in between.
        edge.on_event(Event::Lost);
        edge.on_event(Event::Subscribed);
        edge.learn(7, &replica_410(7, 1), before);
        assert!(edge.answer(7).is_none());
        edge.learn(7, &replica_410(7, 1), edge.epoch());
        assert!(edge.answer(7).is_some());
    }

    #[test]
    fn a_zero_ttl_turns_the_edge_off() {
        let edge = live(Duration::ZERO);
        edge.learn(7, &replica_410(7, 1), edge.epoch());
        assert!(edge.answer(7).is_none());
    }
}
