//! The pollers scenario (`seckill-loadtest --waiting-room fifo --pollers N`): what a crowd
//! waiting in line costs the gateway. N buyers join a queued sale that starts long after the
//! run (so every one of them stays `waiting`), then, for `--poll-for-secs`, each polls its
//! ticket at the pace the gateway sets: after every answer it waits the answer's
//! `poll_after_ms` and polls again, never sooner.
//!
//! The client keeps one schedule of due polls (a heap ordered by due time, not one sleeping
//! task per buyer) and sends them over a bounded pool of keep-alive connections, at most
//! `--concurrency` in flight. Reported: polls and polls/s, the latency quantiles, the answers
//! by status and state, the pace the gateway asked for, how late the client sent against the
//! schedule (a load generator falling behind shows here), the gateway's resident memory (with
//! `--gateway-pid`) and the Redis commands run during the window, by command, per poll.
//!
//! The verdict fails when a join or a poll was not answered `200`, when an answer was not
//! `waiting`, or when a buyer polled sooner than the gateway asked (a bug of this client).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reqwest::header::{AUTHORIZATION, HeaderValue, RETRY_AFTER};
use reqwest::{Client, StatusCode};
use serde::{Deserialize, Serialize};

use seckill_auth::TokenMinter;

use crate::burst::{Buyer, TRANSPORT_ERROR, mint_buyers};
use crate::check::{Failure, verdict_line};
use crate::product;
use crate::report::LatencyMs;

/// How far ahead the sale starts: far beyond any measurement, so every buyer stays waiting.
pub const SALE_STARTS_IN: Duration = Duration::from_secs(3600);

/// The pause after an answer that carried no pace (a refusal without `Retry-After`, a
/// transport error): a second, as a buyer's page would.
pub const FALLBACK_PAUSE_MS: u64 = 1000;

/// Slowest latency the histograms hold (the client's timeout is 30 s).
const MAX_LATENCY_US: u64 = 60_000_000;

/// How often the gateway's resident memory is sampled.
const RSS_EVERY: Duration = Duration::from_secs(1);

/// Clock ticks per second of `/proc/<pid>/stat`'s CPU times (`USER_HZ`, 100 on Linux).
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

/// What the scenario is given.
pub struct Setup<'a> {
    /// The HTTP client: its idle pool is as wide as `connections`.
    pub client: &'a Client,
    /// Gateway base URL.
    pub gateway_url: &'a str,
    /// The queued product whose room the buyers join.
    pub product_id: i64,
    /// The buyers, tokens minted.
    pub buyers: Vec<Buyer>,
    /// Requests in flight at most (joins, then polls).
    pub connections: usize,
    /// How long the buyers poll.
    pub poll_for: Duration,
    /// The gateway's process, for its resident memory and CPU time.
    pub gateway_pid: Option<u32>,
    /// The gateway's Redis (single node), for its command counts.
    pub redis_url: &'a str,
}

/// A join's or a poll's answer; other fields are ignored.
#[derive(Debug, Deserialize)]
struct RoomAnswer {
    #[serde(default)]
    ticket: Option<String>,
    state: String,
    poll_after_ms: u64,
}

/// The due polls, earliest first: `(due, buyer)`, times in microseconds since the run's start.
#[derive(Debug, Default)]
pub struct Schedule {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Schedule {
    /// An empty schedule with room for `buyers`.
    pub fn with_capacity(buyers: usize) -> Self {
        Self {
            heap: BinaryHeap::with_capacity(buyers),
        }
    }

    /// `buyer` polls at `due_us`.
    pub fn push(&mut self, due_us: u64, buyer: u32) {
        self.heap.push(Reverse((due_us, buyer)));
    }

    /// When the earliest poll is due.
    pub fn next_due(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((due, _))| *due)
    }

    /// The earliest poll if it is due at `now_us`, taken off the schedule.
    pub fn pop_due(&mut self, now_us: u64) -> Option<(u64, u32)> {
        match self.heap.peek() {
            Some(Reverse((due, _))) if *due <= now_us => self.heap.pop().map(|Reverse(e)| e),
            _ => None,
        }
    }

    /// Polls scheduled.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// How one poll was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answered {
    /// `200`: the state and the pace asked.
    Ok {
        /// The buyer's state.
        state: String,
        /// The pause the gateway asked for.
        poll_after_ms: u64,
    },
    /// Another status, with its `Retry-After` in seconds if any.
    Refused {
        /// The status.
        status: u16,
        /// `Retry-After`, seconds.
        retry_after_secs: Option<u64>,
    },
    /// `200` with a body that is no room answer.
    Unreadable,
    /// No HTTP answer.
    Transport,
}

impl Answered {
    /// The status key of the tallies (`"error"` for no answer).
    pub fn status_key(&self) -> String {
        match self {
            Self::Ok { .. } => "200".into(),
            Self::Refused { status, .. } => status.to_string(),
            Self::Unreadable => "200 unreadable".into(),
            Self::Transport => TRANSPORT_ERROR.into(),
        }
    }

    /// The pause the server asked for before the next poll: `poll_after_ms`, else
    /// `Retry-After`, else [`FALLBACK_PAUSE_MS`].
    pub fn pause_ms(&self) -> u64 {
        match self {
            Self::Ok { poll_after_ms, .. } => *poll_after_ms,
            Self::Refused {
                retry_after_secs: Some(secs),
                ..
            } => secs.saturating_mul(1000),
            _ => FALLBACK_PAUSE_MS,
        }
    }
}

/// One poll as the client saw it, times in microseconds since the run's start.
#[derive(Debug, Clone)]
pub struct Poll {
    /// The buyer.
    pub buyer: u32,
    /// When the schedule had it due.
    pub due_us: u64,
    /// When it was sent.
    pub sent_us: u64,
    /// The earliest the gateway's last answer to this buyer allowed it.
    pub allowed_us: u64,
    /// When its answer was read.
    pub answered_us: u64,
    /// The answer.
    pub answer: Answered,
}

impl Poll {
    /// When this buyer may poll next.
    pub fn next_due_us(&self) -> u64 {
        self.answered_us
            .saturating_add(self.answer.pause_ms().saturating_mul(1000))
    }
}

/// The tallies of the window's polls.
#[derive(Debug)]
pub struct Tally {
    /// Polls answered (or failed) that were sent in the window.
    pub polls: u64,
    /// Latency of the answered ones, microseconds.
    pub latency_us: Histogram<u64>,
    /// How late each was sent against the schedule, microseconds.
    pub lag_us: Histogram<u64>,
    /// Answers by status (`"error"`: none).
    pub status_counts: BTreeMap<String, u64>,
    /// `200` answers by state.
    pub states: BTreeMap<String, u64>,
    /// Sum of the `poll_after_ms` of the `200` answers.
    pace_sum_ms: u64,
    /// Polls sent before the gateway's last answer allowed.
    pub early: u64,
}

impl Tally {
    /// Empty tallies.
    pub fn new() -> anyhow::Result<Self> {
        let histogram = || {
            Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)
                .context("creating a latency histogram")
        };
        Ok(Self {
            polls: 0,
            latency_us: histogram()?,
            lag_us: histogram()?,
            status_counts: BTreeMap::new(),
            states: BTreeMap::new(),
            pace_sum_ms: 0,
            early: 0,
        })
    }

    /// Counts one poll.
    pub fn record(&mut self, poll: &Poll) {
        self.polls += 1;
        if poll.sent_us < poll.allowed_us {
            self.early += 1;
        }
        self.lag_us
            .saturating_record(poll.sent_us.saturating_sub(poll.due_us).max(1));
        if !matches!(poll.answer, Answered::Transport) {
            self.latency_us
                .saturating_record(poll.answered_us.saturating_sub(poll.sent_us).max(1));
        }
        *self
            .status_counts
            .entry(poll.answer.status_key())
            .or_default() += 1;
        if let Answered::Ok {
            state,
            poll_after_ms,
        } = &poll.answer
        {
            *self.states.entry(state.clone()).or_default() += 1;
            self.pace_sum_ms += poll_after_ms;
        }
    }

    /// Mean `poll_after_ms` the gateway answered (0 when no `200`).
    pub fn mean_pace_ms(&self) -> f64 {
        let ok = self.status_counts.get("200").copied().unwrap_or(0);
        if ok == 0 {
            0.0
        } else {
            self.pace_sum_ms as f64 / ok as f64
        }
    }
}

/// The gateway's resident memory over the run, kB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Rss {
    /// Before the joins.
    pub before_joins_kb: u64,
    /// When the polling began.
    pub window_start_kb: u64,
    /// Highest sample during the polling.
    pub max_kb: u64,
    /// When the polling ended.
    pub end_kb: u64,
}

/// `VmRSS` of a `/proc/<pid>/status`, kB.
pub fn vm_rss_kb(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
}

/// User plus system CPU time of a `/proc/<pid>/stat`, in clock ticks.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3, utime field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

fn read_rss(pid: u32) -> Option<u64> {
    vm_rss_kb(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?)
}

fn read_cpu(pid: &str) -> Option<u64> {
    cpu_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `INFO commandstats`: calls by command (`evalsha`, `hget`, `client|list`, …).
pub fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|line| line.trim().strip_prefix("cmdstat_"))
        .filter_map(|line| {
            let (name, stats) = line.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|field| field.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}

/// The calls made between two `INFO commandstats`, by command, without the `own` calls this
/// client made itself (the first `INFO` is counted in the second); commands not called left
/// out.
pub fn command_delta(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    own: &[(&str, u64)],
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, &calls)| {
            let mine = own.iter().find(|(n, _)| n == name).map_or(0, |&(_, n)| n);
            let was = before.get(name).copied().unwrap_or(0);
            (name.clone(), calls.saturating_sub(was).saturating_sub(mine))
        })
        .filter(|&(_, calls)| calls > 0)
        .collect()
}

/// The Redis commands run during the polling window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RedisCommands {
    /// All commands, by anyone, on the instance.
    pub total: u64,
    /// `total` / polls.
    pub per_poll: f64,
    /// By command.
    pub by_command: BTreeMap<String, u64>,
}

impl RedisCommands {
    /// The window's commands against its polls.
    pub fn new(by_command: BTreeMap<String, u64>, polls: u64) -> Self {
        let total = by_command.values().sum();
        Self {
            total,
            per_poll: if polls == 0 {
                0.0
            } else {
                total as f64 / polls as f64
            },
            by_command,
        }
    }
}

/// The scenario's report; its fields are the JSON keys.
#[derive(Debug, Serialize)]
pub struct PollersReport {
    /// The product whose room was polled.
    pub product_id: i64,
    /// Buyers.
    pub pollers: u64,
    /// Buyers who joined (`200` with a ticket).
    pub joined: u64,
    /// Joins not answered `200` with a ticket, by status (`"error"`: no answer).
    pub join_failures: BTreeMap<String, u64>,
    /// From the first join sent to the last answered, seconds.
    pub join_secs: f64,
    /// Latency of the joins.
    pub join_latency_ms: LatencyMs,
    /// The polling window, seconds.
    pub window_secs: f64,
    /// Polls sent in the window.
    pub polls: u64,
    /// Polls per second over the window.
    pub polls_per_sec: f64,
    /// Latency of the answered polls.
    pub latency_ms: LatencyMs,
    /// Polls by answer status.
    pub status_counts: BTreeMap<String, u64>,
    /// `200` answers by state.
    pub states: BTreeMap<String, u64>,
    /// Mean `poll_after_ms` the gateway answered.
    pub mean_poll_after_ms: f64,
    /// How late the client sent against the schedule.
    pub send_lag_ms: LatencyMs,
    /// Polls sent sooner than the gateway asked.
    pub early_polls: u64,
    /// The gateway's resident memory (with its pid).
    pub gateway_rss: Option<Rss>,
    /// The gateway's CPU over the window, % of one core (with its pid).
    pub gateway_cpu_percent: Option<f64>,
    /// This client's CPU over the window, % of one core.
    pub client_cpu_percent: Option<f64>,
    /// The Redis commands run during the window.
    pub redis: Option<RedisCommands>,
}

impl PollersReport {
    /// What failed the run; empty when nothing did.
    pub fn failures(&self) -> Vec<Failure> {
        let mut failures = Vec::new();
        let joins_failed: u64 = self.join_failures.values().sum();
        if joins_failed > 0 {
            failures.push(Failure {
                name: "joins_answered",
                detail: format!("{joins_failed} joins failed: {:?}", self.join_failures),
            });
        }
        let refused: BTreeMap<&String, &u64> = self
            .status_counts
            .iter()
            .filter(|(status, _)| status.as_str() != "200")
            .collect();
        if !refused.is_empty() {
            failures.push(Failure {
                name: "polls_answered",
                detail: format!("polls not answered 200: {refused:?}"),
            });
        }
        let not_waiting: BTreeMap<&String, &u64> = self
            .states
            .iter()
            .filter(|(state, _)| state.as_str() != "waiting")
            .collect();
        if !not_waiting.is_empty() {
            failures.push(Failure {
                name: "all_waiting",
                detail: format!("answers other than waiting: {not_waiting:?}"),
            });
        }
        if self.early_polls > 0 {
            failures.push(Failure {
                name: "paced_by_server",
                detail: format!(
                    "{} polls sent sooner than the gateway asked (a client bug)",
                    self.early_polls
                ),
            });
        }
        if self.polls == 0 {
            failures.push(Failure {
                name: "polled",
                detail: "no poll was due in the window".into(),
            });
        }
        failures
    }

    /// Writes the report as pretty JSON.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self).context("serialising the report")?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("writing the report to {}", path.display()))
    }

    /// The human summary, ending with the verdict line.
    pub fn human(&self) -> String {
        let counts = |map: &BTreeMap<String, u64>| {
            map.iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let quantiles = |l: &LatencyMs| {
            format!(
                "p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
                l.p50, l.p90, l.p99, l.max
            )
        };
        let mb = |kb: u64| kb as f64 / 1024.0;
        let mut out = format!(
            "waiting room, product {}: {} pollers\n\
             joined                   {} in {:.1} s ({:.0} joins/s)\n\
             join latency ms          {}\n\
             join failures            {}\n\
             polling window           {:.1} s\n\
             polls                    {}\n\
             polls/s                  {:.1}\n\
             poll latency ms          {}\n\
             poll status codes        {}\n\
             poll states              {}\n\
             mean poll_after_ms       {:.0}\n\
             send lag ms              {}\n\
             polls sooner than asked  {}\n",
            self.product_id,
            self.pollers,
            self.joined,
            self.join_secs,
            if self.join_secs > 0.0 {
                self.joined as f64 / self.join_secs
            } else {
                0.0
            },
            quantiles(&self.join_latency_ms),
            if self.join_failures.is_empty() {
                "0".into()
            } else {
                counts(&self.join_failures)
            },
            self.window_secs,
            self.polls,
            self.polls_per_sec,
            quantiles(&self.latency_ms),
            counts(&self.status_counts),
            counts(&self.states),
            self.mean_poll_after_ms,
            quantiles(&self.send_lag_ms),
            self.early_polls,
        );
        match &self.gateway_rss {
            Some(rss) => out.push_str(&format!(
                "gateway RSS MB           before joins {:.1}  at start {:.1}  max {:.1}  end {:.1}\n",
                mb(rss.before_joins_kb),
                mb(rss.window_start_kb),
                mb(rss.max_kb),
                mb(rss.end_kb)
            )),
            None => out.push_str("gateway RSS              not sampled (no --gateway-pid)\n"),
        }
        let percent = |p: Option<f64>| p.map_or("-".into(), |p| format!("{p:.0} %"));
        out.push_str(&format!(
            "CPU, % of a core         gateway {}  this client {}\n",
            percent(self.gateway_cpu_percent),
            percent(self.client_cpu_percent)
        ));
        match &self.redis {
            Some(redis) => out.push_str(&format!(
                "Redis commands           {} in the window, {:.4} per poll (whole instance): {}\n",
                redis.total,
                redis.per_poll,
                counts(&redis.by_command)
            )),
            None => out.push_str("Redis commands           not counted\n"),
        }
        for failure in self.failures() {
            out.push_str(&format!("FAILED {}: {}\n", failure.name, failure.detail));
        }
        out.push_str(&verdict_line(&self.failures()));
        out
    }
}

/// Reads the instance's `INFO commandstats`.
struct CommandStats {
    conn: redis::aio::MultiplexedConnection,
}

impl CommandStats {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url).context("the Redis URL")?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .context("connecting to Redis for its command counts")?;
        Ok(Self { conn })
    }

    async fn read(&mut self) -> anyhow::Result<BTreeMap<String, u64>> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut self.conn)
            .await
            .context("INFO commandstats")?;
        Ok(command_calls(&info))
    }
}

/// Samples a process's resident memory every [`RSS_EVERY`] until told to stop; returns the
/// highest sample.
fn sample_rss(
    pid: u32,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<u64>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut max = 0;
        let mut every = tokio::time::interval(RSS_EVERY);
        loop {
            tokio::select! {
                _ = &mut stopped => return max,
                _ = every.tick() => {
                    max = max.max(read_rss(pid).unwrap_or(0));
                }
            }
        }
    });
    (stop, task)
}

/// A buyer in line: where its ticket is polled and with what token.
struct Poller {
    url: String,
    authorization: HeaderValue,
}

/// Microseconds since `t0`.
fn micros_since(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// Joins every buyer, then polls for the window; the report.
pub async fn run(setup: Setup<'_>) -> anyhow::Result<PollersReport> {
    let base = setup.gateway_url.trim_end_matches('/').to_string();
    let product_id = setup.product_id;
    let pollers = setup.buyers.len() as u64;
    let connections = setup.connections.max(1);
    let t0 = Instant::now();
    let mut rss = setup.gateway_pid.map(|pid| Rss {
        before_joins_kb: read_rss(pid).unwrap_or(0),
        ..Rss::default()
    });

    // The joins, `connections` at a time.
    let join_url = format!("{base}/api/rooms/{product_id}/join");
    let bar = progress_bar(pollers, "joins");
    let mut join_latency = Histogram::<u64>::new_with_bounds(1, MAX_LATENCY_US, 3)
        .context("creating the join histogram")?;
    let mut join_failures: BTreeMap<String, u64> = BTreeMap::new();
    let mut line: Vec<Poller> = Vec::with_capacity(setup.buyers.len());
    let mut schedule = Schedule::with_capacity(setup.buyers.len());
    let mut allowed_us: Vec<u64> = Vec::with_capacity(setup.buyers.len());
    {
        let joins = setup.buyers.into_iter().map(|buyer| {
            let request = setup
                .client
                .post(&join_url)
                .header(AUTHORIZATION, &buyer.authorization);
            async move {
                let sent = Instant::now();
                let outcome = match request.send().await {
                    Ok(response) => {
                        let status = response.status();
                        match response.bytes().await {
                            Ok(body) if status == StatusCode::OK => {
                                serde_json::from_slice::<RoomAnswer>(&body)
                                    .ok()
                                    .and_then(|a| a.ticket.map(|t| (t, a.poll_after_ms)))
                                    .ok_or_else(|| "200 without a ticket".to_string())
                            }
                            _ => Err(status.as_u16().to_string()),
                        }
                    }
                    Err(_) => Err(TRANSPORT_ERROR.to_string()),
                };
                (buyer, sent.elapsed(), outcome)
            }
        });
        let mut joins = futures_util::stream::iter(joins).buffer_unordered(connections);
        while let Some((buyer, latency, outcome)) = joins.next().await {
            bar.inc(1);
            let (ticket, pause_ms) = match outcome {
                Ok(joined) => joined,
                Err(key) => {
                    *join_failures.entry(key).or_default() += 1;
                    continue;
                }
            };
            join_latency.saturating_record(
                u64::try_from(latency.as_micros())
                    .unwrap_or(u64::MAX)
                    .max(1),
            );
            let authorization = HeaderValue::from_str(&buyer.authorization)
                .context("a buyer's token is no header value")?;
            let index = u32::try_from(line.len()).context("too many pollers")?;
            let due = micros_since(t0).saturating_add(pause_ms.saturating_mul(1000));
            schedule.push(due, index);
            allowed_us.push(due);
            line.push(Poller {
                url: format!("{base}/api/rooms/{product_id}/tickets/{ticket}"),
                authorization,
            });
        }
    }
    bar.finish_and_clear();
    let join_secs = t0.elapsed().as_secs_f64();
    let joined = line.len() as u64;
    eprintln!(
        "{joined} of {pollers} joined in {join_secs:.1} s; polling for {} s",
        setup.poll_for.as_secs()
    );

    // The window.
    let mut redis = if setup.redis_url.contains(',') {
        eprintln!("Redis commands not counted: a Redis Cluster spreads them over its nodes");
        None
    } else {
        Some(CommandStats::connect(setup.redis_url).await?)
    };
    let commands_before = match redis.as_mut() {
        Some(stats) => Some(stats.read().await?),
        None => None,
    };
    let sampler = setup.gateway_pid.map(sample_rss);
    if let (Some(rss), Some(pid)) = (rss.as_mut(), setup.gateway_pid) {
        rss.window_start_kb = read_rss(pid).unwrap_or(0);
    }
    let gateway_cpu_before = setup.gateway_pid.and_then(|p| read_cpu(&p.to_string()));
    let client_cpu_before = read_cpu("self");
    let line = Arc::new(line);
    let mut tally = Tally::new()?;
    let window_start = micros_since(t0);
    let window_end =
        window_start.saturating_add(u64::try_from(setup.poll_for.as_micros()).unwrap_or(u64::MAX));
    let mut in_flight = FuturesUnordered::new();
    let bar = progress_bar(setup.poll_for.as_secs(), "polling, s");
    loop {
        let mut now = micros_since(t0);
        while in_flight.len() < connections && now < window_end {
            let Some((due_us, buyer)) = schedule.pop_due(now) else {
                break;
            };
            let allowed = allowed_us[buyer as usize];
            let (client, line) = (setup.client.clone(), line.clone());
            in_flight.push(tokio::spawn(async move {
                let poller = &line[buyer as usize];
                let sent_us = micros_since(t0);
                let answer = poll(&client, poller).await;
                Poll {
                    buyer,
                    due_us,
                    sent_us,
                    allowed_us: allowed,
                    answered_us: micros_since(t0),
                    answer,
                }
            }));
            now = micros_since(t0);
        }
        bar.set_position(now.saturating_sub(window_start) / 1_000_000);
        if now >= window_end && in_flight.is_empty() {
            break;
        }
        let can_send = in_flight.len() < connections && now < window_end;
        let wake = schedule.next_due().unwrap_or(u64::MAX).min(window_end);
        tokio::select! {
            done = in_flight.next(), if !in_flight.is_empty() => {
                let Some(done) = done else { continue };
                let done = done.context("a poll's task panicked")?;
                tally.record(&done);
                let next = done.next_due_us();
                allowed_us[done.buyer as usize] = next;
                schedule.push(next, done.buyer);
            }
            () = tokio::time::sleep_until((t0 + Duration::from_micros(wake)).into()), if can_send => {}
        }
    }
    bar.finish_and_clear();
    let window = Duration::from_micros(micros_since(t0).saturating_sub(window_start));
    let window_secs = window.as_secs_f64();
    let redis = match (redis.as_mut(), commands_before) {
        (Some(stats), Some(before)) => {
            let after = stats.read().await?;
            let delta = command_delta(&before, &after, &[("info", 1)]);
            Some(RedisCommands::new(delta, tally.polls))
        }
        _ => None,
    };
    let cpu_percent = |before: Option<u64>, after: Option<u64>| {
        let ticks = after?.checked_sub(before?)?;
        Some(ticks as f64 / CLOCK_TICKS_PER_SEC / window_secs.max(1e-9) * 100.0)
    };
    let gateway_cpu_percent = cpu_percent(
        gateway_cpu_before,
        setup.gateway_pid.and_then(|p| read_cpu(&p.to_string())),
    );
    let client_cpu_percent = cpu_percent(client_cpu_before, read_cpu("self"));
    if let (Some(rss), Some(pid), Some((stop, task))) = (rss.as_mut(), setup.gateway_pid, sampler) {
        rss.end_kb = read_rss(pid).unwrap_or(0);
        let _ = stop.send(());
        let sampled = task.await.context("the memory sampler panicked")?;
        rss.max_kb = sampled.max(rss.window_start_kb).max(rss.end_kb);
    }
    Ok(PollersReport {
        product_id,
        pollers,
        joined,
        join_failures,
        join_secs,
        join_latency_ms: LatencyMs::from_micros(&join_latency),
        window_secs,
        polls: tally.polls,
        polls_per_sec: tally.polls as f64 / window_secs.max(1e-9),
        latency_ms: LatencyMs::from_micros(&tally.latency_us),
        mean_poll_after_ms: tally.mean_pace_ms(),
        send_lag_ms: LatencyMs::from_micros(&tally.lag_us),
        status_counts: tally.status_counts,
        states: tally.states,
        early_polls: tally.early,
        gateway_rss: rss,
        gateway_cpu_percent,
        client_cpu_percent,
        redis,
    })
}

/// One poll; its answer once the body is read.
async fn poll(client: &Client, poller: &Poller) -> Answered {
    let response = match client
        .get(&poller.url)
        .header(AUTHORIZATION, poller.authorization.clone())
        .send()
        .await
    {
        Ok(response) => response,
        Err(_) => return Answered::Transport,
    };
    let status = response.status();
    let retry_after_secs = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let body = response.bytes().await;
    match body {
        Ok(body) if status == StatusCode::OK => match serde_json::from_slice::<RoomAnswer>(&body) {
            Ok(answer) => Answered::Ok {
                state: answer.state,
                poll_after_ms: answer.poll_after_ms,
            },
            Err(_) => Answered::Unreadable,
        },
        _ => Answered::Refused {
            status: status.as_u16(),
            retry_after_secs,
        },
    }
}

fn progress_bar(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(&format!(
        "{what} {{bar:40.cyan/blue}} {{pos}}/{{len}} [{{elapsed_precise}}]"
    ))
    .unwrap_or_else(|_| ProgressStyle::default_bar())
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}

/// The scenario as `seckill-loadtest` runs it.
pub struct Options {
    /// Gateway base URL.
    pub gateway_url: String,
    /// The room's mode (`fifo`).
    pub mode: String,
    /// Units of the product (never sold: the sale starts after the run).
    pub stock: i32,
    /// Its price.
    pub price_cents: i64,
    /// Buyers.
    pub pollers: u64,
    /// The first buyer's user id.
    pub first_user_id: i64,
    /// Requests in flight at most.
    pub connections: usize,
    /// How long the buyers poll.
    pub poll_for: Duration,
    /// The gateway's process.
    pub gateway_pid: Option<u32>,
    /// The gateway's Redis.
    pub redis_url: String,
    /// Validity of the buyers' tokens, seconds.
    pub token_ttl_secs: i64,
    /// Where to write the JSON report.
    pub report: Option<PathBuf>,
}

/// Creates the queued product, mints the buyers, runs [`run`], prints the summary and writes
/// the report; `Ok(pass)`.
pub async fn scenario(
    client: &Client,
    minter: &TokenMinter,
    options: &Options,
) -> anyhow::Result<bool> {
    let start_in =
        chrono::Duration::from_std(SALE_STARTS_IN).context("the sale's start is too far")?;
    let product_id = product::create_queued(
        client,
        &options.gateway_url,
        minter,
        options.stock,
        options.price_cents,
        start_in,
        &options.mode,
    )
    .await?;
    let buyers = mint_buyers(
        minter,
        options.first_user_id,
        options.pollers,
        options.token_ttl_secs,
    );
    eprintln!(
        "product {product_id} (room {}, sale in {} s): {} buyers join, at most {} requests \
         in flight, then poll for {} s",
        options.mode,
        SALE_STARTS_IN.as_secs(),
        buyers.len(),
        options.connections,
        options.poll_for.as_secs()
    );
    let report = run(Setup {
        client,
        gateway_url: &options.gateway_url,
        product_id,
        buyers,
        connections: options.connections,
        poll_for: options.poll_for,
        gateway_pid: options.gateway_pid,
        redis_url: &options.redis_url,
    })
    .await?;
    println!("{}", report.human());
    if let Some(path) = &options.report {
        report.write_json(path)?;
    }
    Ok(report.failures().is_empty())
}

#[cfg(test)]
mod tests;
