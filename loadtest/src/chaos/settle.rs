//! What buyers do after their `202`: wait for the order, then pay it, cancel it, or leave it
//! to the payment window. Scenarios that put units back on sale while a fault is on (a
//! cancel and an expiry each run a compensation through Redis) settle their buyers here.
//!
//! Buyers arrive on a channel as their `202` comes, so settling runs alongside the wave and
//! the fault, not after them.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reqwest::header::AUTHORIZATION;
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use tokio::sync::mpsc::UnboundedReceiver;

/// How often a buyer asks for its purchase's result.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// Settles at once, at most: enough that a wave's last buyer pays well within the payment
/// window even on a busy machine (each settle is a few polls and one request).
const CONCURRENCY: usize = 256;

/// What a buyer does with its order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// Pays it: the order stays, the unit sold.
    Pay,
    /// Cancels it: the unit goes back on sale.
    Cancel,
    /// Does nothing: the payment window expires and the unit goes back on sale.
    Expire,
}

/// Which buyers do what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Every buyer pays.
    PayAll,
    /// Buyers take turns: pay, cancel, let expire.
    Mixed,
}

impl Policy {
    fn choice(self, nth: usize) -> Choice {
        match (self, nth % 3) {
            (Policy::PayAll, _) | (Policy::Mixed, 0) => Choice::Pay,
            (Policy::Mixed, 1) => Choice::Cancel,
            (Policy::Mixed, _) => Choice::Expire,
        }
    }
}

/// What the settling did, by outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Orders paid.
    pub paid: u64,
    /// Orders cancelled by their buyer.
    pub cancelled: u64,
    /// Orders left to expire.
    pub left: u64,
    /// Purchases that ended `failed` before the buyer could act.
    pub failed: u64,
    /// Buyers who could not act before the deadline (no order seen, or every try refused).
    pub gave_up: u64,
}

/// A purchase's result, as `GET /api/seckill/{id}/result` tells it.
#[derive(Deserialize)]
struct PurchaseResult {
    status: String,
    order_id: Option<i64>,
}

/// Settles every buyer that `accepted` yields (its `Authorization` header) until the
/// channel closes, each within `deadline` of its arrival.
pub async fn run(
    client: &Client,
    gateway_url: &str,
    product_id: i64,
    policy: Policy,
    accepted: UnboundedReceiver<String>,
    deadline: Duration,
) -> Settled {
    let base = gateway_url.trim_end_matches('/');
    let arrivals = futures_util::stream::unfold(accepted, |mut accepted| async move {
        accepted.recv().await.map(|buyer| (buyer, accepted))
    });
    let outcomes = arrivals
        .enumerate()
        .map(|(nth, authorization)| async move {
            let choice = policy.choice(nth);
            settle_one(client, base, product_id, &authorization, choice, deadline).await
        })
        .buffer_unordered(CONCURRENCY)
        .collect::<Vec<_>>()
        .await;
    let mut settled = Settled::default();
    for outcome in outcomes {
        match outcome {
            Outcome::Did(Choice::Pay) => settled.paid += 1,
            Outcome::Did(Choice::Cancel) => settled.cancelled += 1,
            Outcome::Did(Choice::Expire) => settled.left += 1,
            Outcome::Failed => settled.failed += 1,
            Outcome::GaveUp => settled.gave_up += 1,
        }
    }
    settled
}

/// How one buyer's settling ended.
enum Outcome {
    /// It did what it chose (an order it could not pay or cancel any more counts as left).
    Did(Choice),
    /// Its purchase ended `failed`: no order to act on.
    Failed,
    /// No order seen, or every try refused, before the deadline.
    GaveUp,
}

/// One buyer: its order, then its choice.
async fn settle_one(
    client: &Client,
    base: &str,
    product_id: i64,
    authorization: &str,
    choice: Choice,
    deadline: Duration,
) -> Outcome {
    let until = Instant::now() + deadline;
    let order_id = loop {
        if Instant::now() >= until {
            return Outcome::GaveUp;
        }
        let answer = client
            .get(format!("{base}/api/seckill/{product_id}/result"))
            .header(AUTHORIZATION, authorization)
            .send()
            .await;
        if let Ok(answer) = answer
            && answer.status() == StatusCode::OK
            && let Ok(result) = answer.json::<PurchaseResult>().await
        {
            match (result.status.as_str(), result.order_id) {
                ("success", Some(order_id)) => break order_id,
                ("failed", _) => return Outcome::Failed,
                _ => {}
            }
        }
        tokio::time::sleep(POLL_EVERY).await;
    };
    let action = match choice {
        Choice::Expire => return Outcome::Did(Choice::Expire),
        Choice::Pay => "pay",
        Choice::Cancel => "cancel",
    };
    let url = format!("{base}/api/orders/{order_id}/{action}");
    while Instant::now() < until {
        let answer = client
            .post(&url)
            .header(AUTHORIZATION, authorization)
            .send()
            .await;
        match answer.map(|a| a.status()) {
            Ok(StatusCode::OK) => return Outcome::Did(choice),
            // Already past its window (pay) or already cancelled by the sweep: nothing more
            // this buyer can do.
            Ok(StatusCode::CONFLICT) => return Outcome::Did(Choice::Expire),
            _ => tokio::time::sleep(POLL_EVERY).await,
        }
    }
    Outcome::GaveUp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mixed_crowd_takes_turns_and_pay_all_always_pays() {
        let mixed: Vec<Choice> = (0..6).map(|n| Policy::Mixed.choice(n)).collect();
        assert_eq!(
            mixed,
            [
                Choice::Pay,
                Choice::Cancel,
                Choice::Expire,
                Choice::Pay,
                Choice::Cancel,
                Choice::Expire
            ]
        );
        assert!((0..6).all(|n| Policy::PayAll.choice(n) == Choice::Pay));
    }
}
