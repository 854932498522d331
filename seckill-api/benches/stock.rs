//! The purchase hot path, side by side: `redis-benchmark` running `purchase.lua` through
//! `EVALSHA` against seckill-api's `POST /api/seckill/{id}` hit directly, at the same
//! concurrency and request count, alternating (EVALSHA, endpoint, EVALSHA, endpoint, ...).
//!
//! Run through `scripts/bench-stock.sh` (or `cargo bench -p seckill-api --bench stock`);
//! without `--bench` (that is, under `cargo test --benches`) it does nothing.
//!
//! Every request takes the accept path for a distinct buyer on both sides: the EVALSHA run
//! uses `__rand_int__` user ids on a bucket of a product Postgres does not know (checked
//! afterwards: the bucket's `remaining` must drop by about N), the endpoint run one fresh
//! user id per request on a product whose stock never runs out. Besides rate and latency,
//! each run reports the CPU each process used (from `/proc`), which is what explains the
//! ratio on a small machine where the load generator shares the cores.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use lapin::options::QueuePurgeOptions;
use tokio::process::{Child, Command};

use seckill_auth::{IdentitySigner, RequestFacts};
use seckill_messaging::OrderMessage;
use seckill_store::RedisConn;
use seckill_testkit::{INTERNAL_KEY, SendAs, TestNamespace};

mod support;
use support::{Procs, load_average, median, wait_for_quiet};

/// Product id of the hand-made EVALSHA bucket; never created in Postgres.
const FAKE_PRODUCT: i64 = 999_999;
/// An AMQP URL nothing listens on (`--no-relay`).
const DEAD_BROKER: &str = "amqp://guest:guest@127.0.0.1:9/%2f";
/// Slowest latency the histograms hold, in microseconds.
const MAX_LATENCY_US: u64 = 60_000_000;

#[derive(Debug, Parser)]
#[command(about = "Lua deduction (redis-benchmark EVALSHA) vs. the purchase endpoint")]
struct Args {
    /// Requests in flight, on both sides.
    #[arg(long, env = "BENCH_CONCURRENCY", default_value_t = 64)]
    concurrency: usize,
    /// Requests per run, on both sides.
    #[arg(long, env = "BENCH_REQUESTS", default_value_t = 100_000)]
    requests: u64,
    /// Stock buckets of the endpoint's product.
    #[arg(long, env = "BENCH_BUCKETS", default_value_t = 16)]
    buckets: i16,
    /// EVALSHA/endpoint pairs to run.
    #[arg(long, env = "BENCH_ROUNDS", default_value_t = 2)]
    rounds: usize,
    /// Tokio worker threads of the HTTP load generator (redis-benchmark uses one).
    #[arg(long, env = "BENCH_CLIENT_THREADS", default_value_t = 1)]
    client_threads: usize,
    /// Extra environment for the seckill-api process, `KEY=VALUE` (repeatable), e.g.
    /// `--api-env SECKILL_API_REDIS_POOL_SIZE=16`.
    #[arg(long = "api-env", value_parser = parse_env_pair)]
    api_env: Vec<(String, String)>,
    /// Before each run, wait until the machine's other work uses at most this many cores
    /// (over one second); the machine is shared, and a run next to a build means little.
    #[arg(long, env = "BENCH_QUIET_BELOW", default_value_t = 0.3)]
    quiet_below: f64,
    /// Longest wait for that quiet, in seconds; the run then starts anyway (and says so).
    #[arg(long, env = "BENCH_QUIET_WAIT_SECS", default_value_t = 120)]
    quiet_wait_secs: u64,
    /// Diagnostic: start seckill-api with an unreachable broker, so its relay publishes
    /// nothing and the endpoint runs without RabbitMQ on the CPU (entries pile up in the
    /// outbox and are deleted between runs).
    #[arg(long, env = "BENCH_NO_RELAY")]
    no_relay: bool,
    /// Set by `cargo bench`; without it the binary exits at once.
    #[arg(long, hide = true)]
    bench: bool,
}

fn parse_env_pair(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {text:?}"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.bench {
        eprintln!("stock bench skipped: run it with scripts/bench-stock.sh or cargo bench");
        return Ok(());
    }
    ensure!(args.concurrency > 0 && args.requests > 0 && args.rounds > 0);
    let runtime = if args.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.client_threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async {
        let ns = TestNamespace::new();
        let outcome = bench(&args, &ns).await;
        ns.cleanup().await;
        outcome
    })
}

/// One measured run.
struct Run {
    label: &'static str,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    note: String,
    cpu: String,
    /// Redis commands per request during the run (the relay's included) and their time.
    redis: String,
}

async fn bench(args: &Args, ns: &TestNamespace) -> anyhow::Result<()> {
    ensure!(
        !ns.redis_cluster,
        "the stock bench needs a single Redis server"
    );
    let mut api = Service::start(ns, &args.api_env, args.no_relay).await?;
    let outcome = match api.create_product(args.buckets).await {
        Ok(()) => measure(args, ns, &api).await,
        Err(e) => Err(e),
    };
    api.stop().await;
    let mut redis = ns.redis().await;
    let keys = ns.keys();
    for key in bucket_keys(&keys, FAKE_PRODUCT) {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query_async(&mut redis).await;
    }
    for bucket in 0..args.buckets as u16 {
        let _: redis::RedisResult<()> = redis::cmd("DEL")
            .arg(keys.outbox(api.product, bucket))
            .query_async(&mut redis)
            .await;
    }
    outcome
}

async fn measure(args: &Args, ns: &TestNamespace, api: &Service) -> anyhow::Result<()> {
    let mut redis = ns.redis().await;
    let (_amqp, channel) = ns.channel().await;
    let own = vec![("api", vec![api.pid]), ("client", vec![std::process::id()])];
    let procs = Procs::find(&mut redis, own, Some("redis-benchmark")).await;
    let evalsha = EvalSha::prepare(ns, &mut redis).await?;
    let endpoint = Endpoint::new(args, api);
    eprintln!("warming up the endpoint (loads the stock, fills the pools)");
    endpoint.burst(10_000_000, args.requests.min(2_000)).await?;
    drain_outbox(&mut redis, ns, api, args.buckets, &channel).await?;

    let mut runs = Vec::new();
    for round in 0..args.rounds {
        let quiet = wait_for_quiet(args.quiet_below, args.quiet_wait_secs).await;
        let (before, stats) = (procs.sample(), command_stats(&mut redis).await?);
        let (mut run, deducted) = evalsha.run(args, &mut redis).await?;
        run.cpu = procs.sample().usage_since(&before, quiet);
        run.redis = per_request(&stats, &command_stats(&mut redis).await?, args.requests);
        run.note = format!("remaining -{deducted}");
        print_run(round + 1, &run);
        runs.push(run);

        let lua_before = api.lua_seconds().await?;
        let quiet = wait_for_quiet(args.quiet_below, args.quiet_wait_secs).await;
        let (before, stats) = (procs.sample(), command_stats(&mut redis).await?);
        let first_user = 100_000_000 * (round as i64 + 1);
        let mut run = endpoint.burst(first_user, args.requests).await?;
        run.cpu = procs.sample().usage_since(&before, quiet);
        run.redis = per_request(&stats, &command_stats(&mut redis).await?, args.requests);
        let (sum, count) = api.lua_seconds().await?;
        let lua_ms = 1000.0 * (sum - lua_before.0) / (count - lua_before.1).max(1.0);
        run.note = format!("{}, lua rtt {lua_ms:.2} ms", run.note);
        print_run(round + 1, &run);
        runs.push(run);
        drain_outbox(&mut redis, ns, api, args.buckets, &channel).await?;
    }
    report(args, &runs);
    Ok(())
}

fn print_run(round: usize, run: &Run) {
    eprintln!(
        "  round {round} {:<22} {:>9.0} rps  p50 {:>6.2} ms  p99 {:>6.2} ms  {}\n    cpu: {}\n    redis: {}",
        run.label, run.rps, run.p50_ms, run.p99_ms, run.note, run.cpu, run.redis
    );
}

/// Calls and microseconds per command since Redis started, from `INFO commandstats`.
async fn command_stats(redis: &mut RedisConn) -> anyhow::Result<BTreeMap<String, (u64, u64)>> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(redis)
        .await?;
    let field = |fields: &str, name: &str| {
        fields
            .split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok(info
        .lines()
        .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
        .map(|(cmd, fields)| {
            (
                cmd.to_string(),
                (field(fields, "calls"), field(fields, "usec")),
            )
        })
        .collect())
}

/// "evalsha 1.00, ping 1.00, ...; 41 µs": commands per request between two snapshots (on the
/// shared server, others' traffic too: rates under 0.01 are left out) and Redis' time in
/// them per request.
fn per_request(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
    requests: u64,
) -> String {
    let n = requests.max(1) as f64;
    let mut usec = 0;
    let mut rates: Vec<(f64, &str)> = Vec::new();
    for (cmd, (calls, spent)) in after {
        let (calls_before, spent_before) = before.get(cmd).copied().unwrap_or((0, 0));
        usec += spent.saturating_sub(spent_before);
        let rate = calls.saturating_sub(calls_before) as f64 / n;
        if rate >= 0.01 && cmd != "info" {
            rates.push((rate, cmd));
        }
    }
    rates.sort_by(|a, b| b.0.total_cmp(&a.0));
    let shown: Vec<String> = rates.iter().map(|(r, c)| format!("{c} {r:.2}")).collect();
    format!("{}; {:.0} µs in Redis", shown.join(", "), usec as f64 / n)
}

fn report(args: &Args, runs: &[Run]) {
    println!(
        "\n## stock: EVALSHA purchase.lua vs. POST /api/seckill (concurrency {}, {} requests/run, {} buckets, client threads {}{}{})\n",
        args.concurrency,
        args.requests,
        args.buckets,
        args.client_threads,
        if args.no_relay { ", NO RELAY" } else { "" },
        args.api_env
            .iter()
            .map(|(k, v)| format!(", {k}={v}"))
            .collect::<String>()
    );
    println!(
        "| run | target | rps | p50 ms | p99 ms | notes | CPU cores used | Redis commands per request |"
    );
    println!("|---|---|---:|---:|---:|---|---|---|");
    for (i, run) in runs.iter().enumerate() {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            i / 2 + 1,
            run.label,
            run.rps,
            run.p50_ms,
            run.p99_ms,
            run.note,
            run.cpu,
            run.redis
        );
    }
    let ratios: Vec<f64> = runs.chunks(2).map(|p| p[1].rps / p[0].rps).collect();
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    let median = median(ratios.clone());
    println!(
        "\nendpoint/EVALSHA per round: {}; median {median:.2} ({:.0} %, goal ≥ 50 %: {})",
        shown.join(", "),
        median * 100.0,
        if median >= 0.5 { "met" } else { "NOT met" }
    );
    println!("load average now: {}", load_average());
}

/// Waits until seckill-api's relay moved every accepted purchase to RabbitMQ (so the next run
/// does not share the CPU with it), then empties the queue.
async fn drain_outbox(
    redis: &mut RedisConn,
    ns: &TestNamespace,
    api: &Service,
    buckets: i16,
    channel: &lapin::Channel,
) -> anyhow::Result<()> {
    let keys = ns.keys();
    if api.no_relay {
        for bucket in 0..buckets as u16 {
            let _: () = redis::cmd("DEL")
                .arg(keys.outbox(api.product, bucket))
                .query_async(redis)
                .await?;
        }
        return Ok(());
    }
    let started = Instant::now();
    loop {
        let mut pipe = redis::pipe();
        for bucket in 0..buckets as u16 {
            pipe.cmd("XLEN").arg(keys.outbox(api.product, bucket));
        }
        let lengths: Vec<u64> = pipe.query_async(redis).await?;
        if lengths.iter().sum::<u64>() == 0 {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "the relay did not drain the outbox in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let purged = channel
        .queue_purge(
            ns.topology().queue.as_str().into(),
            QueuePurgeOptions::default(),
        )
        .await?;
    eprintln!(
        "  relay drained the outbox in {:.1} s ({purged} messages purged)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The seckill-api release binary, running in the namespace.
struct Service {
    child: Child,
    pid: u32,
    port: u16,
    product: i64,
    http: reqwest::Client,
    /// Started with an unreachable broker: `/readyz` stays 503 and nothing is relayed.
    no_relay: bool,
}

impl Service {
    async fn start(
        ns: &TestNamespace,
        extra_env: &[(String, String)],
        no_relay: bool,
    ) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        // The service's log lines go to our stderr, keeping stdout for the report.
        let log = Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?);
        let mut command = Command::new(env!("CARGO_BIN_EXE_seckill-api"));
        command
            .env_remove("RUST_LOG")
            .env("SECKILL_HOST", "127.0.0.1")
            .env("SECKILL_API_PORT", port.to_string())
            .env("SECKILL_DATABASE_URL", &ns.database_url)
            .env("SECKILL_REDIS_URL", &ns.redis_url)
            .env(
                "SECKILL_AMQP_URL",
                if no_relay { DEAD_BROKER } else { &ns.amqp_url },
            )
            .env("SECKILL_NAMESPACE", &ns.namespace)
            .env("SECKILL_INTERNAL_KEY", INTERNAL_KEY)
            // The order signing key stays the public default the in-process services use.
            .env("SECKILL_ALLOW_DEV_SECRETS", "true")
            .env("SECKILL_LOG_FILTER", "warn")
            .envs(extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .kill_on_drop(true);
        let child = command.spawn().context("spawn seckill-api")?;
        let pid = child.id().context("seckill-api pid")?;
        let mut service = Self {
            child,
            pid,
            port,
            product: 0,
            http: reqwest::Client::new(),
            no_relay,
        };
        service.wait_ready().await?;
        Ok(service)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("seckill-api exited during start-up: {status}");
            }
            // Without a broker only the process itself can be ready.
            let probe = if self.no_relay { "/healthz" } else { "/readyz" };
            let ready = self.http.get(self.url(probe)).send().await;
            if ready.is_ok_and(|r| r.status() == reqwest::StatusCode::OK) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "seckill-api not ready after 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates the product the endpoint runs buy, with stock that never runs out.
    async fn create_product(&mut self, buckets: i16) -> anyhow::Result<()> {
        let now = chrono::Utc::now();
        let response = self
            .http
            .post(self.url("/admin/products"))
            .json(&serde_json::json!({
                "name": "bench",
                "price_cents": 99_900,
                "stock": 10_000_000,
                "buckets": buckets,
                "start_at": now - chrono::Duration::seconds(60),
                "end_at": now + chrono::Duration::hours(2),
            }))
            .send_as("seckill-api", 1, &["admin"])
            .await?;
        ensure!(
            response.status() == reqwest::StatusCode::CREATED,
            "create product: {}",
            response.status()
        );
        let body: serde_json::Value = response.json().await?;
        self.product = body["id"].as_i64().context("product id")?;
        Ok(())
    }

    /// `seckill_lua_seconds{script="purchase"}` sum and count, from `/metrics`.
    async fn lua_seconds(&self) -> anyhow::Result<(f64, f64)> {
        let text = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let value = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name) && l.contains("script=\"purchase\""))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok((
            value("seckill_lua_seconds_sum"),
            value("seckill_lua_seconds_count"),
        ))
    }

    async fn stop(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}

fn bucket_keys(keys: &seckill_store::RedisKeys, product: i64) -> [String; 4] {
    [
        keys.stock(product, 0),
        keys.buyers(product, 0),
        keys.outbox(product, 0),
        keys.results(product, 0),
    ]
}

/// `redis-benchmark` running `purchase.lua` on one hand-made bucket.
struct EvalSha {
    host: String,
    port: String,
    sha: String,
    keys: [String; 4],
    payload: String,
    http_request_id: String,
}

impl EvalSha {
    async fn prepare(ns: &TestNamespace, redis: &mut RedisConn) -> anyhow::Result<Self> {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(seckill_store::ledger::PURCHASE_LUA)
            .query_async(redis)
            .await?;
        let now = chrono::Utc::now();
        // The body the service would queue for a 12-digit user id (what `__rand_int__` makes).
        let payload = serde_json::to_string(&OrderMessage {
            request_id: uuid::Uuid::now_v7(),
            user_id: 100_000_000_000,
            product_id: FAKE_PRODUCT,
            price_cents: 99_900,
            created_at: now,
            bucket: None,
        })?;
        let address = ns.redis_url.trim_start_matches("redis://");
        let address = address.split('/').next().unwrap_or(address);
        let address = address.rsplit('@').next().unwrap_or(address);
        let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
        let evalsha = Self {
            host: host.to_string(),
            port: port.to_string(),
            sha,
            keys: bucket_keys(&ns.keys(), FAKE_PRODUCT),
            payload,
            http_request_id: uuid::Uuid::new_v4().to_string(),
        };
        let now_ms = now.timestamp_millis();
        let _: () = redis::cmd("HSET")
            .arg(&evalsha.keys[0])
            .arg("remaining")
            .arg(100_000_000)
            .arg("start_ms")
            .arg(now_ms - 60_000)
            .arg("end_ms")
            .arg(now_ms + 7_200_000)
            .arg("expire_at")
            .arg(now_ms + 10_800_000)
            .query_async(redis)
            .await?;
        Ok(evalsha)
    }

    async fn remaining(&self, redis: &mut RedisConn) -> redis::RedisResult<i64> {
        redis::cmd("HGET")
            .arg(&self.keys[0])
            .arg("remaining")
            .query_async(redis)
            .await
    }

    /// One redis-benchmark run; returns it and how many units the bucket lost.
    async fn run(&self, args: &Args, redis: &mut RedisConn) -> anyhow::Result<(Run, i64)> {
        // A fresh buyers hash and outbox per run: the same work as the first run.
        for key in &self.keys[1..] {
            let _: () = redis::cmd("DEL").arg(key).query_async(redis).await?;
        }
        let before = self.remaining(redis).await?;
        let output = Command::new("redis-benchmark")
            .args(["-h", &self.host, "-p", &self.port])
            .args(["-c", &args.concurrency.to_string()])
            .args(["-n", &args.requests.to_string()])
            .args(["-r", "1000000000", "--csv", "EVALSHA", &self.sha, "4"])
            .args(&self.keys)
            .args(["__rand_int__", &uuid::Uuid::new_v4().to_string()])
            .args([&self.payload, &self.http_request_id, "15000"])
            .stdin(Stdio::null())
            .output()
            .await
            .context("run redis-benchmark (apt-get install redis-tools)")?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        ensure!(
            output.status.success() && !stdout.contains("Error"),
            "redis-benchmark failed: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let deducted = before - self.remaining(redis).await?;
        let row = stdout
            .lines()
            .rfind(|l| l.starts_with("\"EVALSHA"))
            .context("no EVALSHA row in redis-benchmark's CSV")?;
        // The test name is not escaped (the payload holds quotes): read fields from the right.
        let fields: Vec<f64> = row
            .rsplitn(8, ',')
            .take(7)
            .map(|f| f.trim_matches('"').parse::<f64>())
            .collect::<Result<_, _>>()
            .with_context(|| format!("unreadable CSV row {row}"))?;
        // Reversed: max, p99, p95, p50, min, avg, rps.
        ensure!(
            deducted as f64 >= 0.99 * args.requests as f64,
            "EVALSHA deducted {deducted} units for {} calls: not the accept path",
            args.requests
        );
        let run = Run {
            label: "redis EVALSHA",
            rps: fields[6],
            p50_ms: fields[3],
            p99_ms: fields[1],
            note: String::new(),
            cpu: String::new(),
            redis: String::new(),
        };
        Ok((run, deducted))
    }
}

/// The HTTP load generator: one keep-alive connection per worker, like redis-benchmark's
/// clients, identity headers signed at send time.
struct Endpoint {
    address: SocketAddr,
    path: String,
    concurrency: usize,
    signer: IdentitySigner,
}

/// What one worker saw.
struct Tally {
    statuses: BTreeMap<String, u64>,
    latency_us: Histogram<u64>,
}

impl Endpoint {
    fn new(args: &Args, api: &Service) -> Self {
        Self {
            address: SocketAddr::from(([127, 0, 0, 1], api.port)),
            path: format!("/api/seckill/{}", api.product),
            concurrency: args.concurrency,
            signer: IdentitySigner::new(INTERNAL_KEY, "seckill-api"),
        }
    }

    /// `requests` purchases by users `first_user..`, `concurrency` at a time.
    async fn burst(&self, first_user: i64, requests: u64) -> anyhow::Result<Run> {
        let next = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let workers: Vec<_> = (0..self.concurrency)
            .map(|_| {
                let worker = Worker {
                    address: self.address,
                    path: self.path.clone(),
                    signer: self.signer.clone(),
                    next: next.clone(),
                    requests,
                    first_user,
                };
                tokio::spawn(worker.run())
            })
            .collect();
        let mut total = Tally::new()?;
        for worker in workers {
            let tally = worker.await??;
            total.latency_us.add(&tally.latency_us)?;
            for (status, count) in tally.statuses {
                *total.statuses.entry(status).or_default() += count;
            }
        }
        let wall = started.elapsed().as_secs_f64();
        let statuses: Vec<String> = total
            .statuses
            .iter()
            .map(|(s, n)| format!("{s}: {n}"))
            .collect();
        Ok(Run {
            label: "POST /api/seckill",
            rps: requests as f64 / wall,
            p50_ms: total.latency_us.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms: total.latency_us.value_at_quantile(0.99) as f64 / 1000.0,
            note: statuses.join(" "),
            cpu: String::new(),
            redis: String::new(),
        })
    }
}

struct Worker {
    address: SocketAddr,
    path: String,
    signer: IdentitySigner,
    next: Arc<AtomicU64>,
    requests: u64,
    first_user: i64,
}

impl Tally {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            statuses: BTreeMap::new(),
            latency_us: Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)?,
        })
    }
}

impl Worker {
    async fn run(self) -> anyhow::Result<Tally> {
        let mut tally = Tally::new()?;
        let mut sender = None;
        loop {
            let index = self.next.fetch_add(1, Ordering::Relaxed);
            if index >= self.requests {
                return Ok(tally);
            }
            if sender.is_none() {
                sender = Some(connect(self.address).await?);
            }
            let Some(connection) = sender.as_mut() else {
                continue;
            };
            let user_id = self.first_user + index as i64;
            let started = Instant::now();
            match self.purchase(connection, user_id).await {
                Ok(status) => {
                    let micros = started.elapsed().as_micros() as u64;
                    tally.latency_us.saturating_record(micros.max(1));
                    *tally.statuses.entry(status).or_default() += 1;
                }
                Err(_) => {
                    // The connection is gone: count it and open another.
                    *tally.statuses.entry("transport error".into()).or_default() += 1;
                    sender = None;
                }
            }
        }
    }

    async fn purchase(
        &self,
        sender: &mut SendRequest<Empty<Bytes>>,
        user_id: i64,
    ) -> anyhow::Result<String> {
        let request_id = uuid::Uuid::new_v4().to_string();
        let mut request = hyper::Request::post(self.path.as_str())
            .header(hyper::header::HOST, "127.0.0.1")
            .header("x-request-id", &request_id)
            .body(Empty::<Bytes>::new())?;
        let facts = RequestFacts {
            method: "POST",
            target: &self.path,
            request_id: &request_id,
            body: b"",
        };
        self.signer
            .sign_into(request.headers_mut(), user_id, &[], &facts);
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16().to_string();
        response.into_body().collect().await?;
        Ok(status)
    }
}

async fn connect(address: SocketAddr) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}
