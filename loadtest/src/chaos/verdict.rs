//! A scenario's invariants: pure arithmetic over every answer the buyers got and the ledger
//! the stores hold once quiet, so each rule has a unit test.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::books::Ledger;
use super::drive::Story;

/// The figures of one scenario, printed on its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figures {
    /// Buyers answered 202 (both waves).
    pub accepted: usize,
    /// Live orders.
    pub orders: usize,
    /// 202s that ended as a cancelled order: an explicit failure, unit returned.
    pub failed: usize,
    /// 202s parked as dead letters, holding their units for an operator.
    pub parked: usize,
    /// Buyers left without a definite answer by the burst (a 5xx or no answer).
    pub unknown: usize,
    /// The Redis buckets' `remaining`.
    pub redis_remaining: i64,
    /// `redis_remaining + live orders + parked - stock_total`; 0 when the books balance.
    pub drift: i64,
}

/// One broken invariant, by name, with the numbers that broke it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Stable snake_case name.
    pub name: &'static str,
    /// The numbers involved.
    pub detail: String,
}

/// Judges a scenario: `burst` is the wave the fault hit, `after` the patient buyers who came
/// once it was over (they must all have had a definite answer: selling resumed).
pub fn judge(burst: &[Story], after: &[Story], ledger: &Ledger) -> (Figures, Vec<Violation>) {
    let stories: Vec<&Story> = burst.iter().chain(after).collect();
    let by_request: HashMap<Uuid, &super::books::OrderRow> =
        ledger.orders.iter().map(|o| (o.request_id, o)).collect();
    let parked: HashSet<Uuid> = ledger.parked.iter().copied().collect();
    let live: Vec<_> = ledger.orders.iter().filter(|o| o.live).collect();
    let live_buyers: HashSet<i64> = live.iter().map(|o| o.user_id).collect();
    let could_have_bought: HashSet<i64> = stories
        .iter()
        .filter(|s| s.could_have_bought)
        .map(|s| s.user_id)
        .collect();

    let accepted: Vec<Uuid> = stories.iter().filter_map(|s| s.accepted).collect();
    let lost = accepted
        .iter()
        .filter(|id| !by_request.contains_key(id) && !parked.contains(id))
        .count();
    let failed = accepted
        .iter()
        .filter(|id| by_request.get(id).is_some_and(|o| !o.live))
        .count();
    let unexplained = live
        .iter()
        .filter(|o| !could_have_bought.contains(&o.user_id))
        .count();
    let holding = live.len() as i64 + parked.len() as i64;
    let figures = Figures {
        accepted: accepted.len(),
        orders: live.len(),
        failed,
        parked: parked.len(),
        unknown: burst.iter().filter(|s| !s.definite()).count(),
        redis_remaining: ledger.redis_remaining,
        drift: ledger.redis_remaining + holding - ledger.stock_total,
    };
    let unanswered = after.iter().filter(|s| !s.definite()).count();
    // Later buyers are new users: `already_purchased` is only true for one whose earlier
    // try may have bought.
    let falsely_bought = after
        .iter()
        .filter(|s| s.last == "409" && !s.could_have_bought)
        .count();
    let told_sold_out_late = after.iter().any(|s| s.heard_sold_out);

    let total = ledger.stock_total;
    let checks = [
        (
            "oversold",
            holding <= total,
            format!(
                "live orders {} + parked {} > stock {total}",
                live.len(),
                parked.len()
            ),
        ),
        (
            "duplicate_buyers",
            live.len() == live_buyers.len(),
            format!("{} live orders, {} buyers", live.len(), live_buyers.len()),
        ),
        (
            "lost_202",
            lost == 0,
            format!(
                "{lost} of {} 202s ended with no order, failure or dead letter",
                accepted.len()
            ),
        ),
        (
            "unexplained_orders",
            unexplained == 0,
            format!("{unexplained} live orders of buyers whose every answer said they did not buy"),
        ),
        (
            "drift",
            figures.drift == 0,
            format!(
                "redis_remaining {} + live orders {} + parked {} - stock {total} = {}",
                ledger.redis_remaining,
                live.len(),
                parked.len(),
                figures.drift
            ),
        ),
        (
            "not_resumed",
            unanswered == 0,
            format!(
                "{unanswered} of {} later buyers got no definite answer",
                after.len()
            ),
        ),
        (
            "false_already_purchased",
            falsely_bought == 0,
            format!(
                "{falsely_bought} later buyers who had bought nothing were told already_purchased"
            ),
        ),
        (
            "false_sold_out",
            !(told_sold_out_late && ledger.redis_remaining > 0),
            format!(
                "later buyers heard sold_out while {} units were left",
                ledger.redis_remaining
            ),
        ),
    ];
    let violations = checks
        .into_iter()
        .filter(|(_, held, _)| !held)
        .map(|(name, _, detail)| Violation { name, detail })
        .collect();
    (figures, violations)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::books::OrderRow;

    fn story(user_id: i64, last: &str, accepted: Option<Uuid>) -> Story {
        Story {
            user_id,
            last: last.into(),
            accepted,
            could_have_bought: accepted.is_some() || last.starts_with('5'),
            heard_sold_out: last == "410",
        }
    }

    fn order(request_id: Uuid, user_id: i64, live: bool) -> OrderRow {
        OrderRow {
            request_id,
            user_id,
            live,
        }
    }

    /// Two buyers accepted with orders, one sold out, stock 2: everything balances.
    fn balanced() -> (Vec<Story>, Vec<Story>, Ledger) {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let burst = vec![story(1, "202", Some(a)), story(2, "202", Some(b))];
        let after = vec![story(3, "410", None)];
        let ledger = Ledger {
            stock_total: 2,
            orders: vec![order(a, 1, true), order(b, 2, true)],
            parked: vec![],
            redis_remaining: 0,
        };
        (burst, after, ledger)
    }

    fn names(violations: &[Violation]) -> Vec<&'static str> {
        violations.iter().map(|v| v.name).collect()
    }

    #[test]
    fn a_balanced_sale_passes() {
        let (burst, after, ledger) = balanced();
        let (figures, violations) = judge(&burst, &after, &ledger);
        assert_eq!(violations, vec![]);
        assert_eq!((figures.accepted, figures.orders, figures.drift), (2, 2, 0));
    }

    #[test]
    fn a_202_without_order_or_dead_letter_is_lost() {
        let (burst, after, mut ledger) = balanced();
        ledger.orders.pop();
        ledger.redis_remaining = 1;
        let (_, violations) = judge(&burst, &after, &ledger);
        assert!(names(&violations).contains(&"lost_202"), "{violations:?}");
        // The unit came back, and a later buyer was told sold_out all the same.
        assert!(
            names(&violations).contains(&"false_sold_out"),
            "{violations:?}"
        );
    }

    #[test]
    fn a_parked_202_holds_its_unit_and_is_not_lost() {
        let (burst, after, mut ledger) = balanced();
        let parked = ledger.orders.pop().unwrap().request_id;
        ledger.parked.push(parked);
        let (figures, violations) = judge(&burst, &after, &ledger);
        assert_eq!(violations, vec![]);
        assert_eq!((figures.parked, figures.drift), (1, 0));
    }

    #[test]
    fn a_cancelled_202_is_a_failure_whose_unit_must_be_back() {
        let (burst, after, mut ledger) = balanced();
        ledger.orders[1].live = false;
        let (figures, violations) = judge(&burst, &after, &ledger);
        assert_eq!(figures.failed, 1);
        assert_eq!(names(&violations), vec!["drift"]);
        ledger.redis_remaining = 1;
        let (_, violations) = judge(&burst, &after, &ledger);
        // Back in Redis, but the later buyer heard sold_out: a unit left behind.
        assert_eq!(names(&violations), vec!["false_sold_out"]);
    }

    #[test]
    fn an_order_of_a_buyer_told_sold_out_is_unexplained_but_not_after_a_5xx() {
        let (mut burst, after, mut ledger) = balanced();
        ledger.stock_total = 3;
        ledger.orders.push(order(Uuid::new_v4(), 3, true));
        let (_, violations) = judge(&burst, &after, &ledger);
        assert!(
            names(&violations).contains(&"unexplained_orders"),
            "{violations:?}"
        );
        burst.push(story(3, "502", None));
        let (_, violations) = judge(&burst, &after, &ledger);
        assert!(
            !names(&violations).contains(&"unexplained_orders"),
            "{violations:?}"
        );
    }

    #[test]
    fn a_new_buyer_told_already_purchased_is_named_unless_an_earlier_try_may_have_bought() {
        let (burst, mut after, ledger) = balanced();
        after.push(story(4, "409", None));
        let (_, violations) = judge(&burst, &after, &ledger);
        assert_eq!(names(&violations), vec!["false_already_purchased"]);
        after.last_mut().unwrap().could_have_bought = true;
        let (_, violations) = judge(&burst, &after, &ledger);
        assert_eq!(violations, vec![]);
    }

    #[test]
    fn oversold_duplicates_and_unresumed_sales_are_named() {
        let (burst, mut after, mut ledger) = balanced();
        ledger.orders.push(order(Uuid::new_v4(), 1, true));
        after.push(story(4, "503", None));
        let (_, violations) = judge(&burst, &after, &ledger);
        let names = names(&violations);
        for name in ["oversold", "duplicate_buyers", "drift", "not_resumed"] {
            assert!(names.contains(&name), "{name} missing from {names:?}");
        }
    }
}
