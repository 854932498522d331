//! The gateway binary as an operator starts it: a secret left on its public development
//! value stops it, naming the variable, unless the development switch is set; a misspelt
//! variable stops it, naming the setting it was probably meant for.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use seckill_testkit::process::{
    assert_misspelt_variable_stops, free_port, run_to_exit, service_command, wait_healthy,
};
use seckill_testkit::{INTERNAL_KEY, JWT_SECRET};
use tokio::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_gateway");

/// The gateway on a free loopback port, with no secret set: both are the public defaults.
fn gateway(port: u16) -> Command {
    let mut command = service_command(BINARY);
    command
        .env("SECKILL_GATEWAY_HOST", "127.0.0.1")
        .env("SECKILL_GATEWAY_PORT", port.to_string())
        .env("SECKILL_GATEWAY_WORKERS", "1");
    command
}

async fn refusal(command: &mut Command) -> String {
    let output = run_to_exit(command, Duration::from_secs(30)).await;
    assert!(!output.status.success(), "started on a public secret");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn the_public_jwt_secret_stops_the_gateway_naming_the_variable() {
    let stderr = refusal(gateway(free_port()).env("SECKILL_INTERNAL_KEY", INTERNAL_KEY)).await;
    assert!(
        stderr.contains("SECKILL_JWT_SECRET is the public development default"),
        "{stderr}"
    );
    assert!(
        stderr.contains("SECKILL_ALLOW_DEV_SECRETS=true"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_public_internal_key_stops_the_gateway_naming_the_variable() {
    let stderr = refusal(gateway(free_port()).env("SECKILL_JWT_SECRET", JWT_SECRET)).await;
    assert!(
        stderr.contains("SECKILL_INTERNAL_KEY is the public development default"),
        "{stderr}"
    );
    assert!(!stderr.contains("SECKILL_JWT_SECRET"), "{stderr}");
}

#[tokio::test]
async fn the_development_switch_lets_the_gateway_start_on_public_secrets() {
    let port = free_port();
    let mut child = gateway(port)
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .spawn()
        .expect("start the gateway");
    wait_healthy(&mut child, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await;
    child.kill().await.expect("stop the gateway");
}

#[tokio::test]
async fn a_misspelt_variable_stops_the_gateway_naming_the_closest_setting() {
    assert_misspelt_variable_stops(
        &mut gateway(free_port()),
        "SECKILL_GATEWAY_RATE_PURCHASE_BRUST",
        "SECKILL_GATEWAY_RATE_PURCHASE_BURST",
    )
    .await;
}
