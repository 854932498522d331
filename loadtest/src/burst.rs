//! The timed burst: every buyer sends exactly one purchase, at most `concurrency` in flight.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reqwest::{Client, StatusCode, header::AUTHORIZATION};
use serde::Deserialize;
use uuid::Uuid;

use seckill_auth::TokenMinter;

/// Status-count key for a request that got no HTTP answer (connect error, timeout, reset).
pub const TRANSPORT_ERROR: &str = "error";

/// Slowest latency the histogram can hold: twice the client timeout, so nothing saturates.
const MAX_LATENCY_US: u64 = 60_000_000;

/// A user ready to buy; the token is minted before the clock starts.
pub struct Buyer {
    /// The user id, also the token's `sub`.
    pub user_id: i64,
    /// The full `Authorization` header value.
    pub authorization: String,
}

/// Mints one token per user id in `first..first + users`.
pub fn mint_buyers(minter: &TokenMinter, first: i64, users: u64, ttl_secs: i64) -> Vec<Buyer> {
    (0..users as i64)
        .map(|offset| {
            let user_id = first + offset;
            let token = minter.mint(user_id, &[], ttl_secs);
            Buyer {
                user_id,
                authorization: format!("Bearer {token}"),
            }
        })
        .collect()
}

/// What the burst saw from the client side.
pub struct BurstOutcome {
    /// Requests sent (one per buyer).
    pub requests: u64,
    /// Responses by status code, transport failures under [`TRANSPORT_ERROR`].
    pub status_counts: BTreeMap<String, u64>,
    /// Responses with status 202.
    pub accepted: u64,
    /// The `request_id` of every readable 202.
    pub request_ids: Vec<Uuid>,
    /// 202s whose body held no readable `request_id`; they cannot be traced to an order.
    pub unreadable_accepts: u64,
    /// Latency of every answered request, in microseconds (transport errors excluded).
    pub latency_us: Histogram<u64>,
    /// Wall time from the first request to the last answer.
    pub wall: Duration,
    /// Distinct user ids that took part.
    pub distinct_users: u64,
}

impl BurstOutcome {
    /// Requests per second over the burst's wall time.
    pub fn throughput_rps(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.requests as f64 / secs
        } else {
            0.0
        }
    }
}

/// The 202 body; other fields are ignored.
#[derive(Deserialize)]
pub(crate) struct Queued {
    /// The purchase's id, which its order row carries.
    pub(crate) request_id: Uuid,
}

/// How one purchase ended.
enum Answer {
    /// An HTTP answer; for a 202, the request id if the body was readable.
    Http(StatusCode, Option<Uuid>),
    /// No HTTP answer at all.
    Transport,
}

/// Builds the one client of the burst, its idle pool as wide as the concurrency so that
/// connections are reused instead of re-opened mid-burst.
pub fn client(concurrency: usize) -> anyhow::Result<Client> {
    Client::builder()
        .pool_max_idle_per_host(concurrency)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()
        .context("building the HTTP client")
}

/// Sends one purchase per buyer, `concurrency` at a time, and tallies the answers.
pub async fn run(
    client: &Client,
    gateway_url: &str,
    product_id: i64,
    buyers: &[Buyer],
    concurrency: usize,
) -> anyhow::Result<BurstOutcome> {
    let url = format!(
        "{}/api/seckill/{product_id}",
        gateway_url.trim_end_matches('/')
    );
    let mut outcome = BurstOutcome {
        requests: 0,
        status_counts: BTreeMap::new(),
        accepted: 0,
        request_ids: Vec::with_capacity(buyers.len()),
        unreadable_accepts: 0,
        latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
            .context("creating the latency histogram")?,
        wall: Duration::ZERO,
        distinct_users: distinct_users(buyers),
    };
    let bar = progress_bar(buyers.len() as u64);

    let started = Instant::now();
    let mut answers = futures_util::stream::iter(buyers.iter().map(|b| buy(client, &url, b)))
        .buffer_unordered(concurrency);
    while let Some((latency, answer)) = answers.next().await {
        outcome.requests += 1;
        let key = match answer {
            Answer::Http(status, request_id) => {
                let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
                outcome.latency_us.saturating_record(micros.max(1));
                if status == StatusCode::ACCEPTED {
                    outcome.accepted += 1;
                    match request_id {
                        Some(id) => outcome.request_ids.push(id),
                        None => outcome.unreadable_accepts += 1,
                    }
                }
                status.as_u16().to_string()
            }
            Answer::Transport => TRANSPORT_ERROR.to_string(),
        };
        *outcome.status_counts.entry(key).or_default() += 1;
        bar.inc(1);
    }
    outcome.wall = started.elapsed();
    bar.finish_and_clear();
    Ok(outcome)
}

/// One purchase; the latency includes reading the body, as a real client would.
async fn buy(client: &Client, url: &str, buyer: &Buyer) -> (Duration, Answer) {
    let started = Instant::now();
    let response = client
        .post(url)
        .header(AUTHORIZATION, &buyer.authorization)
        .send()
        .await;
    let answer = match response {
        Ok(response) => {
            let status = response.status();
            match response.bytes().await {
                Ok(body) if status == StatusCode::ACCEPTED => {
                    let id = serde_json::from_slice::<Queued>(&body).ok();
                    Answer::Http(status, id.map(|q| q.request_id))
                }
                // Once the status line arrived, a body cut short does not change the answer.
                _ => Answer::Http(status, None),
            }
        }
        Err(_) => Answer::Transport,
    };
    (started.elapsed(), answer)
}

fn distinct_users(buyers: &[Buyer]) -> u64 {
    let ids: std::collections::HashSet<i64> = buyers.iter().map(|b| b.user_id).collect();
    ids.len() as u64
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "burst {bar:40.cyan/blue} {pos}/{len} [{elapsed_precise}] {per_sec} eta {eta}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}
