//! `seckill-chaos`: the fault matrix. Starts its own Redis (append-only file), RabbitMQ node
//! and PostgreSQL on spare loopback ports, then for each scenario the three services, a
//! burst through the gateway with the scenario's fault injected mid-burst, and the
//! invariants checked from every answer and straight from the stores. One line per
//! scenario, then `N passed, N failed`.
//!
//! Exit code: 0 when every scenario passed, 1 when one broke an invariant, 2 when the run
//! could not be set up. `scripts/chaos.sh` builds the binaries and runs it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use seckill_loadtest::chaos::scenario::Scenario;
use seckill_loadtest::chaos::stack::Stores;
use seckill_loadtest::chaos::{self, Settings};

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(name = "seckill-chaos", version, about)]
struct Args {
    /// Scenarios to run, comma-separated (default: all). `--list` names them.
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Only the fast scenarios (those that do not wait out a 20-30 s outage): what CI runs.
    #[arg(long)]
    fast: bool,
    /// Print the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Run the chosen scenarios this many times over.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Units on sale in each scenario.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i32).range(4..))]
    stock: i32,
    /// Buyers in the burst the fault hits.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(1..))]
    users: u64,
    /// Purchases started per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..))]
    rate: u32,
    /// Purchases in flight at most.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=4096))]
    concurrency: u64,
    /// Longest wait for the system to go quiet after each wave, seconds (the old name
    /// `--settle-timeout-secs` still works).
    #[arg(long, alias = "settle-timeout-secs", default_value_t = 120)]
    quiet_timeout_secs: u64,
    /// A setting for every service of every scenario, `NAME=value` (repeatable): e.g.
    /// `SECKILL_AMQP_QUEUE_TYPE=classic`, or `SECKILL_API_PUBLISH_ON_ACCEPT=false` to see
    /// what a 202 that rests on Redis alone does when Redis loses its memory.
    #[arg(long = "service-env", value_name = "NAME=VALUE", value_parser = name_value)]
    service_env: Vec<(String, String)>,
    /// Where the release binaries are.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Where each scenario's service logs go.
    #[arg(long, default_value = "run/chaos")]
    log_dir: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    if args.list {
        for s in Scenario::ALL {
            println!("{}{}", s.name(), if s.fast() { "  (fast)" } else { "" });
        }
        return ExitCode::SUCCESS;
    }
    let scenarios = match chosen(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("seckill-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    let settings = Settings {
        bin_dir: args.bin_dir.clone(),
        log_dir: args.log_dir.clone(),
        stock: args.stock,
        users: args.users,
        rate_per_sec: args.rate,
        concurrency: args.concurrency as usize,
        quiet_timeout: Duration::from_secs(args.quiet_timeout_secs),
        service_env: args.service_env.clone(),
    };
    // Ctrl-C ends the run through the normal path, so the stores' drops stop them.
    tokio::select! {
        code = run(&settings, &scenarios, args.rounds) => code,
        _ = tokio::signal::ctrl_c() => {
            eprintln!("seckill-chaos: interrupted; stopping what it started");
            ExitCode::from(2)
        }
    }
}

fn name_value(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, value)) if name.starts_with("SECKILL_") => {
            Ok((name.to_string(), value.to_string()))
        }
        _ => Err(format!("'{arg}' is not SECKILL_NAME=value")),
    }
}

fn chosen(args: &Args) -> anyhow::Result<Vec<Scenario>> {
    if args.scenarios.is_empty() {
        return Ok(Scenario::ALL
            .into_iter()
            .filter(|s| !args.fast || s.fast())
            .collect());
    }
    args.scenarios
        .iter()
        .map(|name| {
            Scenario::named(name.trim())
                .ok_or_else(|| anyhow::anyhow!("unknown scenario '{name}' (see --list)"))
        })
        .collect()
}

async fn run(settings: &Settings, scenarios: &[Scenario], rounds: u32) -> ExitCode {
    eprintln!("seckill-chaos: starting its own Redis, RabbitMQ and PostgreSQL");
    let mut stores = Stores::start().await;
    let (mut passed, mut failed) = (0, 0);
    let mut index = 0;
    for round in 1..=rounds {
        if rounds > 1 {
            println!("round {round} of {rounds}");
        }
        for &scenario in scenarios {
            index += 1;
            eprintln!("seckill-chaos: {} ...", scenario.name());
            match chaos::run_scenario(&mut stores, settings, index, scenario).await {
                Ok(outcome) => {
                    println!("{}", outcome.line());
                    if outcome.violations.is_empty() {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
                Err(e) => {
                    println!("FAIL {:<20} could not run: {e:#}", scenario.name());
                    failed += 1;
                }
            }
        }
    }
    println!("chaos: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
