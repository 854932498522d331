//! seckill-api's failpoints (`docs/failpoints.md`), one test each: the failure injected
//! mid-operation, the system left to recover, then the invariants checked from outside
//! ([`system::System::check`]). Each test holds a `fail::FailScenario`, so they run one at
//! a time; this binary exists only with the `failpoints` feature.

// Some of its helpers serve only order-service's failpoint tests.
#[allow(dead_code)]
mod system;

use std::time::{Duration, Instant};

use fail::FailScenario;

use seckill_store::home_bucket;
use system::{Bought, RECOVERY, System};

/// Retries `user`'s purchase while it is answered 503 (a load in the way) or a status in
/// `also`; the first other answer.
async fn buy_until_decided(system: &mut System, product: i64, user: i64, also: &[u16]) -> Bought {
    let deadline = Instant::now() + RECOVERY;
    loop {
        let bought = system.buy(product, user).await;
        if bought.status != 503 && !also.contains(&bought.status) {
            return bought;
        }
        assert!(
            Instant::now() < deadline,
            "user {user}: still {}",
            bought.status
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The purchase of user 1 fails at `failpoint` (armed once with `action`): its answer is
/// `expected`, then the system recovers and the invariants hold.
async fn purchase_fails_at(failpoint: &str, action: &str, expected: u16) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(3, 1).await;
    let reclaimed = system.metric("outbox_reclaimed_total").await;
    fail::cfg(failpoint, &format!("1*{action}")).expect("arm");
    let bought = system.buy(product, 1).await;
    assert_eq!(bought.status, expected, "{failpoint}={action}");
    if expected == 202 {
        // It fired all the same: the entry its handler left is published by the relay.
        seckill_testkit::eventually("the entry reclaimed", RECOVERY, || async {
            (system.metric("outbox_reclaimed_total").await > reclaimed).then_some(())
        })
        .await;
    }
    // Whatever the buyer was answered, the unit was taken: it becomes the buyer's order,
    // and the buyer cannot buy a second one.
    system.wait_order(product, 1).await;
    assert_eq!(system.buy(product, 1).await.status, 409);
    system.check(product, 3).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_after_script_error() {
    purchase_fails_at("purchase::after_script", "return", 503).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_after_script_panic() {
    purchase_fails_at("purchase::after_script", "panic", 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_after_publish_error() {
    // The outbox entry stays although its message is out: the relay publishes it again.
    purchase_fails_at("purchase::after_publish", "return", 202).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_after_publish_panic() {
    // The publishing worker dies with the confirm in: its handler answers on the outbox,
    // which the relay publishes again.
    purchase_fails_at("purchase::after_publish", "panic", 202).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_publishing_worker_that_died_is_replaced() {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(40, 1).await;
    fail::cfg("purchase::after_publish", "1*panic").expect("arm");
    assert_eq!(system.buy(product, 1).await.status, 202);
    // Its purchases rest on the outbox; the publisher must notice the dead worker and start
    // another, or every later purchase would too.
    let confirmed = format!("{}{{durable_in=\"broker\"}}", "seckill_accepted_total");
    let before = system.metric(&confirmed).await;
    let deadline = Instant::now() + RECOVERY;
    let mut user = 2;
    while system.metric(&confirmed).await <= before {
        assert!(
            Instant::now() < deadline,
            "no purchase confirmed by a new worker"
        );
        let status = system.buy(product, user).await.status;
        assert_eq!(
            status, 202,
            "user {user}: no new worker before the stock ran out"
        );
        user += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for buyer in 1..user {
        system.wait_order(product, buyer).await;
    }
    system.check(product, 40).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_after_deliver_panic() {
    purchase_fails_at("purchase::after_deliver", "panic", 500).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn purchase_after_deliver_error_is_replayed_by_its_key() {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(3, 1).await;
    fail::cfg("purchase::after_deliver", "1*return").expect("arm");
    let first = system.buy_keyed(product, 1, Some("k-1")).await;
    assert_eq!(first.status, 503);
    // The retry with the same key finds the purchase that went through: its 202, not a
    // second unit nor a 409.
    let again = system.buy_keyed(product, 1, Some("k-1")).await;
    assert_eq!(again.status, 202);
    let (_, request_id, _) = {
        system.wait_order(product, 1).await;
        system.order_of(product, 1).await.expect("order")
    };
    assert_eq!(again.request_id, Some(request_id));
    system.check(product, 3).await;
    system.shutdown().await;
    scenario.teardown();
}

/// Purchases that only the relay publishes (the handlers do not), with the relay failing
/// at `failpoint` as `action` says; `restart`: a new seckill-api takes over (a relay that
/// panicked is gone from its process).
async fn relay_fails_at(failpoint: &str, action: &str, restart: bool) {
    let scenario = FailScenario::setup();
    let mut system = System::start_with(|s| s.publish_on_accept = false, |_| {}).await;
    let product = system.product(4, 2).await;
    let interrupted = system.metric("outbox_relay_interruptions_total").await;
    fail::cfg(failpoint, action).expect("arm");
    for user in 1..=3 {
        assert_eq!(system.buy(product, user).await.status, 202);
    }
    if restart {
        // Some order exists once the relay published (and then died at the failpoint,
        // leaving its entries pending).
        seckill_testkit::eventually("the relay published", RECOVERY, || async {
            for user in 1..=3 {
                if system.order_of(product, user).await.is_some() {
                    return Some(());
                }
            }
            None
        })
        .await;
        let report = system.stock(product).await;
        assert!(
            report["outbox"].as_i64() > Some(0),
            "the relay died: {report}"
        );
        let mut settings = system::api_settings(&system.ns);
        settings.publish_on_accept = false;
        system.restart_api(settings).await;
    }
    for user in 1..=3 {
        system.wait_order(product, user).await;
    }
    if !restart {
        let now = system.metric("outbox_relay_interruptions_total").await;
        assert!(now > interrupted, "{failpoint} never fired");
    }
    system.check(product, 4).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_after_read_error() {
    relay_fails_at("relay::after_read", "2*return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_after_note_error() {
    relay_fails_at("relay::after_note", "2*return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_after_publish_error() {
    relay_fails_at("relay::after_publish", "2*return", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_after_publish_panic_then_restart() {
    relay_fails_at("relay::after_publish", "1*panic", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_after_delete_error() {
    relay_fails_at("relay::after_delete", "2*return", false).await;
}

/// The first purchase's lazy load fails at `failpoint` as `action` says (answered a 5xx);
/// later purchases load what is missing and the sale goes on to its exact end.
async fn load_fails_at(failpoint: &str, action: &str) {
    let scenario = FailScenario::setup();
    let mut system = System::start().await;
    let product = system.product(8, 4).await;
    fail::cfg(failpoint, action).expect("arm");
    let first = system.buy(product, 1).await;
    assert!(first.status >= 500, "{failpoint}: {}", first.status);
    // A load that died holding its lock (a panic) blocks others until the lock expires.
    buy_until_decided(&mut system, product, 2, &[]).await;
    system.check(product, 8).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_after_snapshot_error() {
    load_fails_at("load::after_snapshot", "1*return").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_after_bucket_error() {
    load_fails_at("load::after_bucket", "1*return").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_after_bucket_panic() {
    load_fails_at("load::after_bucket", "1*panic").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_after_fill_error() {
    load_fails_at("load::after_fill", "1*return").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_after_flag_error() {
    load_fails_at("load::after_flag", "1*return").await;
}

/// A buyer whose home bucket is dry sweeps the other; the sweep fails at `failpoint`.
/// `holds`: whether the failed purchase took its unit all the same.
async fn sweep_fails_at(failpoint: &str, holds: bool) {
    let scenario = FailScenario::setup();
    let mut system = System::start_with(
        |s| {
            // Abandoned reservations resolved within a second, not fifteen.
            s.sweep_fence = Duration::from_millis(500);
            s.sweep_skew_margin = Duration::from_millis(500);
        },
        |_| {},
    )
    .await;
    let product = system.product(2, 2).await;
    // User 1 empties its home bucket; user `dry` lives there too, and must sweep.
    assert_eq!(system.buy(product, 1).await.status, 202);
    let dry = (2..)
        .find(|&u| home_bucket(u, 2) == home_bucket(1, 2))
        .expect("a neighbour");
    fail::cfg(failpoint, "1*return").expect("arm");
    let failed = system.buy(product, dry).await;
    assert_eq!(failed.status, 503, "{failpoint}");
    if holds {
        system.wait_order(product, dry).await;
        assert_eq!(system.buy(product, dry).await.status, 409);
    } else {
        // Its reservation is resolved once past the fence: it buys.
        let bought = buy_until_decided(&mut system, product, dry, &[409]).await;
        assert_eq!(bought.status, 202);
    }
    system.check(product, 2).await;
    system.shutdown().await;
    scenario.teardown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweep_after_reserve_error() {
    sweep_fails_at("sweep::after_reserve", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweep_after_take_error() {
    sweep_fails_at("sweep::after_take", true).await;
}
