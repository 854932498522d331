//! The buyer's sale page (`gateway/src/sale_page.rs`): served by the gateway without a token,
//! and driven in a real browser — Debian's Chromium under playwright-core
//! (`scripts/browser/sale.mjs`) — from the countdown to a paid order, with a second buyer
//! told the sale is sold out; the gateway asks for a proof-of-work on joining, which the
//! page solves in its Web Worker (`gateway/static/sale/pow.js`). `scripts/tools.sh` installs Chromium and the script's
//! node_modules; without them the browser test fails, naming it.
//!
//! `SECKILL_UPDATE_SCREENSHOTS=1` writes each state's screenshot into `docs/screenshots/`
//! (`docs/waiting-room.md` shows them).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::echo::{settings, spawn_echo, spawn_gateway};
use crate::helpers::{spawn_platform_with_gateway, user_token};

/// How far ahead the browser test's sale starts: Chromium must start and show the
/// countdown before it, on a loaded machine too.
const START_IN: Duration = Duration::from_secs(10);

/// The whole browser run's limit (each step in it waits 60 s at most).
const BROWSER_LIMIT: Duration = Duration::from_secs(300);

/// The proof-of-work the browser run's gateway asks of every join: a few thousand hashes.
const POW_BITS: u32 = 12;

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_without_a_token_and_anything_else_is_json_404() {
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(settings(&echo.url)).await;

    let page = gateway.get("/sale/42").send().await.expect("page");
    assert_eq!(page.status(), 200);
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    assert_eq!(page.headers()["cache-control"], "no-cache");
    assert!(page.headers().contains_key("content-security-policy"));
    let html = page.text().await.expect("html");
    assert!(html.contains("data-state"), "{html}");
    let version = html
        .split('"')
        .find_map(|part| part.strip_prefix("/sale/assets/app.js?v="))
        .unwrap_or_else(|| panic!("the page refers to app.js: {html}"))
        .to_string();
    for (file, content_type) in [
        ("app.js", "text/javascript; charset=utf-8"),
        // Not named by the page: app.js starts it as a Web Worker from its own URL.
        ("pow.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
    ] {
        let reference = format!("/sale/assets/{file}?v={version}");
        assert!(
            file == "pow.js" || html.contains(&reference),
            "the page refers to {reference}: {html}"
        );
        let asset = gateway.get(&reference).send().await.expect("asset");
        assert_eq!(asset.status(), 200, "{reference}");
        assert_eq!(asset.headers()["content-type"], content_type);
        assert_eq!(asset.headers()["cache-control"], "public, max-age=86400");
    }
    for path in [
        "/sale/assets/nope.js",
        "/sale/assets/../index.html",
        "/sale/x",
    ] {
        let answer = gateway.get(path).send().await.expect("get");
        assert!(
            [400, 404].contains(&answer.status().as_u16()),
            "{path}: {}",
            answer.status()
        );
        let body: Value = answer.json().await.expect("a JSON error");
        assert!(
            body["code"].is_string() && body["message"].is_string(),
            "{body}"
        );
    }
    assert_eq!(echo.hits(), 0, "the gateway answers the page itself");
}

/// Chromium, node and the script's node_modules, or why not.
fn browser_tools() -> Result<(), String> {
    let chromium = std::env::var("SECKILL_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        return Err(format!("no Chromium at {chromium}"));
    }
    let node = std::process::Command::new("node").arg("--version").output();
    if !node.is_ok_and(|out| out.status.success()) {
        return Err("no node on PATH".into());
    }
    let playwright = repository().join("scripts/browser/node_modules/playwright-core");
    if !playwright.exists() {
        return Err(format!("no {}", playwright.display()));
    }
    Ok(())
}

#[tokio::test]
async fn a_buyer_goes_from_the_countdown_to_a_paid_order_in_a_real_browser() {
    if let Err(missing) = browser_tools() {
        panic!(
            "{missing}: run scripts/tools.sh (it installs Chromium and scripts/browser's npm packages)"
        );
    }
    let platform = spawn_platform_with_gateway(|s| {
        s.room_pow_min_bits = POW_BITS;
        s.room_pow_max_bits = POW_BITS;
    })
    .await;
    let product = platform.create_queued_product(1, START_IN).await;
    let (buyer, second) = (501, 502);
    let screenshots = std::env::var_os("SECKILL_UPDATE_SCREENSHOTS")
        .map(|_| repository().join("docs/screenshots"));

    let started = Instant::now();
    let mut command = tokio::process::Command::new("node");
    command
        .env("SECKILL_SALE_POW", "1")
        .arg(repository().join("scripts/browser/sale.mjs"))
        .arg(&platform.gateway)
        .arg(product.to_string())
        .arg(user_token(buyer))
        .arg(user_token(second));
    if let Some(dir) = &screenshots {
        command.arg(dir);
    }
    let run = command
        .current_dir(repository().join("scripts/browser"))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(BROWSER_LIMIT, run)
        .await
        .unwrap_or_else(|_| panic!("the browser run took over {BROWSER_LIMIT:?}"))
        .expect("run node scripts/browser/sale.mjs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "sale.mjs failed ({}) after {:?}:\n{stdout}\n{stderr}",
        output.status,
        started.elapsed()
    );
    eprintln!("{stdout}");

    // The order the page showed is the buyer's, paid; the second buyer has none.
    let shown: i64 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("ORDER "))
        .and_then(|id| id.trim().parse().ok())
        .unwrap_or_else(|| panic!("sale.mjs named no order:\n{stdout}"));
    let db = platform.ns.db().await;
    let orders: Vec<(i64, i64, String)> =
        sqlx::query_as("SELECT id, user_id, status FROM orders WHERE product_id = $1 ORDER BY id")
            .bind(product)
            .fetch_all(&db)
            .await
            .expect("orders");
    db.close().await;
    assert_eq!(orders, [(shown, buyer, "paid".to_string())]);
    // Both joined with a proof: each was asked for one first.
    let metrics = reqwest::get(format!("{}/metrics", platform.gateway_admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("gateway_room_pow_failures_total{reason=\"missing\"}"),
        "{metrics}"
    );
    platform.shutdown().await;
}
