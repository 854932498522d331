//! A scenario's invariants: pure arithmetic over every answer the buyers got and the ledger
//! the stores hold once quiet, so each rule has a unit test.

use std::collections::{HashMap, HashSet};

use seckill_testkit::ConfirmReport;
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

/// `kill-seckill-api-mid-batch`: the kill must have caught purchases in flight (taken, in
/// the outbox, not yet confirmed and deleted), or it tested nothing; and each of them, like
/// each `202`, must end as an order.
pub fn judge_in_flight(at_kill: &[Uuid], accepted: &[Uuid], ledger: &Ledger) -> Vec<Violation> {
    let ordered: HashSet<Uuid> = ledger.orders.iter().map(|o| o.request_id).collect();
    let lost = |ids: &[Uuid]| {
        ids.iter()
            .collect::<HashSet<_>>()
            .into_iter()
            .filter(|id| !ordered.contains(id))
            .count()
    };
    let (lost_in_flight, lost_accepted) = (lost(at_kill), lost(accepted));
    let mut violations = Vec::new();
    if at_kill.is_empty() {
        violations.push(Violation {
            name: "nothing_in_flight",
            detail: "the outbox was empty when seckill-api was killed: nothing was in flight"
                .into(),
        });
    }
    if lost_in_flight + lost_accepted > 0 {
        violations.push(Violation {
            name: "in_flight_lost",
            detail: format!(
                "{lost_in_flight} of {} purchases in the outbox at the kill and {lost_accepted} \
                 of {} 202s ended with no order",
                at_kill.len(),
                accepted.len()
            ),
        });
    }
    violations
}

/// `rabbitmq-confirm-lost`: the proxy must have swallowed a batch's confirm and severed the
/// connection (else nothing was tested); every `202`, and every purchase of the swallowed
/// confirm, must end as exactly one order; and no more `202`s may say they rest on the
/// broker (`broker_202s`, seckill-api's `seckill_accepted_total{durable_in="broker"}`) than
/// purchases whose confirm reached seckill-api.
pub fn judge_confirms(
    accepted: &[Uuid],
    ledger: &Ledger,
    broker_202s: u64,
    report: &ConfirmReport,
) -> Vec<Violation> {
    let mut orders: HashMap<Uuid, usize> = HashMap::new();
    for order in &ledger.orders {
        *orders.entry(order.request_id).or_default() += 1;
    }
    let swallowed: Vec<Uuid> = report
        .swallowed
        .iter()
        .flatten()
        .filter_map(|id| id.parse().ok())
        .collect();
    let not_one = |ids: &[Uuid]| {
        ids.iter()
            .collect::<HashSet<_>>()
            .into_iter()
            .filter(|id| orders.get(id).copied().unwrap_or(0) != 1)
            .count()
    };
    let (lost_accepted, lost_swallowed) = (not_one(accepted), not_one(&swallowed));
    let mut violations = Vec::new();
    if swallowed.is_empty() || report.severed == 0 {
        violations.push(Violation {
            name: "confirm_not_lost",
            detail: format!(
                "the proxy swallowed {} purchases' confirm and severed {} connections: \
                 nothing was tested",
                swallowed.len(),
                report.severed
            ),
        });
    }
    if lost_accepted + lost_swallowed > 0 {
        violations.push(Violation {
            name: "confirmed_lost",
            detail: format!(
                "{lost_accepted} of {} 202s and {lost_swallowed} of the {} purchases whose \
                 confirm was lost did not end as exactly one order",
                accepted.len(),
                swallowed.len()
            ),
        });
    }
    let confirmed = report.passed.len() as u64;
    if broker_202s > confirmed {
        violations.push(Violation {
            name: "unconfirmed_202",
            detail: format!(
                "{broker_202s} 202s said durable_in=\"broker\", but confirms reached \
                 seckill-api for {confirmed} purchases"
            ),
        });
    }
    violations
}

/// The `seckill_accepted_total{durable_in="broker"}` of a Prometheus text, if it has one.
pub fn accepted_in_broker(metrics: &str) -> Option<u64> {
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("seckill_accepted_total{") && line.contains(r#"durable_in="broker""#)
        })
        .find_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|value| value as u64)
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
    #[test]
    fn a_kill_that_caught_nothing_in_flight_tested_nothing() {
        let (burst, _, ledger) = balanced();
        let accepted: Vec<Uuid> = burst.iter().filter_map(|s| s.accepted).collect();
        assert_eq!(
            names(&judge_in_flight(&[], &accepted, &ledger)),
            vec!["nothing_in_flight"]
        );
        assert_eq!(judge_in_flight(&accepted[..1], &accepted, &ledger), vec![]);
    }

    #[test]
    fn a_purchase_in_the_outbox_at_the_kill_must_end_as_an_order() {
        let (burst, _, ledger) = balanced();
        let accepted: Vec<Uuid> = burst.iter().filter_map(|s| s.accepted).collect();
        // Taken, never answered, never ordered.
        let orphan = Uuid::new_v4();
        let violations = judge_in_flight(&[accepted[0], orphan], &accepted, &ledger);
        assert_eq!(names(&violations), vec!["in_flight_lost"]);
        assert!(violations[0].detail.starts_with("1 of 2"), "{violations:?}");
        // A 202 without an order is lost too, in the outbox at the kill or not.
        let mut short = ledger.clone();
        short.orders.pop();
        let violations = judge_in_flight(&[accepted[0]], &accepted, &short);
        assert_eq!(names(&violations), vec!["in_flight_lost"]);
    }

    fn report(passed: &[Uuid], swallowed: &[Uuid], severed: usize) -> ConfirmReport {
        ConfirmReport {
            connections: 2,
            passed_messages: 1,
            passed: passed.iter().map(Uuid::to_string).collect(),
            swallowed: Some(swallowed.iter().map(Uuid::to_string).collect()),
            severed,
        }
    }

    #[test]
    fn a_lost_confirm_passes_when_its_purchases_end_as_one_order_each() {
        let (burst, _, ledger) = balanced();
        let accepted: Vec<Uuid> = burst.iter().filter_map(|s| s.accepted).collect();
        // The first purchase's confirm came; the second's was swallowed, its 202 rested on
        // the outbox, and the relay made it an order.
        let seen = report(&accepted[..1], &accepted[1..], 1);
        assert_eq!(judge_confirms(&accepted, &ledger, 1, &seen), vec![]);
    }

    #[test]
    fn a_202_in_the_broker_beyond_the_confirms_that_came_is_unconfirmed() {
        let (burst, _, ledger) = balanced();
        let accepted: Vec<Uuid> = burst.iter().filter_map(|s| s.accepted).collect();
        let seen = report(&accepted[..1], &accepted[1..], 1);
        assert_eq!(
            names(&judge_confirms(&accepted, &ledger, 2, &seen)),
            vec!["unconfirmed_202"]
        );
    }

    #[test]
    fn a_swallowed_purchase_without_its_order_is_lost_and_nothing_swallowed_is_named() {
        let (burst, _, mut ledger) = balanced();
        let accepted: Vec<Uuid> = burst.iter().filter_map(|s| s.accepted).collect();
        let taken = Uuid::new_v4();
        let seen = report(&accepted, &[taken], 1);
        assert_eq!(
            names(&judge_confirms(&accepted, &ledger, 2, &seen)),
            vec!["confirmed_lost"]
        );
        ledger.orders.push(order(taken, 9, true));
        assert_eq!(judge_confirms(&accepted, &ledger, 2, &seen), vec![]);
        // Two rows for one purchase is no better than none.
        ledger.orders.push(order(taken, 9, true));
        assert_eq!(
            names(&judge_confirms(&accepted, &ledger, 2, &seen)),
            vec!["confirmed_lost"]
        );
        ledger.orders.pop();
        let nothing = ConfirmReport {
            swallowed: None,
            ..report(&accepted, &[], 0)
        };
        assert_eq!(
            names(&judge_confirms(&accepted, &ledger, 2, &nothing)),
            vec!["confirm_not_lost"]
        );
    }

    #[test]
    fn the_broker_202s_are_read_from_the_metrics() {
        let text = "# TYPE seckill_accepted_total counter\n\
                    seckill_accepted_total{durable_in=\"outbox\"} 12\n\
                    seckill_accepted_total{durable_in=\"broker\"} 345\n";
        assert_eq!(accepted_in_broker(text), Some(345));
        assert_eq!(accepted_in_broker("seckill_purchases_total 3\n"), None);
    }
}
