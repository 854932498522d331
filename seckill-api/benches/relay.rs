//! The outbox relay's confirmed publish rate against publishing the same messages without
//! confirms, alternating (baseline, relay, baseline, relay, ...).
//!
//! Run through `scripts/bench-stock.sh` (or `cargo bench -p seckill-api --bench relay`);
//! without `--bench` (that is, under `cargo test --benches`) it does nothing.
//!
//! N outbox entries, exactly as `purchase.lua` writes them, are spread over the outbox
//! streams of one product. The baseline publishes the same N bodies with the relay's
//! properties on one channel without `confirm_select` and is timed until the queue holds N.
//! The relay run times [`Relay::run`] from its channel opening until every stream is empty
//! and the queue holds N. Under purchase traffic the handlers hint the relay which streams
//! have news; `--hints on` simulates that (every stream hinted every millisecond), `--hints
//! off` shows a backlog drained with no traffic (after a broker outage, say), where the relay
//! only finds the streams on its periodic safety scan.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::{Parser, ValueEnum};
use futures_util::StreamExt;
use lapin::options::{ConfirmSelectOptions, QueuePurgeOptions};
use lapin::{Channel, Confirmation};
use tokio_util::sync::CancellationToken;

use seckill_api::relay::{Relay, RelayHints, create_group, register};
use seckill_messaging::OrderMessage;
use seckill_store::{Redis, RedisConn};
use seckill_testkit::TestNamespace;

mod support;
use support::{Procs, load_average, median, wait_for_quiet};

/// The product whose outbox streams hold the entries.
const PRODUCT: i64 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Hints {
    /// Every stream hinted every millisecond, as purchase traffic does.
    On,
    /// No hints: a backlog found by the relay's periodic safety scan only.
    Off,
    /// One run of each.
    Both,
}

#[derive(Debug, Parser)]
#[command(about = "Outbox relay (publisher confirms) vs. publishing without confirms")]
struct Args {
    /// Outbox entries (and messages) per run.
    #[arg(long, env = "BENCH_MESSAGES", default_value_t = 50_000)]
    messages: usize,
    /// Outbox streams (buckets) the entries are spread over.
    #[arg(long, env = "BENCH_STREAMS", default_value_t = 16)]
    streams: u16,
    /// The relay's entries per stream per round; a comma-separated list runs each.
    #[arg(
        long,
        env = "BENCH_RELAY_BATCH",
        value_delimiter = ',',
        default_value = "256"
    )]
    batch: Vec<usize>,
    /// Whether the relay is hinted, as under purchase traffic.
    #[arg(long, env = "BENCH_RELAY_HINTS", value_enum, default_value_t = Hints::On)]
    hints: Hints,
    /// Publishes the baseline keeps in flight: 1 awaits each before the next, as the relay
    /// does; more lets lapin write them back to back.
    #[arg(long, env = "BENCH_BASELINE_WINDOW", default_value_t = 64)]
    baseline_window: usize,
    /// Also time publishing with confirms the relay's way (a round published one by one,
    /// then every confirm awaited) but without Redis: what the confirms alone cost.
    #[arg(long, env = "BENCH_CONFIRM_PROBE", default_value_t = true, action = clap::ArgAction::Set)]
    confirm_probe: bool,
    /// Baseline/relay rounds.
    #[arg(long, env = "BENCH_ROUNDS", default_value_t = 2)]
    rounds: usize,
    /// Before each run, wait until the machine's other work uses at most this many cores
    /// (over one second); the machine is shared, and a run next to a build means little.
    #[arg(long, env = "BENCH_QUIET_BELOW", default_value_t = 0.3)]
    quiet_below: f64,
    /// Longest wait for that quiet, in seconds; the run then starts anyway (and says so).
    #[arg(long, env = "BENCH_QUIET_WAIT_SECS", default_value_t = 120)]
    quiet_wait_secs: u64,
    /// Set by `cargo bench`; without it the binary exits at once.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.bench {
        eprintln!("relay bench skipped: run it with scripts/bench-stock.sh or cargo bench");
        return Ok(());
    }
    ensure!(args.messages > 0 && args.streams > 0 && args.rounds > 0 && args.baseline_window > 0);
    ensure!(args.batch.iter().all(|b| *b > 0), "batch must be positive");
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let ns = TestNamespace::new();
            let outcome = bench(&args, &ns).await;
            ns.cleanup().await;
            outcome
        })
}

/// One outbox entry, as `purchase.lua` writes it.
struct Entry {
    request_id: String,
    payload: String,
    http_request_id: String,
}

/// One measured run.
struct Run {
    label: String,
    rate: f64,
    secs: f64,
    cpu: String,
}

async fn bench(args: &Args, ns: &TestNamespace) -> anyhow::Result<()> {
    let redis = Redis::new(&ns.redis_url, ns.redis_cluster, 4)?;
    let mut conn = redis.get().await?;
    let (_publisher, publisher) = ns.channel().await;
    let (_monitor, monitor) = ns.channel().await;
    let (_confirming, confirming) = ns.channel().await;
    confirming
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let entries = entries(args.messages);
    let procs = Procs::find(
        &mut conn,
        vec![("publisher", vec![std::process::id()])],
        None,
    )
    .await;
    let hint_modes: &[bool] = match args.hints {
        Hints::On => &[true],
        Hints::Off => &[false],
        Hints::Both => &[true, false],
    };
    let mut runs: Vec<(usize, Run)> = Vec::new();
    for round in 0..args.rounds {
        let quiet = wait_for_quiet(args.quiet_below, args.quiet_wait_secs).await;
        let before = procs.sample();
        let (rate, secs) =
            unconfirmed(ns, &publisher, &monitor, &entries, args.baseline_window).await?;
        let run = Run {
            label: format!("no confirms, {} in flight", args.baseline_window),
            rate,
            secs,
            cpu: procs.sample().usage_since(&before, quiet),
        };
        print_run(round + 1, &run);
        runs.push((round, run));
        for &batch in &args.batch {
            for &hinted in hint_modes {
                fill(ns, &mut conn, args.streams, &entries).await?;
                let quiet = wait_for_quiet(args.quiet_below, args.quiet_wait_secs).await;
                let before = procs.sample();
                let (rate, secs) = relayed(ns, &redis, &monitor, args, batch, hinted).await?;
                let run = Run {
                    label: format!(
                        "relay batch {batch}{}",
                        if hinted { "" } else { ", no hints" }
                    ),
                    rate,
                    secs,
                    cpu: procs.sample().usage_since(&before, quiet),
                };
                print_run(round + 1, &run);
                runs.push((round, run));
            }
            if args.confirm_probe {
                let round_size = batch * usize::from(args.streams);
                for window in [1, args.baseline_window] {
                    let quiet = wait_for_quiet(args.quiet_below, args.quiet_wait_secs).await;
                    let before = procs.sample();
                    let (rate, secs) =
                        confirmed(ns, &confirming, &monitor, &entries, round_size, window).await?;
                    let run = Run {
                        label: format!(
                            "confirms without Redis, rounds of {round_size}, {window} in flight"
                        ),
                        rate,
                        secs,
                        cpu: procs.sample().usage_since(&before, quiet),
                    };
                    print_run(round + 1, &run);
                    runs.push((round, run));
                }
            }
        }
    }
    report(args, &runs);
    Ok(())
}

fn print_run(round: usize, run: &Run) {
    eprintln!(
        "  round {round} {:<30} {:>8.0} msg/s  {:>6.2} s  {}",
        run.label, run.rate, run.secs, run.cpu
    );
}

fn report(args: &Args, runs: &[(usize, Run)]) {
    println!(
        "\n## relay: confirmed publish vs. no confirms ({} messages/run over {} streams)\n",
        args.messages, args.streams
    );
    println!("| round | publisher | msg/s | seconds | CPU cores used |");
    println!("|---|---|---:|---:|---|");
    for (round, run) in runs {
        println!(
            "| {} | {} | {:.0} | {:.2} | {} |",
            round + 1,
            run.label,
            run.rate,
            run.secs,
            run.cpu
        );
    }
    println!();
    let baseline = |round: usize| {
        runs.iter()
            .find(|(r, run)| *r == round && run.label.starts_with("no confirms"))
            .map(|(_, run)| run.rate)
            .unwrap_or(f64::NAN)
    };
    let mut labels: Vec<&str> = Vec::new();
    for (_, run) in runs {
        if run.label.starts_with("relay") && !labels.contains(&run.label.as_str()) {
            labels.push(&run.label);
        }
    }
    for label in labels {
        let ratios: Vec<f64> = runs
            .iter()
            .filter(|(_, run)| run.label == label)
            .map(|(round, run)| run.rate / baseline(*round))
            .collect();
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        let median = median(ratios);
        println!(
            "{label} / no confirms per round: {}; median {median:.2} ({:.0} %, goal ≥ 60 %: {})",
            shown.join(", "),
            median * 100.0,
            if median >= 0.6 { "met" } else { "NOT met" }
        );
    }
    println!("load average now: {}", load_average());
}

/// N entries with distinct request ids and realistic order bodies.
fn entries(n: usize) -> Vec<Entry> {
    let now = chrono::Utc::now();
    (0..n)
        .map(|i| {
            let request_id = uuid::Uuid::now_v7();
            let message = OrderMessage {
                request_id,
                user_id: 100_000_000 + i as i64,
                product_id: PRODUCT,
                price_cents: 99_900,
                created_at: now,
                bucket: None,
            };
            Entry {
                request_id: request_id.to_string(),
                payload: serde_json::to_string(&message).expect("plain struct"),
                http_request_id: uuid::Uuid::new_v4().to_string(),
            }
        })
        .collect()
}

/// Writes the entries round-robin into the product's outbox streams, registered and with
/// the relay's group, as the stock engine and `purchase.lua` do.
async fn fill(
    ns: &TestNamespace,
    conn: &mut RedisConn,
    streams: u16,
    entries: &[Entry],
) -> anyhow::Result<()> {
    let keys = ns.keys();
    let names: Vec<String> = (0..streams).map(|b| keys.outbox(PRODUCT, b)).collect();
    for name in &names {
        register(conn, &keys, name, i64::MAX).await?;
        create_group(conn, name).await?;
    }
    for (chunk_index, chunk) in entries.chunks(1_000).enumerate() {
        let mut pipe = redis::pipe();
        for (i, entry) in chunk.iter().enumerate() {
            let stream = &names[(chunk_index * 1_000 + i) % names.len()];
            pipe.cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg("request_id")
                .arg(&entry.request_id)
                .arg("payload")
                .arg(&entry.payload)
                .arg("http_request_id")
                .arg(&entry.http_request_id)
                .ignore();
        }
        pipe.query_async::<()>(conn).await?;
    }
    Ok(())
}

/// The signer the relay and order-service of `ns` use.
fn signer(ns: &TestNamespace) -> seckill_messaging::OrderSigner {
    seckill_messaging::OrderSigner::new(ns.backend_settings().order_signing_key.expose())
}

/// Publishes one entry with the relay's properties.
async fn publish(
    ns: &TestNamespace,
    channel: &Channel,
    entry: &Entry,
) -> lapin::Result<lapin::PublisherConfirm> {
    seckill_messaging::publish_order(
        channel,
        &signer(ns),
        &ns.topology(),
        &entry.request_id,
        &entry.http_request_id,
        entry.payload.as_bytes(),
    )
    .await
}

/// Publishes every entry as the relay would, minus confirms, `window` publishes in flight;
/// time until the queue holds all.
async fn unconfirmed(
    ns: &TestNamespace,
    publisher: &Channel,
    monitor: &Channel,
    entries: &[Entry],
    window: usize,
) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    let publishes = entries.iter().map(|entry| publish(ns, publisher, entry));
    let mut published = futures_util::stream::iter(publishes).buffered(window);
    while let Some(outcome) = published.next().await {
        outcome.context("publish")?;
    }
    wait_for(ns, monitor, None, entries.len()).await?;
    let secs = started.elapsed().as_secs_f64();
    purge(ns, monitor).await?;
    Ok((entries.len() as f64 / secs, secs))
}

/// Publishes on a confirming channel the relay's way, `round` entries at a time, `window`
/// publishes in flight (the relay: 1), then awaits all of the round's confirms; no Redis.
async fn confirmed(
    ns: &TestNamespace,
    channel: &Channel,
    monitor: &Channel,
    entries: &[Entry],
    round: usize,
    window: usize,
) -> anyhow::Result<(f64, f64)> {
    let started = Instant::now();
    for chunk in entries.chunks(round) {
        let publishes = chunk.iter().map(|entry| publish(ns, channel, entry));
        let confirms: Vec<_> = futures_util::stream::iter(publishes)
            .buffered(window)
            .collect()
            .await;
        for confirm in confirms {
            let confirmation = confirm?.await?;
            ensure!(
                matches!(confirmation, Confirmation::Ack(None)),
                "not confirmed: {confirmation:?}"
            );
        }
    }
    wait_for(ns, monitor, None, entries.len()).await?;
    let secs = started.elapsed().as_secs_f64();
    purge(ns, monitor).await?;
    Ok((entries.len() as f64 / secs, secs))
}

/// Runs the relay over the filled streams; time from its channel opening until the streams
/// are empty and the queue holds every entry.
async fn relayed(
    ns: &TestNamespace,
    redis: &Redis,
    monitor: &Channel,
    args: &Args,
    batch: usize,
    hinted: bool,
) -> anyhow::Result<(f64, f64)> {
    let keys = ns.keys();
    let streams: Vec<String> = (0..args.streams).map(|b| keys.outbox(PRODUCT, b)).collect();
    let hints = Arc::new(RelayHints::default());
    let connected = Arc::new(AtomicBool::new(false));
    let relay = Relay {
        redis: redis.clone(),
        keys,
        amqp_url: ns.amqp_url.clone(),
        topology: ns.topology(),
        signer: signer(ns),
        db: seckill_store::postgres::connect_and_migrate(
            &ns.database_url,
            2,
            Duration::from_secs(10),
        )
        .await
        .context("migrate the bench's database")?,
        batch,
        batch_max: 64,
        reclaim_idle: Duration::from_secs(30),
        hints: hints.clone(),
        connected: connected.clone(),
        consumer: format!("bench-{}", uuid::Uuid::new_v4().simple()),
        // The relay alone publishes what is in the outbox: what this bench measures.
        handlers_publish: false,
        scan_every: seckill_api::relay::SCAN_EVERY,
        consumer_idle: seckill_api::relay::CONSUMER_IDLE,
        work: Arc::default(),
    };
    let cancel = CancellationToken::new();
    let task = tokio::spawn(relay.run(cancel.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !connected.load(Ordering::Relaxed) {
        ensure!(
            Instant::now() < deadline,
            "the relay did not connect in 30 s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let started = Instant::now();
    if hinted {
        let (hints, streams, cancel) = (hints.clone(), streams.clone(), cancel.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(1));
            while !cancel.is_cancelled() {
                tick.tick().await;
                for stream in &streams {
                    hints.hint(stream.clone());
                }
            }
        });
    }
    let waited = wait_for(ns, monitor, Some((redis, &streams)), args.messages).await;
    let secs = started.elapsed().as_secs_f64();
    cancel.cancel();
    let _ = task.await;
    waited?;
    purge(ns, monitor).await?;
    Ok((args.messages as f64 / secs, secs))
}

/// Polls until the queue holds `expected` messages and (if given) the streams are empty.
async fn wait_for(
    ns: &TestNamespace,
    monitor: &Channel,
    streams: Option<(&Redis, &[String])>,
    expected: usize,
) -> anyhow::Result<()> {
    let queue = ns.topology().queue;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let mut left = 0;
        if let Some((redis, names)) = streams {
            let mut pipe = redis::pipe();
            for name in names {
                pipe.cmd("XLEN").arg(name);
            }
            let mut conn = redis.get().await?;
            let lengths: Vec<u64> = pipe.query_async(&mut conn).await?;
            left = lengths.iter().sum();
        }
        if left == 0 && ns.queue_depth(monitor, &queue).await as usize >= expected {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{expected} messages not in the queue after 600 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn purge(ns: &TestNamespace, channel: &Channel) -> anyhow::Result<()> {
    channel
        .queue_purge(
            ns.topology().queue.as_str().into(),
            QueuePurgeOptions::default(),
        )
        .await?;
    Ok(())
}
