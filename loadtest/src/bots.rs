//! Bots alongside the crowd of a queued sale (`--bots N`): accounts that each join and
//! try to buy many times a second, to show that volume buys nothing in a waiting room.
//!
//! A bot arrives like any buyer, at a moment of the join window (drawn at random), then
//! until the crowd is done it sends, at `rate` a second each: a join (the same place every
//! time; its answer tells the bot its state, so the joins are also its polls) and a purchase
//! attempt — without a pass, with the gateway's `admitted` query written by itself, or with
//! a forged pass, in turn. When a join's answer admits it, the bot buys with its own pass,
//! as a buyer would, and sends nothing else until that purchase has a final answer (a `429`
//! from the rate limit its other attempts ran into is tried again on the next tick). So the bots hold places by arrival like everyone, and the verdict
//! ([`BotRun::problems`]) checks that they win no more than their share of the buyers, and
//! that no attempt without a pass the gateway gave was ever accepted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Client, StatusCode, header::AUTHORIZATION};
use serde::Deserialize;
use tokio::sync::watch;

use crate::burst::{Buyer, Queued};
use crate::room::{End, Trip};

/// A join's answer, as far as a bot reads it.
#[derive(Debug, Deserialize)]
struct Joined {
    state: String,
    place: u64,
    #[serde(default)]
    purchase_path: Option<String>,
}

/// What the bots did.
#[derive(Debug, Default)]
pub struct BotRun {
    /// One trip per bot, as for a buyer (its place, its own purchase with its pass).
    pub trips: Vec<Trip>,
    /// Requests sent, by kind and answer (`join 200`, `no pass 428`, `forged pass 403`…).
    pub sent: BTreeMap<String, usize>,
    /// Purchases without a pass the gateway gave that were accepted: must be none.
    pub accepted_without_pass: usize,
    /// From the first bot's arrival to the last request.
    pub wall: Duration,
}

impl BotRun {
    /// Requests the bots sent in all.
    pub fn requests(&self) -> usize {
        self.sent.values().sum()
    }

    /// Bots that bought a unit.
    pub fn winners(&self) -> usize {
        self.trips.iter().filter(|t| t.bought_at.is_some()).count()
    }

    /// The most units the bots may win and still have gained nothing: their share of the
    /// buyers (`bots / buyers` of `stock`) plus three standard deviations of the count a
    /// share drawn at random would give (binomial), plus one.
    pub fn allowed(bots: usize, buyers: usize, stock: usize) -> usize {
        if buyers == 0 {
            return 0;
        }
        let p = bots as f64 / buyers as f64;
        let mean = stock as f64 * p;
        let spread = (stock as f64 * p * (1.0 - p)).sqrt();
        (mean + 3.0 * spread + 1.0).floor() as usize
    }

    /// What broke a promise, for bots among `buyers` (bots included) buying `stock` units.
    pub fn problems(&self, buyers: usize, stock: usize) -> Vec<String> {
        let mut problems = Vec::new();
        if self.accepted_without_pass > 0 {
            problems.push(format!(
                "{} bot purchases without the gateway's pass were accepted",
                self.accepted_without_pass
            ));
        }
        let allowed = Self::allowed(self.trips.len(), buyers, stock);
        if self.winners() > allowed {
            problems.push(format!(
                "the bots won {} units: more than their share of the buyers allows ({allowed})",
                self.winners()
            ));
        }
        problems
    }
}

/// Runs `bots` against `product_id`'s room through `base`, each arriving at a random moment
/// of `window` (from now) and sending a join and a purchase attempt `rate` times a second,
/// until `done` turns true.
pub async fn run(
    client: &Client,
    base: &str,
    product_id: i64,
    bots: Vec<Buyer>,
    window: Duration,
    rate: u32,
    done: watch::Receiver<bool>,
) -> BotRun {
    let started = Instant::now();
    let base: Arc<str> = base.trim_end_matches('/').into();
    let mut seed = started.elapsed().as_nanos() as u64 ^ 0x9e37_79b9_7f4a_7c15;
    let mut tasks = Vec::with_capacity(bots.len());
    for bot in bots {
        seed = next(seed);
        let at = started + window.mul_f64((seed >> 11) as f64 / (1u64 << 53) as f64);
        let (client, base, done) = (client.clone(), base.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            one(&client, &base, product_id, bot, rate, done).await
        }));
    }
    let mut run = BotRun::default();
    for task in tasks {
        let Ok((trip, sent, accepted_without_pass)) = task.await else {
            continue;
        };
        run.trips.push(trip);
        run.accepted_without_pass += accepted_without_pass;
        for (kind, count) in sent {
            *run.sent.entry(kind).or_default() += count;
        }
    }
    run.wall = started.elapsed();
    run
}

/// xorshift64: enough to spread the bots' arrivals.
fn next(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// One bot's run: its trip, what it sent, and its purchases accepted without a pass.
async fn one(
    client: &Client,
    base: &str,
    product_id: i64,
    bot: Buyer,
    rate: u32,
    done: watch::Receiver<bool>,
) -> (Trip, BTreeMap<String, usize>, usize) {
    let mut trip = Trip {
        user_id: bot.user_id,
        send_rank: 0,
        place: None,
        end: End::Told("never admitted".into()),
        bought_at: None,
        polls: Vec::new(),
        join_sent: None,
        join_latency: None,
    };
    let mut sent = BTreeMap::new();
    let mut accepted_without_pass = 0;
    let mut tick = tokio::time::interval(Duration::from_secs(1) / rate.max(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let forged = [
        format!("/api/seckill/{product_id}"),
        format!("/api/seckill/{product_id}?admitted=0"),
        format!("/api/seckill/{product_id}/0.99999999999999.00000000000000000000000000000000"),
    ];
    let mut turn = 0usize;
    let mut pass: Option<String> = None;
    loop {
        if *done.borrow() {
            break;
        }
        tick.tick().await;
        // The join, which also tells the bot its state.
        let request_sent = Instant::now();
        let joined = client
            .post(format!("{base}/api/rooms/{product_id}/join"))
            .header(AUTHORIZATION, &bot.authorization)
            .send()
            .await;
        let joined = match joined {
            Ok(response) => {
                let status = response.status();
                *sent.entry(format!("join {}", status.as_u16())).or_default() += 1;
                match response.bytes().await {
                    Ok(body) if status == StatusCode::OK => {
                        serde_json::from_slice::<Joined>(&body).ok()
                    }
                    _ => None,
                }
            }
            Err(_) => {
                *sent.entry("join transport error".into()).or_default() += 1;
                None
            }
        };
        if let Some(joined) = joined {
            if trip.place.is_none() {
                trip.place = Some(joined.place);
                trip.join_sent = Some(request_sent);
                trip.join_latency = Some(request_sent.elapsed());
            } else {
                trip.polls.push((request_sent, joined.state == "sold_out"));
            }
            if pass.is_none()
                && matches!(trip.end, End::Told(_))
                && let Some(path) = joined.purchase_path.filter(|_| joined.state == "admitted")
            {
                pass = Some(path);
            } else if !matches!(trip.end, End::Bought { .. }) {
                trip.end = End::Told(joined.state);
            }
        }
        if let Some(path) = pass.as_deref()
            && !matches!(trip.end, End::Bought { status, .. } if final_answer(status))
        {
            {
                // Admitted: buy with its own pass, as any buyer, until a final answer (a
                // `429` or a `5xx` is tried again on the next tick, with nothing else sent).
                let bought = client
                    .post(format!("{base}{path}"))
                    .header(AUTHORIZATION, &bot.authorization)
                    .send()
                    .await;
                let (status, request_id) = match bought {
                    Ok(response) => {
                        let status = response.status();
                        let body = response.bytes().await.unwrap_or_default();
                        let id = serde_json::from_slice::<Queued>(&body).ok();
                        (status.as_u16(), id.map(|q| q.request_id))
                    }
                    Err(_) => (0, None),
                };
                *sent.entry(format!("with its pass {status}")).or_default() += 1;
                if status == 202 {
                    trip.bought_at = Some(Instant::now());
                }
                trip.end = End::Bought { status, request_id };
            }
            continue;
        }
        // A purchase it was not given a pass for.
        let path = &forged[turn % forged.len()];
        turn += 1;
        let kind = ["no pass", "own admitted query", "forged pass"][(turn - 1) % forged.len()];
        match client
            .post(format!("{base}{path}"))
            .header(AUTHORIZATION, &bot.authorization)
            .send()
            .await
        {
            Ok(response) => {
                let status = response.status();
                let _ = response.bytes().await;
                if status == StatusCode::ACCEPTED {
                    accepted_without_pass += 1;
                }
                *sent
                    .entry(format!("{kind} {}", status.as_u16()))
                    .or_default() += 1;
            }
            Err(_) => *sent.entry(format!("{kind} transport error")).or_default() += 1,
        }
    }
    (trip, sent, accepted_without_pass)
}

/// Whether a purchase's `status` settles it (a retry would get the same).
fn final_answer(status: u16) -> bool {
    !(status == 0 || status == 429 || status >= 500)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bots_allowance_is_their_share_and_three_deviations() {
        // 50 bots among 20,050 buyers for 500 units: 1.25 expected, sd 1.12.
        assert_eq!(BotRun::allowed(50, 20_050, 500), 5);
        assert_eq!(BotRun::allowed(0, 100, 10), 1);
        assert_eq!(BotRun::allowed(10, 0, 10), 0);
    }

    #[test]
    fn a_purchase_without_a_pass_or_too_many_wins_fail_the_bots_verdict() {
        let t0 = Instant::now();
        let winner = |user_id| Trip {
            user_id,
            send_rank: 0,
            place: Some(0),
            end: End::Bought {
                status: 202,
                request_id: None,
            },
            bought_at: Some(t0),
            polls: Vec::new(),
            join_sent: Some(t0),
            join_latency: None,
        };
        let mut run = BotRun {
            trips: (0..2).map(winner).collect(),
            ..BotRun::default()
        };
        assert!(run.problems(2_000, 500).is_empty());
        run.accepted_without_pass = 1;
        assert_eq!(run.problems(2_000, 500).len(), 1);
        run.accepted_without_pass = 0;
        run.trips = (0..10).map(winner).collect();
        assert_eq!(
            run.problems(2_000, 500).len(),
            1,
            "10 of 500 for 10 in 2,000"
        );
    }
}
