//! `seckill-loadtest`: puts a product on sale, sends a burst of distinct buyers through the
//! gateway, waits for the system to go quiet, then checks the flash-sale invariants against
//! Postgres and Redis.
//!
//! Exit code: 0 PASS, 1 FAIL (an invariant is violated), 2 setup or infrastructure error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use seckill_auth::TokenMinter;

use seckill_loadtest::check::{self, Facts};
use seckill_loadtest::report::Report;
use seckill_loadtest::stores::Probe;
use seckill_loadtest::{bots, burst, draw, pollers, product, room};

/// Validity of the buyers' tokens: comfortably longer than any burst plus the wait for quiet.
const BUYER_TOKEN_TTL_SECS: i64 = 3600;

/// Command-line arguments; each has an environment fallback where one makes sense.
#[derive(Debug, Parser)]
#[command(name = "seckill-loadtest", version, about)]
struct Args {
    /// Gateway base URL.
    #[arg(
        long,
        env = "SECKILL_GATEWAY_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    gateway_url: String,
    /// Distinct buyers, each sending exactly one purchase.
    #[arg(long, env = "SECKILL_LOADTEST_USERS", default_value_t = 5000,
          value_parser = clap::value_parser!(u64).range(1..))]
    users: u64,
    /// Units put on sale (ignored with --product-id).
    #[arg(long, env = "SECKILL_LOADTEST_STOCK", default_value_t = 500,
          value_parser = clap::value_parser!(i32).range(0..))]
    stock: i32,
    /// Purchases in flight at once.
    #[arg(long, env = "SECKILL_LOADTEST_CONCURRENCY", default_value_t = 256,
          value_parser = clap::value_parser!(u64).range(1..=65_536))]
    concurrency: u64,
    /// Price of the created product.
    #[arg(long, env = "SECKILL_LOADTEST_PRICE_CENTS", default_value_t = 999,
          value_parser = clap::value_parser!(i64).range(0..))]
    price_cents: i64,
    /// HS256 secret the gateway verifies tokens with.
    #[arg(long, env = "SECKILL_JWT_SECRET", hide_env_values = true,
          default_value = seckill_config::DEV_JWT_SECRET)]
    jwt_secret: String,
    /// `iss` of the minted tokens, for a gateway that checks it (the first of a comma-separated list).
    #[arg(long, env = "SECKILL_GATEWAY_JWT_ISSUER", default_value = "")]
    jwt_issuer: String,
    /// `aud` of the minted tokens, for a gateway that checks it (the first of a comma-separated list).
    #[arg(long, env = "SECKILL_GATEWAY_JWT_AUDIENCE", default_value = "")]
    jwt_audience: String,
    /// Postgres URL, for the invariant check.
    #[arg(
        long,
        env = "SECKILL_DATABASE_URL",
        hide_env_values = true,
        default_value = "postgres://postgres:postgres@127.0.0.1:5432/seckill"
    )]
    database_url: String,
    /// Redis URL, for the invariant check (a comma-separated list: a Redis Cluster's seeds).
    #[arg(
        long,
        env = "SECKILL_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    redis_url: String,
    /// Namespace of the Redis keys under test.
    #[arg(long, env = "SECKILL_NAMESPACE", default_value = "seckill")]
    namespace: String,
    /// Write a JSON report here.
    #[arg(long, env = "SECKILL_LOADTEST_REPORT")]
    report: Option<PathBuf>,
    /// Longest wait for orders to appear and the outbox to drain (the old name
    /// `--settle-timeout-secs` still works).
    #[arg(
        long,
        alias = "settle-timeout-secs",
        env = "SECKILL_LOADTEST_QUIET_TIMEOUT_SECS",
        default_value_t = 120
    )]
    quiet_timeout_secs: u64,
    /// User id of the first buyer; buyers are first..first+users-1.
    #[arg(long, env = "SECKILL_LOADTEST_FIRST_USER_ID", default_value_t = 1,
          value_parser = clap::value_parser!(i64).range(1..))]
    first_user_id: i64,
    /// Sell an existing product instead of creating one (its stock comes from the database;
    /// the checks assume it had no orders before this burst).
    #[arg(long, env = "SECKILL_LOADTEST_PRODUCT_ID")]
    product_id: Option<i64>,
    /// Put the sale behind a waiting room in this mode (`fifo` or `raffle`): the buyers join
    /// within `--join-window-ms` before it starts, poll at the gateway's pace and buy when
    /// admitted, and the room's promises are checked too (see `seckill_loadtest::room`; a
    /// raffle's draw is audited from what it published, `seckill_loadtest::draw`).
    #[arg(long, env = "SECKILL_LOADTEST_WAITING_ROOM", value_parser = ["fifo", "raffle"])]
    waiting_room: Option<String>,
    /// With `--waiting-room`: the window the joins are spread over; the sale starts a
    /// second after it.
    #[arg(long, env = "SECKILL_LOADTEST_JOIN_WINDOW_MS", default_value_t = 2000)]
    join_window_ms: u64,
    /// With `--waiting-room`: this many bot accounts besides the buyers, each arriving at a
    /// random moment of the join window, then joining and trying to buy `--bot-rate` times
    /// a second (see `seckill_loadtest::bots`).
    #[arg(long, env = "SECKILL_LOADTEST_BOTS", default_value_t = 0)]
    bots: u64,
    /// With `--bots`: joins, and purchase attempts, a second per bot.
    #[arg(long, env = "SECKILL_LOADTEST_BOT_RATE", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    bot_rate: u32,
    /// With `--waiting-room`: no sale; this many buyers join a room whose sale starts in an
    /// hour and poll at the gateway's pace for `--poll-for-secs`, and the cost of their polls
    /// is reported (see `seckill_loadtest::pollers`).
    #[arg(long, env = "SECKILL_LOADTEST_POLLERS", requires = "waiting_room",
          value_parser = clap::value_parser!(u64).range(1..=4_000_000_000))]
    pollers: Option<u64>,
    /// With `--pollers`: how long they poll.
    #[arg(long, env = "SECKILL_LOADTEST_POLL_FOR_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    poll_for_secs: u64,
    /// With `--pollers`: the gateway's process id, to sample its resident memory and CPU.
    #[arg(long, env = "SECKILL_LOADTEST_GATEWAY_PID")]
    gateway_pid: Option<u32>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(error) => {
            eprintln!("seckill-loadtest: {error:#}");
            ExitCode::from(2)
        }
    }
}

/// One full run; `Ok(pass)` once the verdict is known, `Err` when it could not be reached.
async fn run(args: Args) -> anyhow::Result<bool> {
    let concurrency = usize::try_from(args.concurrency).context("--concurrency too large")?;
    // Both stores first: a dead dependency should stop the run before any traffic.
    let probe = Probe::connect(&args.database_url, &args.redis_url, &args.namespace).await?;
    let client = burst::client(concurrency)?;
    let minter = TokenMinter::new(&args.jwt_secret)
        .issuer(&args.jwt_issuer)
        .audience(&args.jwt_audience);

    if let (Some(mode), Some(pollers)) = (&args.waiting_room, args.pollers) {
        let options = pollers::Options {
            gateway_url: args.gateway_url.clone(),
            mode: mode.clone(),
            stock: args.stock,
            price_cents: args.price_cents,
            pollers,
            first_user_id: args.first_user_id,
            connections: concurrency,
            poll_for: Duration::from_secs(args.poll_for_secs),
            gateway_pid: args.gateway_pid,
            redis_url: args.redis_url.clone(),
            token_ttl_secs: BUYER_TOKEN_TTL_SECS,
            report: args.report.clone(),
        };
        return pollers::scenario(&client, &minter, &options).await;
    }
    if let Some(mode) = &args.waiting_room {
        return queued_sale(&args, mode, &probe, &client, &minter, concurrency).await;
    }
    let product_id = match args.product_id {
        Some(id) => {
            let total = probe
                .stock_total(id)
                .await?
                .with_context(|| format!("product {id} does not exist"))?;
            eprintln!("using product {id} (stock_total {total})");
            id
        }
        None => {
            let id = product::create(
                &client,
                &args.gateway_url,
                &minter,
                args.stock,
                args.price_cents,
            )
            .await?;
            eprintln!("created product {id} with stock {}", args.stock);
            id
        }
    };

    // Minting is CPU work that must not count against the burst's latency or throughput.
    let buyers = burst::mint_buyers(
        &minter,
        args.first_user_id,
        args.users,
        BUYER_TOKEN_TTL_SECS,
    );
    eprintln!(
        "minted {} buyer tokens; bursting with concurrency {concurrency}",
        buyers.len()
    );
    let outcome = burst::run(&client, &args.gateway_url, product_id, &buyers, concurrency).await?;

    let quiet_timeout = Duration::from_secs(args.quiet_timeout_secs);
    let waited = probe
        .wait_until_quiet(product_id, outcome.accepted, quiet_timeout)
        .await?;
    let observed = probe.observe(product_id, &outcome.request_ids).await?;

    let facts = Facts {
        accepted: outcome.accepted as i64,
        distinct_users: outcome.distinct_users as i64,
        every_buyer_answered: check::every_buyer_answered(&outcome.status_counts),
        orders_in_db: observed.orders_in_db,
        distinct_buyers: observed.distinct_buyers,
        stock_total: observed.stock_total,
        redis_remaining: observed.redis_remaining,
        // A 202 without a readable request id cannot be traced to an order: count it missing.
        missing_orders: observed.missing_orders + outcome.unreadable_accepts as i64,
        indefinite: check::indefinite_answers(&outcome.status_counts) as i64,
    };
    let failures = facts.failures();
    let report = Report::new(&outcome, &facts);
    println!("{}", report.human(waited.elapsed, waited.quiet, &failures));
    if let Some(path) = &args.report {
        report.write_json(path)?;
    }
    Ok(failures.is_empty())
}

/// The `--waiting-room` run: a queued sale, a crowd through its room, the room's checks and
/// the usual invariants.
async fn queued_sale(
    args: &Args,
    mode: &str,
    probe: &Probe,
    client: &reqwest::Client,
    minter: &TokenMinter,
    concurrency: usize,
) -> anyhow::Result<bool> {
    anyhow::ensure!(
        args.product_id.is_none(),
        "--waiting-room creates its own product"
    );
    let window = Duration::from_millis(args.join_window_ms);
    let start_in = chrono::Duration::from_std(window + Duration::from_secs(1))
        .context("--join-window-ms too large")?;
    let product_id = product::create_queued(
        client,
        &args.gateway_url,
        minter,
        args.stock,
        args.price_cents,
        start_in,
        mode,
    )
    .await?;
    let buyers = burst::mint_buyers(minter, args.first_user_id, args.users, BUYER_TOKEN_TTL_SECS);
    eprintln!(
        "product {product_id} ({} units, room {mode}): {} buyers join within {} ms, \
         at most {concurrency} requests in flight",
        args.stock,
        buyers.len(),
        window.as_millis()
    );
    let base = args.gateway_url.trim_end_matches('/').to_string();
    let auditor = buyers
        .first()
        .map(|b| b.authorization.clone())
        .unwrap_or_default();
    // A raffle's commitment, read before anyone joins.
    let commitment = match mode {
        "raffle" => Some(
            draw::fetch(client, &base, product_id, &auditor)
                .await?
                .commitment,
        ),
        _ => None,
    };
    let bot_accounts = burst::mint_buyers(
        minter,
        args.first_user_id + i64::try_from(args.users).context("--users too large")?,
        args.bots,
        BUYER_TOKEN_TTL_SECS,
    );
    let (done, until_done) = tokio::sync::watch::channel(false);
    let bot_run = tokio::spawn({
        let (client, base) = (client.clone(), base.clone());
        let (window, rate) = (window, args.bot_rate);
        async move {
            bots::run(
                &client,
                &base,
                product_id,
                bot_accounts,
                window,
                rate,
                until_done,
            )
            .await
        }
    });
    let crowd = room::run(
        client,
        &args.gateway_url,
        product_id,
        buyers,
        window,
        concurrency,
    )
    .await;
    let _ = done.send(true);
    let bot_run = bot_run.await.context("the bots' task")?;
    let mut crowd = crowd?;
    crowd.add(bot_run.trips.clone());
    let audit = match &commitment {
        Some(commitment) => {
            let published = draw::fetch(client, &base, product_id, &auditor).await?;
            match draw::Audit::new(commitment, &published) {
                Ok(audit) => Some(Ok(audit)),
                Err(problem) => Some(Err(problem)),
            }
        }
        None => None,
    };
    let drawn = audit.as_ref().and_then(|a| a.as_ref().ok());
    let verdict = crowd.verdict(usize::try_from(args.stock).unwrap_or(0), drawn);
    let accepted = crowd.accepted_ids();
    let waited = probe
        .wait_until_quiet(
            product_id,
            accepted.len() as u64,
            Duration::from_secs(args.quiet_timeout_secs),
        )
        .await?;
    let observed = probe.observe(product_id, &accepted).await?;
    let facts = Facts {
        accepted: accepted.len() as i64,
        distinct_users: (args.users + args.bots) as i64,
        every_buyer_answered: verdict.failed == 0,
        orders_in_db: observed.orders_in_db,
        distinct_buyers: observed.distinct_buyers,
        stock_total: observed.stock_total,
        redis_remaining: observed.redis_remaining,
        missing_orders: observed.missing_orders,
        indefinite: 0,
    };
    let mut problems: Vec<String> = facts
        .failures()
        .iter()
        .map(|f| format!("{}: {}", f.name, f.detail))
        .collect();
    problems.extend(verdict.problems(usize::try_from(args.stock).unwrap_or(0)));
    if args.bots > 0 {
        problems.extend(bot_run.problems(
            (args.users + args.bots) as usize,
            usize::try_from(args.stock).unwrap_or(0),
        ));
    }
    if let Some(Err(problem)) = &audit {
        problems.push(format!("the draw: {problem}"));
    }
    let latencies: Vec<Duration> = crowd.trips.iter().filter_map(|t| t.join_latency).collect();
    println!("waiting room ({mode}), product {product_id}");
    println!(
        "  joins sent over {} ms; p99 join {:.1} ms; wall {:.1} s",
        crowd.join_spread.as_millis(),
        percentile(&latencies, 0.99).as_secs_f64() * 1000.0,
        crowd.wall.as_secs_f64()
    );
    println!("  ends: {:?}", verdict.told);
    if let Some(audit) = drawn {
        println!(
            "  draw: seed matches the commitment read before the start; {} entries, ticket \
             list matches every buyer's place: {}",
            audit.ranks.len(),
            verdict.misfiled.is_empty()
        );
    }
    println!(
        "  winners in the first {} {}: {} of {}",
        args.stock,
        if drawn.is_some() {
            "ranks of the draw"
        } else {
            "places"
        },
        verdict.accepted - verdict.out_of_order.len(),
        verdict.accepted
    );
    if let Some(share) = verdict.in_send_order {
        println!(
            "  winners among the first 110 % by send time: {:.1} %",
            share * 100.0
        );
    }
    println!(
        "  polls sent over 1 s after the sell-out not told sold_out: {}",
        verdict.late_polls
    );
    if args.bots > 0 {
        println!(
            "  bots: {} sent {} requests in {:.1} s ({:.0}/s): {:?}",
            args.bots,
            bot_run.requests(),
            bot_run.wall.as_secs_f64(),
            bot_run.requests() as f64 / bot_run.wall.as_secs_f64().max(0.001),
            bot_run.sent
        );
        println!(
            "  bots won {} of {} units (their share of the buyers: {:.2}; allowed with noise: \
             {}); purchases without a pass accepted: {}",
            bot_run.winners(),
            args.stock,
            args.stock as f64 * args.bots as f64 / (args.users + args.bots) as f64,
            bots::BotRun::allowed(
                args.bots as usize,
                (args.users + args.bots) as usize,
                usize::try_from(args.stock).unwrap_or(0)
            ),
            bot_run.accepted_without_pass
        );
    }
    println!(
        "  orders {} (distinct buyers {}), stock {}, quiet after {:.1} s",
        observed.orders_in_db,
        observed.distinct_buyers,
        observed.stock_total,
        waited.elapsed.as_secs_f64()
    );
    for problem in &problems {
        println!("  FAIL {problem}");
    }
    println!(
        "VERDICT: {}",
        if problems.is_empty() { "PASS" } else { "FAIL" }
    );
    Ok(problems.is_empty())
}

/// The `q` quantile of `values` (zero when empty).
fn percentile(values: &[Duration], q: f64) -> Duration {
    let mut sorted = values.to_vec();
    sorted.sort();
    let at = ((sorted.len() as f64 * q).ceil() as usize).saturating_sub(1);
    sorted.get(at).copied().unwrap_or_default()
}
