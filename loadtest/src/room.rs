//! The waiting-room scenario (`seckill-loadtest --waiting-room fifo|raffle`): a crowd joins a
//! queued sale within a short window before it starts, every buyer polls at the pace the
//! gateway sets and buys once admitted, and [`Crowd::verdict`] checks what the room promises:
//!
//! - the winners are exactly the first in the order of admission: with `fifo` the first
//!   places handed out (the gateway's arrival order), with `raffle` the first ranks of the
//!   draw re-derived from the seed the room published ([`crate::draw`]), every buyer's place
//!   in the published ticket list;
//! - with `fifo`, at least 95 % of them are among the first 110 % of buyers by the client's
//!   own send time (the network and the gateway may reorder buyers who sent within a
//!   moment);
//! - once the last unit sold, no poll sent a second later is answered anything but
//!   `sold_out`.
//!
//! The usual invariants (nothing oversold, nobody twice, every `202` an order) are checked by
//! the caller against the stores, as for a burst.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use reqwest::{Client, StatusCode, header::AUTHORIZATION};
use serde::Deserialize;
use tokio::sync::Semaphore;
use uuid::Uuid;

use crate::burst::{Buyer, Queued};
use crate::draw::Audit;

/// How long a buyer keeps at it before giving up: far beyond any sale of this size.
const PATIENCE: Duration = Duration::from_secs(180);

/// Share of the winners that must be among the first sends (see the module docs).
pub const IN_ORDER_SHARE: f64 = 0.95;

/// How soon after the last unit sold every poll must say so.
pub const SOLD_OUT_WITHIN: Duration = Duration::from_secs(1);

/// A join's or a poll's answer; other fields are ignored.
#[derive(Debug, Deserialize)]
struct RoomAnswer {
    #[serde(default)]
    ticket: Option<String>,
    state: String,
    place: u64,
    poll_after_ms: u64,
    #[serde(default)]
    purchase_path: Option<String>,
}

/// How a buyer's trip ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Bought: the purchase's answer.
    Bought {
        /// The purchase's status.
        status: u16,
        /// The request id of a `202`.
        request_id: Option<Uuid>,
    },
    /// Told `sold_out`, `closed` or `expired`.
    Told(String),
    /// A request failed or was refused: what happened.
    Failed(String),
}

/// What one buyer saw.
#[derive(Debug, Clone)]
pub struct Trip {
    /// The buyer.
    pub user_id: i64,
    /// Its turn in the send order (0: the first to send its join).
    pub send_rank: usize,
    /// The place the gateway gave it.
    pub place: Option<u64>,
    /// How it ended.
    pub end: End,
    /// When a `202` was answered.
    pub bought_at: Option<Instant>,
    /// Polls sent, each with when it was sent and whether it was answered `sold_out`.
    pub polls: Vec<(Instant, bool)>,
    /// When its join was sent.
    pub join_sent: Option<Instant>,
    /// The join's latency.
    pub join_latency: Option<Duration>,
}

/// The crowd's trips.
#[derive(Debug)]
pub struct Crowd {
    /// One per buyer, in send order.
    pub trips: Vec<Trip>,
    /// From the first join sent to the last sent.
    pub join_spread: Duration,
    /// From the first join to the last trip's end.
    pub wall: Duration,
}

/// Every buyer joins `product_id`'s room through `gateway_url`, buyer `k` of `buyers` at
/// `k / len` of `window`, at most `connections` requests in flight; then polls and buys.
pub async fn run(
    client: &Client,
    gateway_url: &str,
    product_id: i64,
    buyers: Vec<Buyer>,
    window: Duration,
    connections: usize,
) -> anyhow::Result<Crowd> {
    let base: Arc<str> = gateway_url.trim_end_matches('/').into();
    let permits = Arc::new(Semaphore::new(connections));
    let started = Instant::now();
    let count = buyers.len().max(1);
    let mut tasks = Vec::with_capacity(buyers.len());
    for (rank, buyer) in buyers.into_iter().enumerate() {
        let at = started + window.mul_f64(rank as f64 / count as f64);
        let (client, base, permits) = (client.clone(), base.clone(), permits.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            trip(&client, &base, product_id, buyer, rank, &permits).await
        }));
    }
    let mut trips = Vec::with_capacity(tasks.len());
    for task in tasks {
        trips.push(task.await.context("a buyer's task panicked")?);
    }
    let sent = trips.iter().filter_map(|t| t.join_sent);
    let join_spread = match (sent.clone().min(), sent.max()) {
        (Some(first), Some(last)) => last.duration_since(first),
        _ => Duration::ZERO,
    };
    Ok(Crowd {
        trips,
        join_spread,
        wall: started.elapsed(),
    })
}

/// One request under a permit: its status and body, or what went wrong.
async fn send(
    permits: &Semaphore,
    request: reqwest::RequestBuilder,
) -> Result<(StatusCode, Vec<u8>), String> {
    let _permit = permits.acquire().await.map_err(|e| e.to_string())?;
    let response = request
        .send()
        .await
        .map_err(|e| format!("transport: {e}"))?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| format!("body: {e}"))?;
    Ok((status, body.to_vec()))
}

/// A join's refusal that asks for a proof-of-work: its fresh challenge.
#[derive(Debug, Clone, Deserialize)]
struct PowChallenge {
    code: String,
    challenge: String,
    bits: u32,
}

/// The challenge to solve, when `status` and `body` are a join's refusal for a missing or
/// expired proof-of-work.
fn pow_challenge((status, body): &(StatusCode, Vec<u8>)) -> Option<PowChallenge> {
    let refused = [StatusCode::PRECONDITION_REQUIRED, StatusCode::FORBIDDEN].contains(status);
    let challenge: PowChallenge = serde_json::from_slice(body).ok().filter(|_| refused)?;
    ["proof_of_work_required", "proof_of_work_expired"]
        .contains(&challenge.code.as_str())
        .then_some(challenge)
}

/// One buyer: join, poll at the gateway's pace, buy when admitted.
async fn trip(
    client: &Client,
    base: &str,
    product_id: i64,
    buyer: Buyer,
    send_rank: usize,
    permits: &Semaphore,
) -> Trip {
    let mut trip = Trip {
        user_id: buyer.user_id,
        send_rank,
        place: None,
        end: End::Failed("never joined".into()),
        bought_at: None,
        polls: Vec::new(),
        join_sent: None,
        join_latency: None,
    };
    let deadline = Instant::now() + PATIENCE;
    let join_url = format!("{base}/api/rooms/{product_id}/join");
    let join = client
        .post(&join_url)
        .header(AUTHORIZATION, &buyer.authorization);
    let sent = Instant::now();
    trip.join_sent = Some(sent);
    let mut joined = send(permits, join).await;
    // A gateway asking for a proof-of-work: solve the challenge its refusal carries and join
    // again (twice at most: a challenge may expire while it is solved).
    for _ in 0..2 {
        let Some(challenge) = joined.as_ref().ok().and_then(pow_challenge) else {
            break;
        };
        let nonce = tokio::task::spawn_blocking({
            let challenge = challenge.clone();
            move || crate::pow::solve(&challenge.challenge, challenge.bits)
        })
        .await
        .unwrap_or(u64::MAX);
        let proof =
            serde_json::json!({"challenge": challenge.challenge, "nonce": nonce.to_string()});
        let again = client
            .post(&join_url)
            .header(AUTHORIZATION, &buyer.authorization)
            .json(&proof);
        joined = send(permits, again).await;
    }
    let mut answer = match joined {
        Ok((StatusCode::OK, body)) => match serde_json::from_slice::<RoomAnswer>(&body) {
            Ok(answer) => answer,
            Err(e) => {
                trip.end = End::Failed(format!("join answer unreadable: {e}"));
                return trip;
            }
        },
        Ok((status, body)) => {
            trip.end = End::Failed(format!("join {status}: {}", String::from_utf8_lossy(&body)));
            return trip;
        }
        Err(e) => {
            trip.end = End::Failed(e);
            return trip;
        }
    };
    trip.join_latency = Some(sent.elapsed());
    trip.place = Some(answer.place);
    let Some(ticket) = answer.ticket.clone() else {
        trip.end = End::Failed("a join answered without a ticket".into());
        return trip;
    };
    let poll_url = format!("{base}/api/rooms/{product_id}/tickets/{ticket}");
    loop {
        match answer.state.as_str() {
            "waiting" => {}
            "admitted" => {
                let Some(path) = answer.purchase_path.take() else {
                    trip.end = End::Failed("admitted without a purchase path".into());
                    return trip;
                };
                let buy = client
                    .post(format!("{base}{path}"))
                    .header(AUTHORIZATION, &buyer.authorization);
                trip.end = match send(permits, buy).await {
                    Ok((status, body)) => {
                        let request_id = (status == StatusCode::ACCEPTED)
                            .then(|| serde_json::from_slice::<Queued>(&body).ok())
                            .flatten()
                            .map(|q| q.request_id);
                        if status == StatusCode::ACCEPTED {
                            trip.bought_at = Some(Instant::now());
                        }
                        End::Bought {
                            status: status.as_u16(),
                            request_id,
                        }
                    }
                    Err(e) => End::Failed(e),
                };
                return trip;
            }
            other => {
                trip.end = End::Told(other.to_string());
                return trip;
            }
        }
        if Instant::now() >= deadline {
            trip.end = End::Failed("still waiting at the end of its patience".into());
            return trip;
        }
        tokio::time::sleep(Duration::from_millis(answer.poll_after_ms.max(100))).await;
        let poll = client
            .get(&poll_url)
            .header(AUTHORIZATION, &buyer.authorization);
        let sent = Instant::now();
        answer = match send(permits, poll).await {
            Ok((StatusCode::OK, body)) => match serde_json::from_slice::<RoomAnswer>(&body) {
                Ok(answer) => answer,
                Err(e) => {
                    trip.end = End::Failed(format!("poll answer unreadable: {e}"));
                    return trip;
                }
            },
            // Refused or shed: poll again a second later, as a page would.
            Ok((status, _)) if status.is_server_error() || status.as_u16() == 429 => RoomAnswer {
                ticket: None,
                state: "waiting".into(),
                place: trip.place.unwrap_or(0),
                poll_after_ms: 1000,
                purchase_path: None,
            },
            Ok((status, body)) => {
                trip.end =
                    End::Failed(format!("poll {status}: {}", String::from_utf8_lossy(&body)));
                return trip;
            }
            Err(e) => {
                trip.end = End::Failed(e);
                return trip;
            }
        };
        trip.polls.push((sent, answer.state == "sold_out"));
    }
}

/// The room's checks on a crowd for a sale of `stock` units.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Buyers answered `202`.
    pub accepted: usize,
    /// Ranks (places, or the draw's) of the winners that are not among the first `stock`.
    pub out_of_order: Vec<u64>,
    /// Share of the winners among the first 110 % by send time (`fifo` only).
    pub in_send_order: Option<f64>,
    /// Buyers whose place the published ticket list gives to another user (`raffle`).
    pub misfiled: Vec<i64>,
    /// Polls sent more than [`SOLD_OUT_WITHIN`] after the last `202` answered other than
    /// `sold_out`.
    pub late_polls: usize,
    /// Buyers whose trip failed, with the first few reasons.
    pub failed: usize,
    /// A few of the failures' reasons.
    pub failures: Vec<String>,
    /// Buyers told each final state.
    pub told: std::collections::BTreeMap<String, usize>,
}

impl Verdict {
    /// What broke a promise; empty when none did.
    pub fn problems(&self, stock: usize) -> Vec<String> {
        let mut problems = Vec::new();
        if self.accepted != stock {
            problems.push(format!(
                "{} purchases accepted for {stock} units",
                self.accepted
            ));
        }
        if !self.out_of_order.is_empty() {
            problems.push(format!(
                "winners beyond the first {stock} in the order of admission: {:?}",
                self.out_of_order
            ));
        }
        if let Some(share) = self.in_send_order
            && share < IN_ORDER_SHARE
        {
            problems.push(format!(
                "only {:.1} % of the winners among the first 110 % by send time",
                share * 100.0
            ));
        }
        if !self.misfiled.is_empty() {
            problems.push(format!(
                "buyers whose place the published ticket list gives to another: {:?}",
                self.misfiled
            ));
        }
        if self.late_polls > 0 {
            problems.push(format!(
                "{} polls sent over {} ms after the sell-out not told sold_out",
                self.late_polls,
                SOLD_OUT_WITHIN.as_millis()
            ));
        }
        if self.failed > 0 {
            problems.push(format!(
                "{} buyers failed: {:?}",
                self.failed, self.failures
            ));
        }
        problems
    }
}

impl Crowd {
    /// Adds `others`' trips (bots) and ranks every trip again by when its join was sent.
    pub fn add(&mut self, others: Vec<Trip>) {
        self.trips.extend(others);
        let mut order: Vec<usize> = (0..self.trips.len()).collect();
        order.sort_by_key(|&at| (self.trips[at].join_sent.is_none(), self.trips[at].join_sent));
        for (rank, at) in order.into_iter().enumerate() {
            self.trips[at].send_rank = rank;
        }
    }

    /// The request ids of the `202`s.
    pub fn accepted_ids(&self) -> Vec<Uuid> {
        self.trips
            .iter()
            .filter_map(|t| match t.end {
                End::Bought {
                    status: 202,
                    request_id,
                } => request_id,
                _ => None,
            })
            .collect()
    }

    /// The room's checks for a sale of `stock` units: of a `fifo` room, or with `draw`, of a
    /// raffle's audited draw.
    pub fn verdict(&self, stock: usize, draw: Option<&Audit>) -> Verdict {
        let winners: Vec<&Trip> = self
            .trips
            .iter()
            .filter(|t| t.bought_at.is_some())
            .collect();
        let rank = |place: u64| draw.map_or(place, |d| d.rank(place));
        let out_of_order: Vec<u64> = winners
            .iter()
            .filter_map(|t| t.place)
            .map(rank)
            .filter(|&rank| rank >= stock as u64)
            .collect();
        let early = stock + stock.div_ceil(10);
        let in_order = winners.iter().filter(|t| t.send_rank < early).count();
        let in_send_order = match draw {
            Some(_) => None,
            None if winners.is_empty() => Some(0.0),
            None => Some(in_order as f64 / winners.len() as f64),
        };
        let misfiled = draw.map_or_else(Vec::new, |d| {
            self.trips
                .iter()
                .filter(|t| {
                    t.place.is_some_and(|place| {
                        d.tickets
                            .get(place as usize)
                            .is_some_and(|&user| user != t.user_id)
                    })
                })
                .map(|t| t.user_id)
                .collect()
        });
        let sold_out_at = (winners.len() == stock)
            .then(|| winners.iter().filter_map(|t| t.bought_at).max())
            .flatten();
        let late_polls = sold_out_at.map_or(0, |at| {
            let after = at + SOLD_OUT_WITHIN;
            self.trips
                .iter()
                .flat_map(|t| t.polls.iter())
                .filter(|&&(sent, sold_out)| sent > after && !sold_out)
                .count()
        });
        let mut told = std::collections::BTreeMap::new();
        let mut failures = Vec::new();
        let mut failed = 0;
        for trip in &self.trips {
            match &trip.end {
                End::Told(state) => *told.entry(state.clone()).or_default() += 1,
                End::Bought { status, .. } => {
                    *told.entry(format!("bought {status}")).or_default() += 1
                }
                End::Failed(reason) => {
                    failed += 1;
                    if failures.len() < 5 {
                        failures.push(reason.clone());
                    }
                }
            }
        }
        Verdict {
            accepted: winners.len(),
            out_of_order,
            in_send_order,
            misfiled,
            late_polls,
            failed,
            failures,
            told,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trip(user_id: i64, send_rank: usize, place: u64, end: End, t0: Instant) -> Trip {
        let bought = matches!(end, End::Bought { status: 202, .. });
        Trip {
            user_id,
            send_rank,
            place: Some(place),
            bought_at: bought.then_some(t0 + Duration::from_millis(100 + place)),
            end,
            polls: Vec::new(),
            join_sent: Some(t0),
            join_latency: Some(Duration::from_millis(1)),
        }
    }

    fn bought() -> End {
        End::Bought {
            status: 202,
            request_id: Some(Uuid::nil()),
        }
    }

    #[test]
    fn a_sale_to_the_first_places_in_send_order_passes() {
        let t0 = Instant::now();
        let mut trips: Vec<Trip> = (0..4)
            .map(|i| trip(i, i as usize, i as u64, bought(), t0))
            .collect();
        let mut late = trip(9, 9, 9, End::Told("sold_out".into()), t0);
        // Sold out at +103 ms: a poll at +1.2 s told sold_out is fine.
        late.polls = vec![
            (t0 + Duration::from_millis(50), false),
            (t0 + Duration::from_millis(1200), true),
        ];
        trips.push(late);
        let crowd = Crowd {
            trips,
            join_spread: Duration::ZERO,
            wall: Duration::ZERO,
        };
        let verdict = crowd.verdict(4, None);
        assert_eq!(verdict.problems(4), Vec::<String>::new());
        assert_eq!(crowd.accepted_ids().len(), 4);
    }

    #[test]
    fn a_winner_out_of_place_a_late_sender_and_a_late_poll_each_fail_it() {
        let t0 = Instant::now();
        // The winners are places 0, 1 and 5 (not 2), and the one at place 5 sent last.
        let mut trips = vec![
            trip(1, 0, 0, bought(), t0),
            trip(2, 1, 1, bought(), t0),
            trip(3, 40, 5, bought(), t0),
            trip(4, 2, 2, End::Told("expired".into()), t0),
        ];
        let mut waiting = trip(5, 3, 3, End::Told("sold_out".into()), t0);
        // Sold out at +105 ms; told `waiting` at +1.5 s.
        waiting.polls = vec![(t0 + Duration::from_millis(1500), false)];
        trips.push(waiting);
        let crowd = Crowd {
            trips,
            join_spread: Duration::ZERO,
            wall: Duration::ZERO,
        };
        let verdict = crowd.verdict(3, None);
        assert_eq!(verdict.out_of_order, [5]);
        assert!((verdict.in_send_order.expect("fifo") - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(verdict.late_polls, 1);
        assert_eq!(verdict.problems(3).len(), 3, "{:?}", verdict.problems(3));
    }

    #[test]
    fn a_raffle_is_judged_by_the_draws_ranks_and_ticket_list() {
        let t0 = Instant::now();
        let audit = Audit {
            // Places 0..4 drawn as ranks 3, 0, 2, 1: places 1 and 3 are the first two.
            ranks: vec![3, 0, 2, 1],
            tickets: vec![10, 11, 12, 13],
        };
        let crowd = |winners: [u64; 2]| Crowd {
            trips: (0..4)
                .map(|place| {
                    let end = if winners.contains(&place) {
                        bought()
                    } else {
                        End::Told("sold_out".into())
                    };
                    // Sent in reverse: send order does not matter in a raffle.
                    trip(10 + place as i64, 3 - place as usize, place, end, t0)
                })
                .collect(),
            join_spread: Duration::ZERO,
            wall: Duration::ZERO,
        };
        let drawn = crowd([1, 3]).verdict(2, Some(&audit));
        assert_eq!(drawn.problems(2), Vec::<String>::new());
        assert_eq!(drawn.in_send_order, None);
        let arrival = crowd([0, 1]).verdict(2, Some(&audit));
        assert_eq!(arrival.out_of_order, [3]);
        let mut misfiled = crowd([1, 3]);
        misfiled.trips[2].user_id = 99;
        assert_eq!(misfiled.verdict(2, Some(&audit)).misfiled, [99]);
    }
}
