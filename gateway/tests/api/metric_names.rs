//! Every metric name the alert rules (deploy/prometheus/alerts.yml) and the dashboard
//! (deploy/grafana/dashboards/seckill.json) read is exported on some service's `/metrics`
//! after a burst of purchases through the platform: a rule or a panel over a name nobody
//! exports would stay silent or empty, and nothing else would say so.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use seckill_testkit::eventually;

use crate::helpers::{final_result, spawn_platform_with, user_token};

/// PromQL words that are no metric: operators, modifiers, and the aggregations (which may
/// be followed by `by (…)` rather than by their parenthesis).
const KEYWORDS: [&str; 27] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
];

/// The metric names an expression reads: string literals, label matchers (`{…}`), ranges
/// (`[…]`) and grouping label lists (`by (…)`) removed, what remains is function names
/// (followed by `(`), keywords, numbers, and metric names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    // Strings first: a label value may hold braces (`route="/api/seckill/{product_id}"`).
    let mut bare = String::new();
    let mut chars = expr.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let mut escaped = false;
                for inner in chars.by_ref() {
                    if escaped {
                        escaped = false;
                    } else if inner == '\\' {
                        escaped = true;
                    } else if inner == c {
                        break;
                    }
                }
                bare.push_str("\"\"");
            }
            _ => bare.push(c),
        }
    }
    let bare = strip_between(&bare, '{', '}');
    let bare = strip_between(&bare, '[', ']');
    let tokens = tokens(&bare);
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < tokens.len() {
        let (word, next) = (&tokens[i], tokens.get(i + 1).map(String::as_str));
        let is_name = word
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
        if is_name
            && [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            && next == Some("(")
        {
            // Skip the label list.
            while i < tokens.len() && tokens[i] != ")" {
                i += 1;
            }
        } else if is_name && next != Some("(") && !KEYWORDS.contains(&word.to_lowercase().as_str())
        {
            names.insert(word.clone());
        }
        i += 1;
    }
    names
}

/// `text` without what lies between each `open` and its `close` (kept themselves).
fn strip_between(text: &str, open: char, close: char) -> String {
    let mut out = String::new();
    let mut depth = 0;
    for c in text.chars() {
        if c == open {
            depth += 1;
            if depth == 1 {
                out.push(c);
            }
        } else if c == close && depth > 0 {
            depth -= 1;
            if depth == 0 {
                out.push(c);
            }
        } else if depth == 0 {
            out.push(c);
        }
    }
    out
}

/// Identifiers (names may hold `:`), numbers, and every other character on its own.
fn tokens(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' || (c == '.' && !word.is_empty()) {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
        if !c.is_whitespace() {
            out.push(c.to_string());
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Every expression of the alert rules and of the dashboard's panels.
fn expressions() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules: serde_norway::Value = serde_norway::from_str(
        &std::fs::read_to_string(root.join("deploy/prometheus/alerts.yml")).expect("alerts.yml"),
    )
    .expect("alerts.yml is YAML");
    let mut exprs = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().or(rule["record"].as_str());
            exprs.push((
                format!("rule {}", name.expect("a named rule")),
                rule["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/dashboards/seckill.json"))
            .expect("seckill.json"),
    )
    .expect("seckill.json is JSON");
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push((
                format!("panel {}", panel["title"]),
                target["expr"].as_str().expect("expr").to_string(),
            ));
        }
    }
    exprs
}

/// The series names of a Prometheus text exposition, with the families its `# TYPE`
/// lines declare.
fn exported(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            if let Some((family, kind)) = declared.split_once(' ') {
                names.insert(family.to_string());
                if kind == "histogram" || kind == "summary" {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{family}{suffix}"));
                    }
                }
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                names.insert(line[..end].to_string());
            }
        }
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql() {
    let expr = r#"sum without (from, to) (increase(order_breaker_transitions_total{to=~"open|x"}[5m])) > 0
        or order_breaker_state == 1 unless on () absent(amqp_queue_consumers{role="main"})
        or histogram_quantile(0.99, sum by (service, le) (rate(http_request_duration_seconds_bucket{route="/a/{id}"}[5m])))
        / sum(rate(orders_consumed_total[5m])) > 0.05 and max(deriv(x:y_z[10m:1m])) > 1e3"#;
    let expected: BTreeSet<String> = [
        "order_breaker_transitions_total",
        "order_breaker_state",
        "amqp_queue_consumers",
        "http_request_duration_seconds_bucket",
        "orders_consumed_total",
        "x:y_z",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(metric_names(expr), expected);
}

#[tokio::test]
async fn every_metric_the_alerts_and_the_dashboard_read_is_exported_after_a_burst() {
    let platform = spawn_platform_with(|s| s.queue_watch = Duration::from_millis(100)).await;
    let product = platform.create_product(5, -60).await;
    // A burst: 12 buyers for 5 units, so accepted and sold-out answers both.
    let buyers: Vec<i64> = (1..=12).map(|n| 91_000 + n).collect();
    let answers =
        {
            let platform = &platform;
            futures_util::future::join_all(buyers.iter().map(|&user| async move {
                platform.buy(product, &user_token(user)).await.status()
            }))
            .await
        };
    let accepted: Vec<i64> = buyers
        .iter()
        .zip(&answers)
        .filter(|(_, status)| status.as_u16() == 202)
        .map(|(&user, _)| user)
        .collect();
    assert_eq!(accepted.len(), 5, "answers: {answers:?}");
    for user in &accepted {
        let result = final_result(&platform, product, &user_token(*user)).await;
        assert_eq!(result["status"], "success", "{result}");
    }
    // A queued sale: a join, a purchase refused for want of a pass, polls, one with it.
    let queued = platform
        .create_queued_product(1, Duration::from_millis(500))
        .await;
    let buyer = user_token(92_001);
    let joined: Value = platform
        .post(&format!("/api/rooms/{queued}/join"), &buyer)
        .await
        .json()
        .await
        .expect("a join's answer");
    let ticket = joined["ticket"].as_str().expect("a ticket");
    assert_eq!(platform.buy(queued, &buyer).await.status(), 428);
    let path = eventually("admitted", Duration::from_secs(10), || async {
        let answer: Value = platform
            .get(&format!("/api/rooms/{queued}/tickets/{ticket}"), &buyer)
            .await
            .json()
            .await
            .ok()?;
        answer["purchase_path"].as_str().map(str::to_string)
    })
    .await;
    assert_eq!(platform.post(&path, &buyer).await.status(), 202);

    let main_queue = platform.ns.topology().queue;
    let scrape = |url: String| async move {
        reqwest::get(format!("{url}/metrics"))
            .await
            .expect("scrape")
            .text()
            .await
            .expect("metrics text")
    };
    eventually("the queue gauges", Duration::from_secs(10), || async {
        scrape(platform.order_service.clone())
            .await
            .contains(&format!("queue=\"{main_queue}\""))
            .then_some(())
    })
    .await;
    // Recorded after the answer, not before it.
    eventually(
        "the purchase with a pass counted",
        Duration::from_secs(10),
        || async {
            scrape(platform.gateway_admin.clone())
                .await
                .contains("gateway_room_bought_total ")
                .then_some(())
        },
    )
    .await;

    let mut available = BTreeSet::new();
    for url in [
        platform.gateway_admin.clone(),
        platform.seckill_api.clone(),
        platform.order_service.clone(),
    ] {
        available.extend(exported(&scrape(url).await));
    }
    let exprs = expressions();
    let mut read = BTreeSet::new();
    let mut missing = Vec::new();
    for (source, expr) in &exprs {
        for name in metric_names(expr) {
            if !available.contains(&name) {
                missing.push(format!("{name} ({source})"));
            }
            read.insert(name);
        }
    }
    assert!(
        read.len() >= 15,
        "the expressions read suspiciously few metrics: {read:?}"
    );
    assert!(
        missing.is_empty(),
        "read by the alerts or the dashboard but exported by no service: {missing:?}"
    );
    platform.shutdown().await;
}
