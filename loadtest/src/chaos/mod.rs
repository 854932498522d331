//! The fault matrix: for each scenario, a sale on the run's own stores and freshly started
//! services, a burst of buyers through the gateway with a fault injected while purchases are
//! in flight, a wait until everything in flight has landed, a second wave of patient buyers
//! (selling must have resumed, and no unit may be left behind a `sold_out`), and the
//! invariants judged from every answer and straight from the stores.
//!
//! Layout:
//! - [`stack`]: the private stores and the service processes.
//! - [`scenario`]: the rows of the matrix and their faults.
//! - [`drive`]: the buyers: paced purchases, every answer kept per buyer.
//! - [`settle`]: buyers paying, cancelling or leaving their orders to expire.
//! - [`forge`]: the forger with broker access, and the operator tidying the parking lot.
//! - [`books`]: the quiet wait and the ledger, read from the stores.
//! - [`verdict`]: the invariants, as pure functions.

pub mod books;
pub mod drive;
pub mod forge;
pub mod scenario;
pub mod settle;
pub mod stack;
pub mod verdict;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;

use seckill_auth::TokenMinter;
use seckill_testkit::{AmqpProxy, LatencyProxy, OwnBrokerCluster};

use crate::burst;
use crate::product;

use self::books::Books;
use self::drive::Wave;
use self::scenario::{Sale, Scenario};
use self::settle::Policy;
use self::stack::{Role, Services, Stores, Wiring};
use self::verdict::{Figures, Violation};

/// Validity of the buyers' tokens: longer than any scenario.
const TOKEN_TTL_SECS: i64 = 3600;
/// Price of the product on sale.
const PRICE_CENTS: i64 = 999;
/// Units of the second product of `redis-restart-empty`, and its buyers' first user id.
const BYSTANDER_STOCK: i32 = 1000;
const BYSTANDER_FIRST_USER: i64 = 7_000_000;
/// After Redis came back empty, a product with nothing in flight must sell again this soon.
const RESUME_WITHIN: Duration = Duration::from_secs(5);

/// A duration for a scenario's line: seconds with one decimal, or "never".
fn seconds(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// How every scenario's sale is shaped.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where the release binaries are.
    pub bin_dir: PathBuf,
    /// Where each scenario's service logs go (`<log_dir>/<round>-<scenario>/`).
    pub log_dir: PathBuf,
    /// Units on sale.
    pub stock: i32,
    /// Buyers in the burst the fault hits.
    pub users: u64,
    /// Purchases started per second in the burst.
    pub rate_per_sec: u32,
    /// Purchases in flight at most.
    pub concurrency: usize,
    /// Longest wait for the system to go quiet after each wave.
    pub quiet_timeout: Duration,
    /// Extra settings for every service, after the scenario's own.
    pub service_env: Vec<(String, String)>,
}

/// How one scenario ended.
#[derive(Debug)]
pub struct Outcome {
    /// The row.
    pub scenario: Scenario,
    /// Its figures.
    pub figures: Figures,
    /// What broke; empty is a pass.
    pub violations: Vec<Violation>,
    /// `503 ledger_rebuilding` answers seen.
    pub paused: u64,
    /// The burst's answers by status (`error`: none came).
    pub burst_answers: std::collections::BTreeMap<String, u64>,
    /// Wall time of the scenario.
    pub elapsed: Duration,
    /// What the scenario's buyers and operator did beyond buying, for its line.
    pub notes: Vec<String>,
}

impl Outcome {
    /// The scenario's line: verdict, name, figures, and what broke.
    pub fn line(&self) -> String {
        let f = &self.figures;
        let verdict = if self.violations.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        let mut line = format!(
            "{verdict} {:<20} 202s {:>4}  orders {:>4}  failed {:>3}  parked {:>3}  \
             remaining {:>4}  drift {:>3}  unknown {:>4}  paused {:>4}  ({:.1} s)",
            self.scenario.name(),
            f.accepted,
            f.orders,
            f.failed,
            f.parked,
            f.redis_remaining,
            f.drift,
            f.unknown,
            self.paused,
            self.elapsed.as_secs_f64()
        );
        let answers: Vec<String> = self
            .burst_answers
            .iter()
            .map(|(status, n)| format!("{status}:{n}"))
            .collect();
        line.push_str(&format!("\n     burst answers {}", answers.join(" ")));
        for note in &self.notes {
            line.push_str(&format!("\n     {note}"));
        }
        for v in &self.violations {
            line.push_str(&format!("\n     {}: {}", v.name, v.detail));
        }
        line
    }
}

/// Runs one scenario as the `index`th of the run (its namespace and database carry it).
pub async fn run_scenario(
    stores: &mut Stores,
    settings: &Settings,
    index: usize,
    scenario: Scenario,
) -> anyhow::Result<Outcome> {
    let started = Instant::now();
    let namespace = format!("chaos{index}");
    let database_url = stores.postgres.url(&format!("seckill_chaos{index}"));
    let direct_redis = stores.redis.url();
    let proxy = if scenario.needs_proxy() {
        let server = SocketAddr::from((Ipv4Addr::LOCALHOST, stores.redis.port()));
        Some(
            LatencyProxy::start(server)
                .await
                .context("start the Redis latency proxy")?,
        )
    } else {
        None
    };
    let cluster = if scenario.needs_broker_cluster() {
        Some(OwnBrokerCluster::start(3).await)
    } else {
        None
    };
    let broker = cluster.as_ref().map_or(&stores.broker, |c| c.node(0));
    // In front of the broker for seckill-api only (its publishing workers, relay and fence
    // all connect to SECKILL_AMQP_URL); only the publishing workers' connection is tampered
    // with, order-service connects straight.
    let amqp_proxy = if scenario.needs_amqp_proxy() {
        Some(
            AmqpProxy::start(
                &broker.amqp_url(),
                scenario::PUBLISHER_CONNECTION,
                scenario::CONFIRM_SILENCE,
            )
            .await
            .context("start the AMQP proxy")?,
        )
    } else {
        None
    };
    let wiring = Wiring {
        database_url: database_url.clone(),
        redis_url: proxy
            .as_ref()
            .map_or(direct_redis.clone(), |p| format!("redis://{}", p.addr())),
        amqp_url: broker.amqp_url(),
        management_url: broker
            .management_url()
            .context("the broker has no management API")?,
        namespace: namespace.clone(),
        jwt_secret: format!("chaos-jwt-{}", uuid::Uuid::new_v4().simple()),
        internal_key: format!("chaos-internal-{}", uuid::Uuid::new_v4().simple()),
        order_signing_key: format!("chaos-orders-{}", uuid::Uuid::new_v4().simple()),
        api_extra: amqp_proxy
            .iter()
            .map(|p| ("SECKILL_AMQP_URL".to_string(), p.amqp_url().to_string()))
            .collect(),
        extra: scenario
            .service_env()
            .into_iter()
            .chain(settings.service_env.iter().cloned())
            .collect(),
    };
    let log_dir = settings
        .log_dir
        .join(format!("{index:02}-{}", scenario.name()));
    let mut services = Services::start(&settings.bin_dir, &log_dir, scenario.shape(), &wiring)
        .await
        .with_context(|| format!("{}: starting the services", scenario.name()))?;
    let gateways = services.gateway_urls();
    let client = burst::client(settings.concurrency)?;
    let minter = TokenMinter::new(&wiring.jwt_secret);
    let product_id =
        product::create(&client, &gateways[0], &minter, settings.stock, PRICE_CENTS).await?;
    let books = Books::connect(
        &database_url,
        &direct_redis,
        &namespace,
        &wiring.management_url,
    )
    .await?
    .awaiting_expiry(scenario.payment_window().is_some());
    let doomed_node = match &cluster {
        // The order queue's leader on a node the services are not connected to: losing it
        // makes the queue elect a new leader under their feet.
        Some(cluster) => {
            let queue = seckill_messaging::Topology::new(&namespace).queue;
            let leader = cluster.move_leader_off_first_node(&queue).await;
            eprintln!("seckill-chaos: {queue} is led by node {leader}, which will be killed");
            leader
        }
        None => 0,
    };

    // The burst the fault hits. It lands once a quarter of the stock is sold, so there are
    // purchases in flight and units left on both sides of it.
    let burst_buyers = burst::mint_buyers(&minter, 10_000, settings.users, TOKEN_TTL_SECS);
    let later_first = 10_000 + settings.users as i64;
    let later_count = u64::try_from(settings.stock.max(1)).unwrap_or(1);
    let sale = Sale {
        wiring: &wiring,
        product_id,
        later_users: (later_first..later_first + later_count as i64).collect(),
        books: &books,
        amqp_proxy: amqp_proxy.as_ref(),
    };
    let mut notes = Vec::new();
    let wave = Wave {
        gateway_urls: gateways.clone(),
        product_id,
        rate_per_sec: settings.rate_per_sec,
        concurrency: settings.concurrency,
        patience: None,
        accepted_to: None,
    };
    // Buyers who settle their orders do so while the wave and the fault go on.
    let settling = |policy: Policy| {
        let (to, from) = tokio::sync::mpsc::unbounded_channel();
        let settler = settle::run(
            &client,
            &gateways[0],
            product_id,
            policy,
            from,
            settings.quiet_timeout,
        );
        (scenario.settles().then_some(to), settler)
    };
    let (burst_to, burst_settler) = settling(Policy::Mixed);
    let burst_wave = Wave {
        accepted_to: burst_to,
        ..wave.clone()
    };
    // With Redis wiped, a second product whose ledger is lost too but of which nothing is in
    // flight: how long it stays paused tells the fence's own delay apart from the wait for
    // the burst's purchases.
    let bystander = if scenario == Scenario::RedisWiped {
        let id =
            product::create(&client, &gateways[0], &minter, BYSTANDER_STOCK, PRICE_CENTS).await?;
        let loader = burst::mint_buyers(&minter, BYSTANDER_FIRST_USER, 1, TOKEN_TTL_SECS);
        // One purchase loads its ledger, so the wipe loses it.
        let (loaded, _) = drive::time_to_resume(
            &client,
            &gateways[0],
            id,
            &loader,
            Duration::ZERO,
            Duration::from_secs(30),
        )
        .await;
        loaded.context("the second product's first purchase")?;
        Some(id)
    } else {
        None
    };
    let bystander_buyers = burst::mint_buyers(
        &minter,
        BYSTANDER_FIRST_USER + 1,
        if bystander.is_some() { 240 } else { 0 },
        TOKEN_TTL_SECS,
    );
    let (answered, accepted) = (AtomicU64::new(0), AtomicU64::new(0));
    let trigger = u64::try_from(settings.stock / 4).unwrap_or(0).max(1);
    let fault = async {
        while accepted.load(Ordering::Relaxed) < trigger
            && answered.load(Ordering::Relaxed) < settings.users
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let answered_before = answered.load(Ordering::Relaxed);
        let injected = scenario
            .inject(
                stores,
                &mut services,
                proxy.as_ref(),
                cluster.as_ref(),
                doomed_node,
                &sale,
            )
            .await?;
        // Redis answers again: from here, how long until the second product sells.
        let bystander_resumed = match bystander {
            Some(id) => Some(
                drive::time_to_resume(
                    &client,
                    &gateways[0],
                    id,
                    &bystander_buyers,
                    Duration::from_millis(250),
                    Duration::from_secs(60),
                )
                .await,
            ),
            None => None,
        };
        anyhow::Ok((answered_before, injected, bystander_resumed))
    };
    let burst = async {
        let tally = drive::run(&client, &burst_wave, &burst_buyers, &answered, &accepted).await;
        // The wave's end closes the settler's channel.
        drop(burst_wave);
        tally
    };
    let (first, fault, burst_settled) = tokio::join!(burst, fault, burst_settler);
    let (answered_at_fault, injected, bystander_resumed) =
        fault.with_context(|| format!("{}: injecting the fault", scenario.name()))?;
    if scenario.settles() {
        notes.push(format!("burst buyers settled: {burst_settled:?}"));
    }
    let accepted_ids = |tallies: &[&drive::Tally]| -> Vec<uuid::Uuid> {
        tallies
            .iter()
            .flat_map(|t| t.stories.iter().filter_map(|s| s.accepted))
            .collect()
    };
    let (mut quiet, mut motion, quiet_since) = books
        .quiet_since(product_id, &accepted_ids(&[&first]), settings.quiet_timeout)
        .await;
    if scenario.operated() {
        let tidied = forge::operate(&client, &gateways[0], &minter, product_id)
            .await
            .with_context(|| format!("{}: tidying the parking lot", scenario.name()))?;
        notes.push(format!("operator: {tidied:?}"));
        (quiet, motion) = books
            .wait_until_quiet(product_id, &accepted_ids(&[&first]), settings.quiet_timeout)
            .await;
    }

    // The buyers after the fault: patient, as many as the stock, so together they could
    // take every unit left.
    let later_buyers = burst::mint_buyers(
        &minter,
        10_000 + settings.users as i64,
        u64::try_from(settings.stock.max(1)).unwrap_or(1),
        TOKEN_TTL_SECS,
    );
    let (later_to, later_settler) = settling(Policy::PayAll);
    let patient = Wave {
        patience: Some(settings.quiet_timeout),
        accepted_to: later_to,
        ..wave
    };
    let later = async {
        let tally = drive::run(&client, &patient, &later_buyers, &answered, &accepted).await;
        drop(patient);
        tally
    };
    let (second, later_settled) = tokio::join!(later, later_settler);
    if scenario.settles() {
        notes.push(format!("later buyers settled: {later_settled:?}"));
    }
    let (quiet_after, motion_after) = books
        .wait_until_quiet(
            product_id,
            &accepted_ids(&[&first, &second]),
            settings.quiet_timeout,
        )
        .await;
    let ledger = books.ledger(product_id).await?;
    // Read before the stop: the count lives in the process.
    let broker_202s = if scenario == Scenario::ConfirmLost {
        let metrics = services.metrics(Role::Api, 0).await?;
        Some(verdict::accepted_in_broker(&metrics).context(
            "seckill-api's metrics have no seckill_accepted_total{durable_in=\"broker\"}",
        )?)
    } else {
        None
    };
    services.stop().await;

    let (figures, mut violations) = verdict::judge(&first.stories, &second.stories, &ledger);
    for (went_quiet, motion, wave) in [
        (quiet, motion, "burst"),
        (quiet_after, motion_after, "later buyers"),
    ] {
        if !went_quiet {
            violations.push(Violation {
                name: "not_quiet",
                detail: format!(
                    "after the {wave}: {} accepted purchases unrecorded, outbox {}, queued {}, \
                     compensations {}, orders in their payment window {} after {} s",
                    motion.unrecorded,
                    motion.outbox,
                    motion.queued,
                    motion.compensating,
                    motion.expiring,
                    settings.quiet_timeout.as_secs()
                ),
            });
        }
    }
    if scenario != Scenario::Baseline && answered_at_fault >= settings.users {
        violations.push(Violation {
            name: "fault_after_burst",
            detail: format!(
                "every buyer of the burst was answered before the fault (fewer than {trigger} 202s)"
            ),
        });
    }
    if let Some((resumed, paused)) = bystander_resumed {
        let after_quiet = second
            .first_accepted_at
            .zip(quiet_since)
            .map(|(first, quiet)| first.saturating_duration_since(quiet));
        notes.push(format!(
            "resumed: the burst's product {} after nothing of it was in flight; a second \
             product (nothing in flight) {} after Redis answered again ({paused} \
             ledger_rebuilding answers)",
            seconds(after_quiet),
            seconds(resumed),
        ));
        if resumed.is_none_or(|resumed| resumed > RESUME_WITHIN) {
            violations.push(Violation {
                name: "slow_resume",
                detail: format!(
                    "a product with nothing in flight sold again {} after Redis answered \
                     (at most {} s)",
                    seconds(resumed),
                    RESUME_WITHIN.as_secs()
                ),
            });
        }
    }
    let forged = &injected.forgeries.fresh;
    if scenario == Scenario::ForgedMessages {
        notes.push(format!(
            "forged {} under fresh ids, {} under genuine ones",
            forged.len(),
            injected.forgeries.under_genuine_ids
        ));
        let (ordered, parked) = books.forgeries(forged).await?;
        if ordered > 0 {
            violations.push(Violation {
                name: "forged_orders",
                detail: format!("{ordered} of {} forgeries became orders", forged.len()),
            });
        }
        if parked != forged.len() as i64 {
            violations.push(Violation {
                name: "forgery_not_parked",
                detail: format!("{parked} of {} forgeries in the parking lot", forged.len()),
            });
        }
    }
    let accepted_all = accepted_ids(&[&first, &second]);
    if let Some(at_kill) = &injected.in_flight {
        let answered = at_kill
            .iter()
            .filter(|id| accepted_all.contains(id))
            .count();
        notes.push(format!(
            "in the outbox at the kill: {} purchases ({answered} of them answered 202)",
            at_kill.len()
        ));
        violations.extend(verdict::judge_in_flight(at_kill, &accepted_all, &ledger));
    }
    if let (Some(proxy), Some(broker_202s)) = (&amqp_proxy, broker_202s) {
        let report = proxy.report();
        notes.push(format!(
            "confirms through the proxy: {} messages, {} purchases; swallowed: the confirm \
             of {} purchases; 202s durable_in=broker {broker_202s}; publisher connections \
             {}, severed {}",
            report.passed_messages,
            report.passed.len(),
            report.swallowed.as_ref().map_or(0, Vec::len),
            report.connections,
            report.severed
        ));
        violations.extend(verdict::judge_confirms(
            &accepted_all,
            &ledger,
            broker_202s,
            &report,
        ));
    }
    let paused = first.paused + second.paused;
    if scenario == Scenario::RedisWiped && paused == 0 {
        violations.push(Violation {
            name: "not_paused",
            detail: "nobody was told ledger_rebuilding after Redis lost the ledger".into(),
        });
    }
    Ok(Outcome {
        scenario,
        figures,
        violations,
        paused,
        burst_answers: first.status_counts,
        elapsed: started.elapsed(),
        notes,
    })
}
