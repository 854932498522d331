//! The fault matrix's command line against its documentation: every scenario
//! `seckill-chaos --list` offers has its row in `docs/testing.md`'s table, and every row
//! names a scenario it offers. (Being an integration test, it also has cargo build
//! `seckill-chaos` with the rest of the suite, so `scripts/test.sh` runs the fast scenarios
//! on binaries the test build made.)

use std::collections::BTreeSet;
use std::process::Command;

/// The scenarios `seckill-chaos --list` prints, one a line (`name` or `name  (fast)`).
fn listed() -> BTreeSet<String> {
    let output = Command::new(env!("CARGO_BIN_EXE_seckill-chaos"))
        .arg("--list")
        .output()
        .expect("run seckill-chaos --list");
    assert!(
        output.status.success(),
        "seckill-chaos --list failed: {output:?}"
    );
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The scenario names in the first column of docs/testing.md's scenario table.
fn documented() -> BTreeSet<String> {
    let doc = include_str!("../../docs/testing.md");
    let table = doc
        .split_once("| scenario | fault, injected mid-burst |")
        .expect("docs/testing.md has the scenario table")
        .1;
    table
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .flat_map(|line| {
            let first = line.split('|').nth(1).unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn every_scenario_on_the_command_line_is_documented_and_nothing_else() {
    let listed = listed();
    let documented = documented();
    assert!(listed.len() >= 10, "too few scenarios listed: {listed:?}");
    assert_eq!(
        listed, documented,
        "`seckill-chaos --list` (left) and docs/testing.md's table (right) disagree"
    );
}
