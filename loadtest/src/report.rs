//! The run's report: a fixed-shape JSON document and the human summary printed to stdout.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::burst::BurstOutcome;
use crate::check::{Facts, Failure, verdict_line};

/// The machine-readable report; its fields are the JSON keys, no more and no fewer.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Requests sent.
    pub requests: u64,
    /// Responses by status code (`"error"` for transport failures).
    pub status_counts: BTreeMap<String, u64>,
    /// 202 answers.
    pub accepted: u64,
    /// Answers that leave open whether the purchase bought: 5xx and transport errors
    /// ([`crate::check::indefinite_answers`]).
    pub indefinite_answers: u64,
    /// Live orders of the product.
    pub orders_in_db: i64,
    /// Distinct buyers among them.
    pub distinct_buyers: i64,
    /// `products.stock_total`.
    pub stock_total: i64,
    /// Redis `remaining`.
    pub redis_remaining: i64,
    /// Orders beyond the stock.
    pub oversold: i64,
    /// Orders beyond one per buyer.
    pub duplicate_buyers: i64,
    /// Accepted purchases with no order.
    pub missing_orders: i64,
    /// Requests per second over the burst.
    pub throughput_rps: f64,
    /// Latency quantiles of answered requests.
    pub latency_ms: LatencyMs,
}

/// Latency quantiles, in milliseconds.
#[derive(Debug, Serialize, PartialEq)]
pub struct LatencyMs {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Slowest answer.
    pub max: f64,
}

impl LatencyMs {
    /// Quantiles of a histogram recorded in microseconds.
    pub fn from_micros(histogram: &Histogram<u64>) -> Self {
        let ms = |us: u64| us as f64 / 1000.0;
        Self {
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            max: ms(histogram.max()),
        }
    }
}

impl Report {
    /// Assembles the report from the burst and the checked facts.
    pub fn new(burst: &BurstOutcome, facts: &Facts) -> Self {
        Self {
            requests: burst.requests,
            status_counts: burst.status_counts.clone(),
            accepted: burst.accepted,
            indefinite_answers: u64::try_from(facts.indefinite).unwrap_or(0),
            orders_in_db: facts.orders_in_db,
            distinct_buyers: facts.distinct_buyers,
            stock_total: facts.stock_total,
            redis_remaining: facts.redis_remaining,
            oversold: facts.oversold(),
            duplicate_buyers: facts.duplicate_buyers(),
            missing_orders: facts.missing_orders,
            throughput_rps: burst.throughput_rps(),
            latency_ms: LatencyMs::from_micros(&burst.latency_us),
        }
    }

    /// Writes the report as pretty JSON.
    pub fn write_json(&self, path: &Path) -> anyhow::Result<()> {
        let json = serde_json::to_string_pretty(self).context("serialising the report")?;
        std::fs::write(path, json + "\n")
            .with_context(|| format!("writing the report to {}", path.display()))
    }

    /// The human summary, ending with the verdict line.
    pub fn human(&self, quiet_after: Duration, quiet: bool, failures: &[Failure]) -> String {
        let statuses: Vec<String> = self
            .status_counts
            .iter()
            .map(|(status, n)| format!("{status}={n}"))
            .collect();
        let l = &self.latency_ms;
        let mut out = format!(
            "requests                 {}\n\
             status codes             {}\n\
             accepted (202)           {}\n\
             indefinite (5xx, error)  {}\n\
             orders in DB             {}\n\
             distinct buyers          {}\n\
             stock total              {}\n\
             Redis remaining          {}\n\
             oversold                 {}\n\
             duplicate buyers         {}\n\
             accepted, missing order  {}\n\
             throughput               {:.1} req/s\n\
             latency ms               p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}\n\
             time until quiet         {:.2} s{}\n",
            self.requests,
            statuses.join(" "),
            self.accepted,
            self.indefinite_answers,
            self.orders_in_db,
            self.distinct_buyers,
            self.stock_total,
            self.redis_remaining,
            self.oversold,
            self.duplicate_buyers,
            self.missing_orders,
            self.throughput_rps,
            l.p50,
            l.p90,
            l.p99,
            l.max,
            quiet_after.as_secs_f64(),
            if quiet {
                ""
            } else {
                " (timed out before the system was quiet)"
            },
        );
        for failure in failures {
            out.push_str(&format!("FAILED {}: {}\n", failure.name, failure.detail));
        }
        out.push_str(&verdict_line(failures));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn sample() -> Report {
        Report {
            requests: 5000,
            status_counts: BTreeMap::from([("202".into(), 500), ("410".into(), 4500)]),
            accepted: 500,
            indefinite_answers: 0,
            orders_in_db: 500,
            distinct_buyers: 500,
            stock_total: 500,
            redis_remaining: 0,
            oversold: 0,
            duplicate_buyers: 0,
            missing_orders: 0,
            throughput_rps: 1234.5,
            latency_ms: LatencyMs {
                p50: 1.0,
                p90: 2.0,
                p99: 3.0,
                max: 4.0,
            },
        }
    }

    fn keys(value: &serde_json::Value) -> BTreeSet<&str> {
        value
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect()
    }

    #[test]
    fn the_json_report_has_exactly_the_contract_keys() {
        let value = serde_json::to_value(sample()).unwrap();
        let expected: BTreeSet<&str> = [
            "requests",
            "status_counts",
            "accepted",
            "indefinite_answers",
            "orders_in_db",
            "distinct_buyers",
            "stock_total",
            "redis_remaining",
            "oversold",
            "duplicate_buyers",
            "missing_orders",
            "throughput_rps",
            "latency_ms",
        ]
        .into();
        assert_eq!(keys(&value), expected);
        assert_eq!(
            keys(&value["latency_ms"]),
            BTreeSet::from(["p50", "p90", "p99", "max"])
        );
        assert_eq!(value["status_counts"]["410"], 4500);
        assert!(value["latency_ms"]["p99"].is_f64());
    }

    #[test]
    fn latency_quantiles_are_converted_to_milliseconds() {
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        histogram.record(2_000).unwrap();
        let latency = LatencyMs::from_micros(&histogram);
        assert!((latency.max - 2.0).abs() < 0.01, "{latency:?}");
    }

    #[test]
    fn the_human_report_names_each_failed_check_and_ends_with_the_verdict() {
        let failures = [Failure {
            name: "oversold",
            detail: "orders_in_db 501 > stock_total 500 (oversold 1)".into(),
        }];
        let text = sample().human(Duration::from_millis(1500), true, &failures);
        assert!(text.contains("FAILED oversold: orders_in_db 501"));
        assert!(text.ends_with("VERDICT: FAIL (oversold)"));
        assert!(
            sample()
                .human(Duration::ZERO, true, &[])
                .ends_with("VERDICT: PASS")
        );
    }
}
