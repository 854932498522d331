//! The invariant check: pure arithmetic over what the burst saw and what the stores hold.
//!
//! Kept free of I/O so every verdict rule has a unit test.

use std::collections::BTreeMap;

/// Statuses that give a buyer a definite answer; only when every response was one of these
/// can "nothing undersold" be judged (a 429 or 503 buyer never competed for the stock).
const DEFINITE_STATUSES: [&str; 3] = ["202", "409", "410"];

/// Everything the verdict depends on, gathered once the system went quiet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Purchases the API answered 202.
    pub accepted: i64,
    /// Distinct user ids that took part in the burst.
    pub distinct_users: i64,
    /// Whether every response was 202, 409 or 410.
    pub every_buyer_answered: bool,
    /// Live (not cancelled) orders of the product in Postgres.
    pub orders_in_db: i64,
    /// Distinct `user_id` among those live orders.
    pub distinct_buyers: i64,
    /// `products.stock_total`.
    pub stock_total: i64,
    /// The Redis stock hash's `remaining` field (0 when missing).
    pub redis_remaining: i64,
    /// Accepted purchases with no order row (an unreadable 202 body counts as missing).
    pub missing_orders: i64,
    /// Purchases whose answer leaves open whether they bought ([`indefinite_answers`]).
    pub indefinite: i64,
}

/// One violated invariant, by name, with the numbers that broke it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Stable snake_case name of the check.
    pub name: &'static str,
    /// The numbers involved, for a human.
    pub detail: String,
}

impl Facts {
    /// Units sold beyond the stock.
    pub fn oversold(&self) -> i64 {
        (self.orders_in_db - self.stock_total).max(0)
    }

    /// Live orders beyond one per buyer.
    pub fn duplicate_buyers(&self) -> i64 {
        self.orders_in_db - self.distinct_buyers
    }

    /// Every violated invariant; empty means PASS.
    pub fn failures(&self) -> Vec<Failure> {
        let Facts {
            accepted,
            distinct_users: users,
            every_buyer_answered,
            orders_in_db: orders,
            distinct_buyers: buyers,
            stock_total: total,
            redis_remaining: redis,
            missing_orders: missing,
            indefinite,
        } = *self;
        let sellable = total.min(users);
        let checks = [
            (
                "oversold",
                orders <= total,
                format!("orders_in_db {orders} > stock_total {total}"),
            ),
            (
                "duplicate_buyers",
                orders == buyers,
                format!("orders_in_db {orders} but distinct_buyers {buyers}"),
            ),
            (
                "missing_orders",
                missing == 0,
                format!("{missing} of {accepted} accepted purchases have no order"),
            ),
            // Every 202 is an order; a buyer answered 5xx or nothing may also have bought.
            (
                "orders_match_accepted",
                accepted <= orders && orders <= accepted + indefinite,
                format!(
                    "orders_in_db {orders} outside accepted {accepted} .. accepted + \
                     {indefinite} indefinite = {}",
                    accepted + indefinite
                ),
            ),
            (
                "stock_conserved",
                redis + orders == total,
                format!("redis_remaining {redis} + orders_in_db {orders} != stock_total {total}"),
            ),
            // Equality, not <=: with every buyer answered, one unit short is an undersell.
            (
                "sold_exactly",
                !every_buyer_answered || orders == sellable,
                format!(
                    "orders_in_db {orders} != min(stock_total {total}, distinct_users {users}) = {sellable}"
                ),
            ),
        ];
        checks
            .into_iter()
            .filter(|(_, held, _)| !held)
            .map(|(name, _, detail)| Failure { name, detail })
            .collect()
    }
}

/// Whether every response in `status_counts` was a definite answer (202, 409 or 410).
pub fn every_buyer_answered(status_counts: &BTreeMap<String, u64>) -> bool {
    status_counts
        .iter()
        .all(|(status, n)| *n == 0 || DEFINITE_STATUSES.contains(&status.as_str()))
}

/// Answers that leave open whether the purchase bought: every 5xx and every request that got
/// no HTTP answer ([`crate::burst::TRANSPORT_ERROR`]). DESIGN.md §6: a buyer answered a 5xx or
/// nothing may have bought (the purchase can have run before its answer was lost: a 502/504
/// from a replica killed after its script ran, whose outbox entry another replica's relay
/// reclaims); the client cannot tell the gateway's own 503s (shed before forwarding) from a
/// backend's, so all 5xx count. Any 4xx did not buy.
pub fn indefinite_answers(status_counts: &BTreeMap<String, u64>) -> u64 {
    status_counts
        .iter()
        .filter(|(status, _)| status.starts_with('5') || *status == crate::burst::TRANSPORT_ERROR)
        .map(|(_, n)| n)
        .sum()
}

/// The last line of the human report.
pub fn verdict_line(failures: &[Failure]) -> String {
    if failures.is_empty() {
        "VERDICT: PASS".to_string()
    } else {
        let names: Vec<&str> = failures.iter().map(|f| f.name).collect();
        format!("VERDICT: FAIL ({})", names.join(", "))
    }
}

#[cfg(test)]
mod tests;
