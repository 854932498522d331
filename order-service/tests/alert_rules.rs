//! The Prometheus alert rules (deploy/prometheus/alerts.yml) are valid and pass their unit
//! tests (deploy/prometheus/alerts.test.yml), run with the real `promtool`; and every rule
//! is tested both firing and silent.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The alerts the runbook and the other deliverables name (docs/metrics.md).
const ALERTS: [&str; 6] = [
    "SeckillDeadLetterStorm",
    "SeckillOutboxBacklogGrowing",
    "SeckillBreakerOpen",
    "SeckillDeadLetterQueueGrowing",
    "SeckillQueueWithoutConsumers",
    "SeckillPurchaseServerErrors",
];

fn prometheus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus")
}

/// Runs `promtool` with `args` in deploy/prometheus; panics with its output unless it
/// succeeded, and returns its stdout.
fn promtool(args: &[&str]) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(prometheus_dir())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): run scripts/tools.sh to install it")
        });
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{stdout}\n{stderr}",
        args.join(" "),
        output.status
    );
    stdout
}

#[test]
fn the_alert_rules_pass_promtool_check() {
    let out = promtool(&["check", "rules", "alerts.yml"]);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", ALERTS.len())),
        "{out}"
    );
}

#[test]
fn the_alert_rules_pass_their_promtool_unit_tests() {
    let out = promtool(&["test", "rules", "alerts.test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_is_tested_firing_and_silent() {
    let rules = std::fs::read_to_string(prometheus_dir().join("alerts.yml")).expect("rules");
    let tests = std::fs::read_to_string(prometheus_dir().join("alerts.test.yml")).expect("tests");
    let defined: Vec<&str> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("- alert:"))
        .map(str::trim)
        .collect();
    assert_eq!(
        defined, ALERTS,
        "alerts.yml defines other alerts than documented"
    );
    // Each `alertname:` line is followed by its `exp_alerts:`: `[]` is a silent case.
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    for alert in ALERTS {
        let cases: Vec<bool> = lines
            .windows(2)
            .filter(|pair| pair[0] == format!("alertname: {alert}"))
            .map(|pair| pair[1] == "exp_alerts: []")
            .collect();
        assert!(
            cases.iter().any(|silent| !silent),
            "{alert} has no firing test"
        );
        assert!(
            cases.iter().any(|silent| *silent),
            "{alert} has no silent test"
        );
    }
}
