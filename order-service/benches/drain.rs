//! Drain rate of order-service vs. pgbench, side by side in one run.
//!
//! Pre-fills the order queue with N purchases, starts order-service and times how long it
//! takes until every one is an order (insert + stock decrement + buyer result + ack). Then
//! runs `pgbench` with single-row `INSERT … ON CONFLICT DO NOTHING` transactions on the same
//! server, with as many clients as order-service has database connections. Alternates the
//! two and prints each run and the median ratio. Run by `scripts/bench-orders.sh`.
//!
//! Options (after `--`): `--messages N` (20000), `--batch N` (64), `--prefetch N` (512),
//! `--db-pool N` (16, also pgbench's client count), `--pgbench-secs N` (10), `--rounds N` (2).

use std::time::{Duration, Instant};

use chrono::{Duration as ChronoDuration, Utc};

use seckill_messaging::{OrderMessage, OrderSigner};
use seckill_testkit::TestNamespace;

struct Options {
    messages: usize,
    batch: usize,
    prefetch: u16,
    db_pool: u32,
    pgbench_secs: u32,
    rounds: usize,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                v.parse()
                    .unwrap_or_else(|_| panic!("{name} takes a number"))
            })
            .unwrap_or(default)
    };
    Options {
        messages: value("--messages", 20_000) as usize,
        batch: value("--batch", 64) as usize,
        prefetch: value("--prefetch", 512) as u16,
        db_pool: value("--db-pool", 16) as u32,
        pgbench_secs: value("--pgbench-secs", 10) as u32,
        rounds: value("--rounds", 2) as usize,
    }
}

#[tokio::main]
async fn main() {
    let opts = options();
    let mut drains = Vec::new();
    let mut pgbenches = Vec::new();
    println!(
        "order-service drain vs pgbench: {} messages, batch {}, prefetch {}, {} db connections",
        opts.messages, opts.batch, opts.prefetch, opts.db_pool
    );
    for round in 1..=opts.rounds {
        let drain = drain_rate(&opts).await;
        println!("round {round}: order-service drain  {drain:>9.0} orders/s");
        let pg = pgbench_rate(&opts).await;
        println!("round {round}: pgbench single-row   {pg:>9.0} tx/s");
        drains.push(drain);
        pgbenches.push(pg);
    }
    let ratios: Vec<f64> = drains.iter().zip(&pgbenches).map(|(d, p)| d / p).collect();
    println!("ratios drain/pgbench per round: {ratios:.2?}");
    println!("median ratio: {:.2}", median(ratios));
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// Orders persisted per second from a pre-filled queue.
async fn drain_rate(opts: &Options) -> f64 {
    let ns = TestNamespace::new();
    let app = order_service::Application::build(order_service::Settings {
        backend: ns.backend_settings(),
        port: 0,
        prefetch: opts.prefetch,
        batch_size: opts.batch,
        db_pool_size: opts.db_pool,
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    let db = ns.db().await;
    let now = Utc::now();
    let product: i64 = sqlx::query_scalar(
        "INSERT INTO products (name, price_cents, stock_total, stock_remaining, start_at, end_at) \
         VALUES ('bench', 500, $1, $1, $2, $3) RETURNING id",
    )
    .bind(opts.messages as i32)
    .bind(now - ChronoDuration::minutes(1))
    .bind(now + ChronoDuration::hours(1))
    .fetch_one(&db)
    .await
    .expect("product");
    let (connection, channel) = ns.channel().await;
    channel
        .confirm_select(Default::default())
        .await
        .expect("confirms");
    let topology = ns.topology();
    let signer = OrderSigner::new(ns.backend_settings().order_signing_key.expose());
    let mut confirms = Vec::with_capacity(opts.messages);
    for user in 1..=opts.messages as i64 {
        let msg = OrderMessage {
            request_id: uuid::Uuid::now_v7(),
            user_id: user,
            product_id: product,
            price_cents: 500,
            created_at: Utc::now(),
            bucket: None,
        };
        let body = serde_json::to_vec(&msg).expect("json");
        // As seckill-api publishes it (signed: order-service refuses anything else).
        let request_id = msg.request_id.to_string();
        let confirm = seckill_messaging::publish_order(
            &channel,
            &signer,
            &topology,
            &request_id,
            "bench",
            &body,
        )
        .await
        .expect("publish");
        confirms.push(confirm);
    }
    for confirm in confirms {
        confirm.await.expect("confirm");
    }
    let stop = app.shutdown_token();
    let started = Instant::now();
    let task = tokio::spawn(app.run_until_stopped());
    let target = opts.messages as i64;
    // The product's stock is decremented in each batch's own transaction, so it reaches 0
    // exactly when every order is committed: a primary-key read per poll, where counting
    // the orders table every 20 ms would take CPU from the system being measured.
    loop {
        let remaining: i32 =
            sqlx::query_scalar("SELECT stock_remaining FROM products WHERE id = $1")
                .bind(product)
                .fetch_one(&db)
                .await
                .expect("stock");
        let written = target - i64::from(remaining);
        if remaining == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "drain stalled at {written}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = target as f64 / started.elapsed().as_secs_f64();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE product_id = $1")
        .bind(product)
        .fetch_one(&db)
        .await
        .expect("count");
    assert_eq!(orders, target, "every message is exactly one order");
    stop.cancel();
    let _ = task.await;
    let _ = connection.close(200, "bench done".into()).await;
    db.close().await;
    ns.cleanup().await;
    rate
}

/// pgbench: one `INSERT … ON CONFLICT DO NOTHING` per transaction into the same orders
/// table, as many clients as order-service's pool.
async fn pgbench_rate(opts: &Options) -> f64 {
    let ns = TestNamespace::new();
    // Building the service creates and migrates the database; it is never run.
    let app = order_service::Application::build(order_service::Settings {
        backend: ns.backend_settings(),
        port: 0,
        ..order_service::Settings::default()
    })
    .await
    .expect("build order-service");
    drop(app);
    let db = ns.db().await;
    let now = Utc::now();
    let product: i64 = sqlx::query_scalar(
        "INSERT INTO products (name, price_cents, stock_total, stock_remaining, start_at, end_at) \
         VALUES ('bench', 500, 1, 1, $1, $2) RETURNING id",
    )
    .bind(now - ChronoDuration::minutes(1))
    .bind(now + ChronoDuration::hours(1))
    .fetch_one(&db)
    .await
    .expect("product");
    db.close().await;
    let script = std::env::temp_dir().join(format!("seckill-pgbench-{}.sql", ns.namespace));
    std::fs::write(
        &script,
        format!(
            "\\set uid random(1, 2000000000)\n\
             INSERT INTO orders (request_id, user_id, product_id, price_cents, accepted_at) \
             VALUES (gen_random_uuid(), :uid, {product}, 500, now()) ON CONFLICT DO NOTHING;\n"
        ),
    )
    .expect("write pgbench script");
    let output = tokio::process::Command::new("pgbench")
        .args(["-n", "-j", "2", "-c"])
        .arg(opts.db_pool.to_string())
        .arg("-T")
        .arg(opts.pgbench_secs.to_string())
        .arg("-f")
        .arg(&script)
        .arg(&ns.database_url)
        .output()
        .await
        .expect("run pgbench (scripts/bench-orders.sh installs it)");
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    ns.cleanup().await;
    stdout
        .lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("tps = ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no tps in pgbench output:\n{stdout}"))
}
