//! The load scripts, run with the real tools against the live in-process platform: `k6 run
//! loadtest/k6/seckill.js` and `wrk -s loadtest/wrk/seckill.lua` send B distinct buyers at a
//! product with S < B units through the gateway. Their own reports must add up (every buyer
//! sent once and answered 202/409/410, no 409 since no buyer repeats, 202 = S) and the stores
//! must agree afterwards (one order per 202, one per buyer, nothing left in Redis).
//!
//! The tools are not optional: a missing one fails the test, naming `scripts/tools.sh`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

use seckill_testkit::{JWT_SECRET, eventually};

use crate::helpers::{Platform, spawn_platform_for_load, user_token};

/// Distinct buyers per run, and the units they compete for.
const BUYERS: i64 = 2_000;
const STOCK: i32 = 200;
/// Connections (wrk) or VUs (k6) in flight.
const CONCURRENCY: usize = 64;
/// Longest a tool may run; the whole test stays under a minute.
const TOOL_DEADLINE: Duration = Duration::from_secs(40);
/// The purchases' p99 the k6 threshold allows: generous, the machine is shared with the
/// suite; the threshold's mechanics are what is under test.
const P99_MS: u32 = 5_000;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// Fails (never skips) when `tool` cannot be started.
async fn require_tool(tool: &str, version_arg: &str) {
    let started = Command::new(tool)
        .arg(version_arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await;
    if let Err(e) = started {
        panic!("{tool} is not on PATH ({e}): run scripts/tools.sh");
    }
}

/// Runs `command` to its end within [`TOOL_DEADLINE`]; returns its exit success and stdout.
async fn run_tool(name: &str, command: &mut Command) -> (bool, String) {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {name}: {e} (run scripts/tools.sh)"));
    let output = tokio::time::timeout(TOOL_DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{name} still running after {TOOL_DEADLINE:?}"))
        .unwrap_or_else(|e| panic!("waiting for {name}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("--- {name} stdout ---\n{stdout}\n--- {name} stderr ---\n{stderr}");
    (output.status.success(), stdout)
}

/// The JSON after `marker` on its line of `stdout`.
fn report_line(stdout: &str, marker: &str) -> Value {
    let line = stdout
        .lines()
        .find_map(|line| line.strip_prefix(marker))
        .unwrap_or_else(|| panic!("no `{marker}` line in the tool's output"));
    serde_json::from_str(line.trim()).expect("the report line is JSON")
}

fn count(report: &Value, status: &str) -> i64 {
    report["statuses"][status]
        .as_i64()
        .unwrap_or_else(|| panic!("statuses.{status} missing from {report}"))
}

/// The counts every tool's report must show for BUYERS distinct buyers and STOCK units.
fn assert_counts(tool: &str, report: &Value) {
    let (accepted, repeated, sold_out, other) = (
        count(report, "202"),
        count(report, "409"),
        count(report, "410"),
        count(report, "other"),
    );
    assert_eq!(
        report["sent"], BUYERS,
        "{tool}: every buyer sent once: {report}"
    );
    assert_eq!(
        accepted + repeated + sold_out,
        BUYERS,
        "{tool}: 202 + 409 + 410 = buyers: {report}"
    );
    assert_eq!(
        repeated, 0,
        "{tool}: a 409 means a buyer was sent twice: {report}"
    );
    assert_eq!(other, 0, "{tool}: no other status: {report}");
    assert_eq!(accepted, i64::from(STOCK), "{tool}: 202 = stock: {report}");
}

/// The invariants once the order-service caught up: one live order per 202, one per buyer,
/// Redis holding nothing more.
async fn assert_stores_agree(platform: &Platform, product: i64, accepted: i64) {
    let db = platform.ns.db().await;
    let live_orders = || async {
        let (orders, buyers): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(DISTINCT user_id) FROM orders \
             WHERE product_id = $1 AND status <> 'cancelled'",
        )
        .bind(product)
        .fetch_one(&db)
        .await
        .expect("count orders");
        (orders, buyers)
    };
    eventually(
        "an order for every 202",
        Duration::from_secs(20),
        || async { (live_orders().await.0 >= accepted).then_some(()) },
    )
    .await;
    let (orders, buyers) = live_orders().await;
    db.close().await;
    assert_eq!(orders, accepted, "orders = 202s");
    assert_eq!(buyers, orders, "no buyer with two orders");
    assert_eq!(platform.redis_remaining(product).await, 0, "Redis sold out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_sends_each_buyer_once_and_the_stores_agree() {
    require_tool("k6", "version").await;
    let platform = spawn_platform_for_load().await;
    let product = platform.create_product(STOCK, -60).await;
    let summary = tempfile_path("k6-summary.json");

    let (ok, stdout) = run_tool(
        "k6",
        Command::new("k6")
            .current_dir(repo_root())
            .args(["run", "--quiet", "--no-color"])
            .args(["-e", &format!("GATEWAY_URL={}", platform.gateway)])
            .args(["-e", &format!("PRODUCT_ID={product}")])
            .args(["-e", &format!("USERS={BUYERS}")])
            .args(["-e", &format!("VUS={CONCURRENCY}")])
            .args(["-e", "FIRST_USER_ID=100000"])
            .args(["-e", &format!("JWT_SECRET={JWT_SECRET}")])
            .args(["-e", &format!("P99_MS={P99_MS}")])
            .args(["-e", &format!("SUMMARY_JSON={}", summary.display())])
            .arg("loadtest/k6/seckill.js"),
    )
    .await;
    assert!(ok, "k6 failed (a threshold crossed exits 99)");

    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("the summary file"))
            .expect("the summary file is JSON");
    let _ = std::fs::remove_file(&summary);
    let report = &file["seckill"];
    assert_eq!(report, &report_line(&stdout, "SECKILL_K6_REPORT "));
    assert_counts("k6", report);
    assert_eq!(report["thresholds_ok"], true, "{report}");
    let thresholds = report["thresholds"].as_array().expect("thresholds");
    assert!(
        thresholds
            .iter()
            .any(|t| t["metric"] == "http_req_duration{kind:purchase}"),
        "a latency threshold on the purchases: {report}"
    );
    assert!(
        file["k6"]["metrics"]["http_reqs"].is_object(),
        "k6's own data kept"
    );
    assert!(report["purchases_per_sec"].as_f64().unwrap_or(0.0) > 0.0);

    assert_stores_agree(&platform, product, count(report, "202")).await;
    platform.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrk_sends_each_buyer_once_stops_when_answered_and_the_stores_agree() {
    require_tool("wrk", "-v").await;
    let platform = spawn_platform_for_load().await;
    let product = platform.create_product(STOCK, -60).await;
    let tokens = tempfile_path("wrk-tokens.txt");
    let lines: Vec<String> = (0..BUYERS).map(|n| user_token(200_000 + n)).collect();
    std::fs::write(&tokens, lines.join("\n") + "\n").expect("write the tokens");

    let started = std::time::Instant::now();
    let (ok, stdout) = run_tool(
        "wrk",
        Command::new("wrk")
            .current_dir(repo_root())
            .env("TOKENS", &tokens)
            .env("PRODUCT_ID", product.to_string())
            .env_remove("THREADS")
            .args([
                "-t2",
                &format!("-c{CONCURRENCY}"),
                "-d30s",
                "--timeout",
                "10s",
            ])
            .args(["-s", "loadtest/wrk/seckill.lua"])
            .arg(&platform.gateway),
    )
    .await;
    let took = started.elapsed();
    let _ = std::fs::remove_file(&tokens);
    assert!(ok, "wrk failed");

    let report = report_line(&stdout, "SECKILL_WRK_REPORT ");
    assert_counts("wrk", &report);
    assert_eq!(report["buyers"], BUYERS, "{report}");
    assert_eq!(report["threads"], 2, "{report}");
    assert_eq!(report["threads_finished"], 2, "{report}");
    assert_eq!(report["complete"], true, "{report}");
    assert_eq!(
        report["filler_sent"], 0,
        "no request but the purchases: {report}"
    );
    assert_eq!(report["problems"], serde_json::json!([]), "{report}");
    // wrk's own count of completed requests is the purchases, nothing else.
    assert!(
        stdout.contains(&format!("{BUYERS} requests in")),
        "wrk completed exactly the purchases"
    );
    // It ended when the last purchase was answered, not at -d.
    assert!(
        took < Duration::from_secs(25),
        "wrk ran {took:?} of its 30 s"
    );
    assert!(report["purchases_per_sec"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(report["latency_ms"]["p99"].as_f64().is_some(), "{report}");

    assert_stores_agree(&platform, product, count(&report, "202")).await;
    platform.shutdown().await;
}

/// A fresh path in the temporary directory (the file is the caller's to remove).
fn tempfile_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("seckill-{}-{name}", uuid::Uuid::new_v4()))
}
