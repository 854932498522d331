//! The buyers' side of a scenario: purchases sent at a steady pace, every answer kept per
//! buyer, so the verdict can tell which buyer could have bought and which could not.
//!
//! A wave is either single-shot (each buyer sends once and takes whatever answer comes, as
//! the burst under fault does) or patient (each buyer retries with one `Idempotency-Key`
//! until a definite answer or a deadline, as the buyers after the fault do: they show that
//! selling resumed and that no unit was left behind a `sold_out`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::header::{AUTHORIZATION, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::sync::mpsc::UnboundedSender;
use uuid::Uuid;

use crate::burst::{Buyer, Queued, TRANSPORT_ERROR};

/// Longest pause between two tries of a patient buyer.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(2);

/// How a wave sends its purchases.
#[derive(Debug, Clone)]
pub struct Wave {
    /// Gateways; buyer `i` goes to `gateway_urls[i % len]`.
    pub gateway_urls: Vec<String>,
    /// The product on sale.
    pub product_id: i64,
    /// Purchases started per second.
    pub rate_per_sec: u32,
    /// Purchases in flight at most.
    pub concurrency: usize,
    /// `Some(deadline)`: retry until a definite answer or this long after the wave began.
    pub patience: Option<Duration>,
    /// Where each buyer's `Authorization` goes when its `202` arrives, for those who
    /// settle their orders while the wave goes on ([`super::settle`]).
    pub accepted_to: Option<UnboundedSender<String>>,
}

/// One buyer's story.
#[derive(Debug, Clone)]
pub struct Story {
    /// The buyer.
    pub user_id: i64,
    /// The last answer's status (`"error"` when none came).
    pub last: String,
    /// The request id of a 202, if one came.
    pub accepted: Option<Uuid>,
    /// Whether any answer left open that this buyer bought: a 202, a 5xx or no answer.
    pub could_have_bought: bool,
    /// Whether the buyer was ever told `sold_out`.
    pub heard_sold_out: bool,
}

impl Story {
    /// Whether the last answer was definite: bought, already bought, or sold out.
    pub fn definite(&self) -> bool {
        matches!(self.last.as_str(), "202" | "409" | "410")
    }
}

/// What a wave saw.
#[derive(Debug, Default)]
pub struct Tally {
    /// Every buyer's story, in no particular order.
    pub stories: Vec<Story>,
    /// Every answer of every try by status, transport failures under `"error"`.
    pub status_counts: BTreeMap<String, u64>,
    /// `503 ledger_rebuilding` answers: the fence holding sales while a ledger is rebuilt.
    pub paused: u64,
    /// When the wave's first `202` arrived.
    pub first_accepted_at: Option<Instant>,
}

impl Tally {
    /// Buyers answered 202.
    pub fn accepted(&self) -> usize {
        self.stories.iter().filter(|s| s.accepted.is_some()).count()
    }
}

/// The error body's code; other fields are ignored.
#[derive(Deserialize)]
struct ErrorBody {
    code: String,
}

/// One try's answer.
struct Try {
    /// When the answer came.
    at: Instant,
    status: String,
    accepted: Option<Uuid>,
    paused: bool,
    retry_after: Option<Duration>,
}

/// Sends the wave; `answered` counts buyers whose first answer arrived, for the fault's
/// trigger, and `accepted` the 202s among them.
pub async fn run(
    client: &Client,
    wave: &Wave,
    buyers: &[Buyer],
    answered: &AtomicU64,
    accepted: &AtomicU64,
) -> Tally {
    let pace = Duration::from_secs_f64(1.0 / f64::from(wave.rate_per_sec.max(1)));
    let mut ticks = tokio::time::interval(pace);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let pacer = Arc::new(Mutex::new(ticks));
    let began = Instant::now();
    let stories = futures_util::stream::iter(buyers.iter().enumerate())
        .map(|(i, buyer)| {
            let pacer = pacer.clone();
            let url = format!(
                "{}/api/seckill/{}",
                wave.gateway_urls[i % wave.gateway_urls.len()].trim_end_matches('/'),
                wave.product_id
            );
            async move {
                pacer.lock().await.tick().await;
                let deadline = wave.patience.map(|p| began + p);
                let story = buy(client, &url, buyer, deadline, answered, accepted).await;
                if let (Some(to), Some(_)) = (&wave.accepted_to, story.0.accepted) {
                    // A settler that stopped listening only loses its own figures.
                    let _ = to.send(buyer.authorization.clone());
                }
                story
            }
        })
        .buffer_unordered(wave.concurrency)
        .collect::<Vec<_>>()
        .await;
    let mut tally = Tally::default();
    for (story, tries) in stories {
        for t in &tries {
            *tally.status_counts.entry(t.status.clone()).or_default() += 1;
            tally.paused += u64::from(t.paused);
            if t.accepted.is_some() {
                tally.first_accepted_at = Some(
                    tally
                        .first_accepted_at
                        .map_or(t.at, |first| first.min(t.at)),
                );
            }
        }
        tally.stories.push(story);
    }
    tally
}

/// One buyer: a try, and with a deadline more tries (same idempotency key) until a definite
/// answer or the deadline.
async fn buy(
    client: &Client,
    url: &str,
    buyer: &Buyer,
    deadline: Option<Instant>,
    answered: &AtomicU64,
    accepted: &AtomicU64,
) -> (Story, Vec<Try>) {
    let key = Uuid::new_v4().to_string();
    let mut story = Story {
        user_id: buyer.user_id,
        last: String::new(),
        accepted: None,
        could_have_bought: false,
        heard_sold_out: false,
    };
    let mut tries = Vec::new();
    let mut pause = Duration::from_millis(100);
    loop {
        let t = attempt(client, url, buyer, &key).await;
        if tries.is_empty() {
            answered.fetch_add(1, Ordering::Relaxed);
            if t.accepted.is_some() {
                accepted.fetch_add(1, Ordering::Relaxed);
            }
        }
        story.could_have_bought |=
            t.status.starts_with("202") || t.status == TRANSPORT_ERROR || t.status.starts_with('5');
        story.heard_sold_out |= t.status == "410";
        story.accepted = story.accepted.or(t.accepted);
        story.last = t.status.clone();
        let wait = t.retry_after.unwrap_or(pause).min(MAX_RETRY_PAUSE);
        tries.push(t);
        let again = match deadline {
            Some(deadline) => !story.definite() && Instant::now() + wait < deadline,
            None => false,
        };
        if !again {
            return (story, tries);
        }
        tokio::time::sleep(wait).await;
        pause = (pause * 2).min(MAX_RETRY_PAUSE);
    }
}

async fn attempt(client: &Client, url: &str, buyer: &Buyer, key: &str) -> Try {
    let sent = client
        .post(url)
        .header(AUTHORIZATION, &buyer.authorization)
        .header("idempotency-key", key)
        .send()
        .await;
    let Ok(response) = sent else {
        return Try {
            at: Instant::now(),
            status: TRANSPORT_ERROR.into(),
            accepted: None,
            paused: false,
            retry_after: None,
        };
    };
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = response.bytes().await.unwrap_or_default();
    let accepted = (status == StatusCode::ACCEPTED)
        .then(|| serde_json::from_slice::<Queued>(&body).ok())
        .flatten()
        .map(|q| q.request_id);
    let paused = status == StatusCode::SERVICE_UNAVAILABLE
        && serde_json::from_slice::<ErrorBody>(&body).is_ok_and(|e| e.code == "ledger_rebuilding");
    // A 202 whose body cannot be read still bought: it counts as an unknown outcome.
    let status = if status == StatusCode::ACCEPTED && accepted.is_none() {
        "202?".to_string()
    } else {
        status.as_u16().to_string()
    };
    Try {
        at: Instant::now(),
        status,
        accepted,
        paused,
        retry_after,
    }
}

/// How long selling of `product_id` takes to resume: from now, a new buyer (from `buyers`,
/// in turn) tries once every `every` until one is answered `202`; returns the time to that
/// answer (`None`: no `202` before the buyers or `deadline` ran out) and the
/// `503 ledger_rebuilding` answers on the way.
pub async fn time_to_resume(
    client: &Client,
    gateway_url: &str,
    product_id: i64,
    buyers: &[Buyer],
    every: Duration,
    deadline: Duration,
) -> (Option<Duration>, u64) {
    let url = format!(
        "{}/api/seckill/{product_id}",
        gateway_url.trim_end_matches('/')
    );
    let began = Instant::now();
    let mut paused = 0;
    for buyer in buyers {
        if began.elapsed() >= deadline {
            break;
        }
        let t = attempt(client, &url, buyer, &Uuid::new_v4().to_string()).await;
        if t.accepted.is_some() {
            return (Some(t.at - began), paused);
        }
        paused += u64::from(t.paused);
        tokio::time::sleep(every).await;
    }
    (None, paused)
}
