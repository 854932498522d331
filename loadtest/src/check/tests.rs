//! The verdict rules, one passing case and one case per failing check.

use super::*;

/// 5000 buyers, 500 units, all sold, everyone answered.
fn clean_sale() -> Facts {
    Facts {
        accepted: 500,
        distinct_users: 5000,
        every_buyer_answered: true,
        orders_in_db: 500,
        distinct_buyers: 500,
        stock_total: 500,
        redis_remaining: 0,
        missing_orders: 0,
        indefinite: 0,
    }
}

fn names(facts: &Facts) -> Vec<&'static str> {
    facts.failures().iter().map(|f| f.name).collect()
}

#[test]
fn a_clean_sale_passes() {
    assert!(clean_sale().failures().is_empty());
    assert_eq!(verdict_line(&[]), "VERDICT: PASS");
}

#[test]
fn fewer_buyers_than_stock_passes_when_each_buyer_got_one() {
    let facts = Facts {
        accepted: 10,
        distinct_users: 10,
        orders_in_db: 10,
        distinct_buyers: 10,
        redis_remaining: 490,
        ..clean_sale()
    };
    assert!(facts.failures().is_empty());
}

#[test]
fn an_oversell_fails_oversold() {
    let facts = Facts {
        accepted: 501,
        orders_in_db: 501,
        distinct_buyers: 501,
        redis_remaining: -1,
        ..clean_sale()
    };
    assert_eq!(facts.oversold(), 1);
    assert_eq!(names(&facts), ["oversold", "sold_exactly"]);
}

#[test]
fn two_orders_for_one_user_fail_duplicate_buyers() {
    let facts = Facts {
        distinct_buyers: 499,
        ..clean_sale()
    };
    assert_eq!(facts.duplicate_buyers(), 1);
    assert_eq!(names(&facts), ["duplicate_buyers"]);
}

#[test]
fn an_accepted_purchase_without_order_fails_missing_orders() {
    let facts = Facts {
        missing_orders: 1,
        ..clean_sale()
    };
    assert_eq!(names(&facts), ["missing_orders"]);
}

#[test]
fn orders_differing_from_accepted_fail_orders_match_accepted() {
    let facts = Facts {
        accepted: 501,
        ..clean_sale()
    };
    assert_eq!(names(&facts), ["orders_match_accepted"]);
}

#[test]
fn redis_and_orders_not_adding_up_fail_stock_conserved() {
    let facts = Facts {
        redis_remaining: 3,
        ..clean_sale()
    };
    assert_eq!(names(&facts), ["stock_conserved"]);
}

#[test]
fn sold_out_while_stock_remains_fails_sold_exactly() {
    let facts = Facts {
        accepted: 499,
        orders_in_db: 499,
        distinct_buyers: 499,
        redis_remaining: 1,
        ..clean_sale()
    };
    assert_eq!(names(&facts), ["sold_exactly"]);
    assert_eq!(
        verdict_line(&facts.failures()),
        "VERDICT: FAIL (sold_exactly)"
    );
}

#[test]
fn sold_exactly_is_not_judged_when_some_buyers_were_shed() {
    let facts = Facts {
        every_buyer_answered: false,
        accepted: 499,
        orders_in_db: 499,
        distinct_buyers: 499,
        redis_remaining: 1,
        ..clean_sale()
    };
    assert!(facts.failures().is_empty());
}

#[test]
fn only_202_409_and_410_count_as_definite_answers() {
    let mut counts = BTreeMap::from([("202".to_string(), 5), ("410".to_string(), 9)]);
    counts.insert("409".to_string(), 1);
    assert!(every_buyer_answered(&counts));
    counts.insert("429".to_string(), 1);
    assert!(!every_buyer_answered(&counts));
    counts.insert("429".to_string(), 0);
    counts.insert("error".to_string(), 2);
    assert!(!every_buyer_answered(&counts));
}

/// A replica killed mid-burst: 19 buyers answered 502/504 whose purchases ran anyway (another
/// replica's relay reclaimed their outbox entries), 2981 answered 202.
fn burst_with_a_dead_replica() -> Facts {
    Facts {
        accepted: 2981,
        distinct_users: 4000,
        every_buyer_answered: false,
        orders_in_db: 3000,
        distinct_buyers: 3000,
        stock_total: 3000,
        redis_remaining: 0,
        missing_orders: 0,
        indefinite: 19,
    }
}

#[test]
fn orders_of_buyers_answered_indefinitely_are_within_orders_match_accepted() {
    assert!(burst_with_a_dead_replica().failures().is_empty());
}

#[test]
fn more_orders_than_accepted_plus_indefinite_fail_orders_match_accepted() {
    let facts = Facts {
        orders_in_db: 3001,
        distinct_buyers: 3001,
        stock_total: 3100,
        redis_remaining: 99,
        ..burst_with_a_dead_replica()
    };
    assert_eq!(names(&facts), ["orders_match_accepted"]);
    let detail = &facts.failures()[0].detail;
    assert!(
        detail.contains("3001") && detail.contains("19 indefinite"),
        "{detail}"
    );
}

#[test]
fn fewer_orders_than_accepted_fail_orders_match_accepted_whatever_was_indefinite() {
    let facts = Facts {
        orders_in_db: 2980,
        distinct_buyers: 2980,
        redis_remaining: 20,
        ..burst_with_a_dead_replica()
    };
    assert_eq!(names(&facts), ["orders_match_accepted"]);
}

#[test]
fn every_5xx_and_transport_error_is_an_indefinite_answer() {
    let counts = BTreeMap::from([
        ("202".to_string(), 5),
        ("409".to_string(), 1),
        ("410".to_string(), 9),
        ("429".to_string(), 3),
        ("502".to_string(), 2),
        ("503".to_string(), 1),
        ("504".to_string(), 4),
        ("error".to_string(), 7),
    ]);
    assert_eq!(indefinite_answers(&counts), 14);
}
