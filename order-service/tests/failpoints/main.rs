//! order-service's failpoints (`docs/failpoints.md`), one test each: the failure injected
//! mid-operation (an error, a panic, or a real abort of the service's binary), the system
//! left to recover, then the invariants checked from outside, through seckill-api
//! (`system::System::check`). Each test holds a `fail::FailScenario`, so they run one at a
//! time; this binary exists only with the `failpoints` feature.

// Some of its helpers serve only seckill-api's failpoint tests.
#[allow(dead_code)]
#[path = "../../../seckill-api/tests/failpoints/system.rs"]
mod system;

use std::os::unix::process::ExitStatusExt as _;
use std::process::Stdio;
use std::time::Duration;

use fail::FailScenario;

use system::{RECOVERY, System};

/// Users 1..=`users` buy one unit each (all accepted).
async fn buy_all(system: &mut System, product: i64, users: i64) {
    for user in 1..=users {
        assert_eq!(system.buy(product, user).await.status, 202, "user {user}");
    }
}

/// The consumer fails at `failpoint` (armed once with `action`) while writing the first
/// purchases; `restart`: a new order-service takes over from the one it happened in (a
/// delivery abandoned there is redelivered only once its channel closes).
async fn consumer_fails_at(failpoint: &str, action: &str, restart: bool) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(4, 2).await;
    let fired = system.fired(failpoint).await;
    fail::cfg(failpoint, &format!("1*{action}")).expect("arm");
    buy_all(&mut system, product, 3).await;
    if action == "return" {
        system.wait_fired(failpoint, fired).await;
    }
    if restart {
        system.start_orders().await;
    }
    for user in 1..=3 {
        system.wait_order(product, user).await;
    }
    system.check(product, 4).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_insert_error() {
    // The commit's answer lost: the batch is handed back and found written.
    consumer_fails_at("consume::after_insert", "return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_insert_panic() {
    // The batch committed, then its handler panicked: the orders it wrote are finished
    // (results written, acked), not dead-lettered.
    consumer_fails_at("consume::after_insert", "panic", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_result_abandoned_then_restart() {
    consumer_fails_at("consume::after_result", "return", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_ack_abandoned_then_restart() {
    consumer_fails_at("consume::after_ack", "return", true).await;
}

/// order-service as a real process with `failpoint` armed to abort it; it must die there
/// while writing the first purchases, and an order-service started after it finishes them.
async fn consumer_aborts_at(failpoint: &str) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    system.stop_orders().await;
    let product = system.product(4, 2).await;
    let ns = system.ns.clone();
    let mut process = tokio::process::Command::new(env!("CARGO_BIN_EXE_order-service"))
        .env_remove("RUST_LOG")
        .env("FAILPOINTS", format!("{failpoint}=return(abort)"))
        .env("SECKILL_HOST", "127.0.0.1")
        .env("SECKILL_ORDER_PORT", "0")
        .env("SECKILL_DATABASE_URL", &ns.database_url)
        .env("SECKILL_REDIS_URL", &ns.redis_url)
        .env("SECKILL_REDIS_CLUSTER", ns.redis_cluster.to_string())
        .env("SECKILL_AMQP_URL", &ns.amqp_url)
        .env("SECKILL_NAMESPACE", &ns.namespace)
        .env("SECKILL_INTERNAL_KEY", seckill_testkit::INTERNAL_KEY)
        // The order signing key stays the public default the in-process services use.
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .env("SECKILL_LOG_FILTER", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the order-service binary");
    buy_all(&mut system, product, 3).await;
    let status = tokio::time::timeout(RECOVERY, process.wait())
        .await
        .expect("the process aborts at its failpoint")
        .expect("wait");
    assert_eq!(status.signal(), Some(6), "aborted (SIGABRT): {status}");
    system.start_orders().await;
    for user in 1..=3 {
        system.wait_order(product, user).await;
    }
    system.check(product, 4).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_insert_abort() {
    consumer_aborts_at("consume::after_insert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_result_abort() {
    consumer_aborts_at("consume::after_result").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn consume_after_ack_abort() {
    consumer_aborts_at("consume::after_ack").await;
}

/// A sold-out product (its flag up) whose one order is given up by `give_up`, with the
/// compensation failing at `failpoint` as `action` says; `restart`: a new order-service
/// takes over (a compensation relay that panicked is gone from its process). The unit must
/// come back exactly once, its buyer released.
async fn compensation_fails_at(failpoint: &str, action: &str, restart: bool) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(1, 1).await;
    assert_eq!(system.buy(product, 1).await.status, 202);
    let order = system.wait_order(product, 1).await;
    // Sold out, and remembered so: the unit's return must lower the flag.
    assert_eq!(system.buy(product, 2).await.status, 410);
    let fired = system.fired(failpoint).await;
    fail::cfg(failpoint, action).expect("arm");
    assert_eq!(system.order_action(1, order, "cancel").await, 200);
    if action.ends_with("return") {
        system.wait_fired(failpoint, fired).await;
    }
    if restart {
        system.start_orders().await;
    }
    system.check(product, 1).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compensation_after_release_error() {
    compensation_fails_at("compensation::after_release", "1*return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compensation_after_restock_error() {
    compensation_fails_at("compensation::after_restock", "1*return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compensation_after_restock_panic_then_restart() {
    compensation_fails_at("compensation::after_restock", "1*panic", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compensation_after_reopen_error() {
    compensation_fails_at("compensation::after_reopen", "1*return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compensation_after_done_error() {
    compensation_fails_at("compensation::after_done", "1*return", false).await;
}

/// The buyer's cancellation fails at `failpoint`: answered 503, then cancelled by a retry
/// (or already), and the unit comes back once.
async fn cancel_fails_at(failpoint: &str) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(2, 1).await;
    assert_eq!(system.buy(product, 1).await.status, 202);
    let order = system.wait_order(product, 1).await;
    fail::cfg(failpoint, "1*return").expect("arm");
    assert_eq!(system.order_action(1, order, "cancel").await, 503);
    assert_eq!(system.order_action(1, order, "cancel").await, 200);
    system.check(product, 2).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_before_commit_error() {
    cancel_fails_at("cancel::before_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_after_commit_error() {
    cancel_fails_at("cancel::after_commit").await;
}

/// The payment-window sweep fails at `failpoint` while cancelling an unpaid order; a
/// later round cancels it (or finds it cancelled) and the unit comes back once.
async fn expiry_fails_at(failpoint: &str) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(2, 1).await;
    assert_eq!(system.buy(product, 1).await.status, 202);
    system.wait_order(product, 1).await;
    let fired = system.fired(failpoint).await;
    fail::cfg(failpoint, "1*return").expect("arm");
    // Its payment window has passed.
    sqlx::query("UPDATE orders SET pay_by = now() - interval '1 second' WHERE product_id = $1")
        .bind(product)
        .execute(&system.db)
        .await
        .expect("expire");
    system.wait_fired(failpoint, fired).await;
    seckill_testkit::eventually("cancelled", Duration::from_secs(30), || async {
        let order = system.order_of(product, 1).await;
        matches!(order, Some((_, _, s)) if s == "cancelled").then_some(())
    })
    .await;
    system.check(product, 2).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_before_commit_error() {
    expiry_fails_at("expiry::before_commit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_after_commit_error() {
    expiry_fails_at("expiry::after_commit").await;
}
