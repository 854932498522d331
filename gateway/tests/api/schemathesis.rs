//! schemathesis (`st`, v4) fuzzes the live platform through the gateway from the document the
//! gateway serves: every answer must be in the contract (status, content type, headers,
//! body schema), none may be a 5xx, and data the schema forbids must be refused with a 4xx.
//!
//! Checks: `all` but
//! - `positive_data_acceptance`: a request the schema allows may still be refused by the
//!   business (a product that does not exist, a second purchase, a sale not open): those
//!   answers are documented 4xx, not bugs;
//! - `use_after_free`, `ensure_resource_availability`: stateful checks that follow links
//!   between operations; the document has none (and the stateful phase is not run);
//! - `unsupported_method`, `allow_header_conformance`: methods the document does not name
//!   reach the backends' routers, whose plain 405 is not part of the JSON contract.
//!
//! Users: business operations with a buyer's token, `/admin/…` with an admin's (a per-path
//! header in the config file). The rate limits are off: 429 is in the contract, but a run
//! turned into 429s would test nothing else.

use std::time::Duration;

use seckill_testkit::eventually;
use serde_json::Value;

use crate::helpers::{admin_token, spawn_platform_with_gateway, user_token};

/// Test cases per operation and phase: enough to reach every documented answer of the
/// small schemas here, few enough that the run takes well under a minute.
const MAX_EXAMPLES: u32 = 25;

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_server_error_and_no_answer_outside_the_contract() {
    let platform = spawn_platform_with_gateway(|settings| {
        settings.rate_limit_enabled = false;
    })
    .await;
    // Something to buy (id 1, the smallest id the schema allows, which the coverage phase
    // tries), one not on sale yet and one sold out; and an order of the fuzzing buyer.
    let on_sale = platform.create_product(1_000, -60).await;
    platform.create_product(10, 3600).await;
    platform.create_product(0, -60).await;
    let buyer_id = 4242;
    let buyer = user_token(buyer_id);
    assert_eq!(platform.buy(on_sale, &buyer).await.status(), 202);
    eventually("the buyer's order", Duration::from_secs(30), || async {
        let body: Value = platform
            .get(&format!("/api/seckill/{on_sale}/result"), &buyer)
            .await
            .json()
            .await
            .ok()?;
        (body["status"] == "success").then_some(())
    })
    .await;

    let dir = std::env::temp_dir().join(format!("seckill-st-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("work directory");
    let config = dir.join("schemathesis.toml");
    std::fs::write(
        &config,
        format!(
            "headers = {{ Authorization = \"Bearer {buyer}\" }}\n\n\
             [[operations]]\n\
             include-path-regex = \"^/admin/\"\n\
             headers = {{ Authorization = \"Bearer {admin}\" }}\n",
            admin = admin_token(),
        ),
    )
    .expect("write the schemathesis config");
    let seed = std::env::var("SECKILL_SCHEMATHESIS_SEED").unwrap_or_else(|_| "1".into());
    let mut command = tokio::process::Command::new("st");
    command
        .arg("--no-color")
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{}/openapi.json", platform.gateway))
        .args(["--checks", "all"])
        .args([
            "--exclude-checks",
            "positive_data_acceptance,use_after_free,ensure_resource_availability,\
             unsupported_method,allow_header_conformance",
        ])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", &MAX_EXAMPLES.to_string()])
        .args(["--seed", &seed])
        .args(["--workers", "2"])
        .args(["--request-timeout", "10"])
        .arg("--report")
        .arg("junit")
        .arg("--report-dir")
        .arg(&dir)
        .current_dir(&dir)
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(240), command.output())
        .await
        .expect("schemathesis finished within 4 minutes")
        .expect("st runs (scripts/tools.sh installs schemathesis)");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    let figures = Figures::read(&stdout);
    println!("{stdout}");
    println!(
        "schemathesis: {} operations, {} test cases, {} failures (seed {seed})",
        figures.tested, figures.cases, figures.failures
    );
    assert!(
        output.status.success(),
        "schemathesis found problems (exit {:?}); reproduce with SECKILL_SCHEMATHESIS_SEED={seed}\n\
         {stdout}\n{stderr}",
        output.status.code()
    );
    assert!(
        figures.selected >= 20 && figures.tested == figures.selected,
        "every documented operation was tested: {} of {}",
        figures.tested,
        figures.selected
    );
    assert!(figures.cases > 0 && figures.failures == 0);
    platform.shutdown().await;
}

/// What a run did, from its summary (`Selected: 20/20`, `Tested: 20`, `1155 generated,
/// 1155 passed`).
struct Figures {
    /// Operations selected.
    selected: u64,
    /// Operations tested.
    tested: u64,
    /// Test cases generated.
    cases: u64,
    /// Test cases that failed.
    failures: u64,
}

impl Figures {
    fn read(summary: &str) -> Self {
        let number = |text: &str| -> u64 {
            let digits: String = text
                .trim()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().unwrap_or(0)
        };
        let after = |label: &str| {
            summary
                .lines()
                .find_map(|line| line.trim().strip_prefix(label).map(number))
                .unwrap_or(0)
        };
        let cases_line = summary
            .lines()
            .find(|line| number(line) > 0 && line.contains(" generated,"))
            .unwrap_or("");
        let failures = cases_line
            .split(',')
            .find(|part| part.contains("failed"))
            .map_or(0, number);
        Self {
            selected: after("Selected:"),
            tested: after("Tested:"),
            cases: number(cases_line),
            failures,
        }
    }
}
