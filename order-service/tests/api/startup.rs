//! The order-service binary as an operator starts it: the public identity key stops it unless
//! the development switch is set, and by default it listens on loopback only (the gateway is
//! the public face; a backend believes any caller holding the identity key); a misspelt
//! variable stops it, naming the setting it was probably meant for.

use seckill_testkit::process::{
    assert_backend_listens_on_loopback_only, assert_each_public_secret_stops_backend,
    assert_misspelt_variable_stops, backend_command,
};

const BINARY: &str = env!("CARGO_BIN_EXE_order-service");
const PORT_VARIABLE: &str = "SECKILL_ORDER_PORT";

#[tokio::test]
async fn each_public_secret_stops_order_service_naming_the_variable() {
    assert_each_public_secret_stops_backend(BINARY, PORT_VARIABLE).await;
}

#[tokio::test]
async fn with_the_switch_order_service_starts_and_listens_on_loopback_only() {
    assert_backend_listens_on_loopback_only(BINARY, PORT_VARIABLE).await;
}

#[tokio::test]
async fn a_misspelt_variable_stops_order_service_naming_the_closest_setting() {
    let ns = seckill_testkit::TestNamespace::new();
    assert_misspelt_variable_stops(
        &mut backend_command(BINARY, PORT_VARIABLE, seckill_testkit::free_port(), &ns),
        "SECKILL_ORDER_BATCH_LINGR_MS",
        "SECKILL_ORDER_BATCH_LINGER_MS",
    )
    .await;
}

/// A first start on a broker that has never seen the namespace is quiet: the queue watch
/// must not ask for queues before they are declared (each such ask closes a channel with
/// `NOT_FOUND`, which lapin logs as an error).
#[tokio::test]
async fn a_first_start_on_a_fresh_broker_logs_no_error() {
    let ns = seckill_testkit::TestNamespace::new();
    let port = seckill_testkit::free_port();
    let address = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let mut child = seckill_testkit::process::backend_command(BINARY, PORT_VARIABLE, port, &ns)
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        // The watch polls as often as it may, so its first polls race the consumer's declare.
        .env("SECKILL_ORDER_QUEUE_WATCH_MS", "10")
        .spawn()
        .expect("start order-service");
    seckill_testkit::process::wait_healthy(&mut child, address).await;
    // Up once the watch has read the main queue: its gauge is on /metrics.
    let metrics = format!("http://{address}/metrics");
    let queue = format!("queue=\"{}\"", ns.topology().queue);
    seckill_testkit::eventually(
        "the queue watch read the main queue",
        std::time::Duration::from_secs(30),
        || async {
            let text = reqwest::get(&metrics).await.ok()?.text().await.ok()?;
            text.lines()
                .any(|l| l.starts_with("amqp_queue_messages") && l.contains(&queue))
                .then_some(())
        },
    )
    .await;
    child.kill().await.expect("stop order-service");
    let output = child.wait_with_output().await.expect("its output");
    let log = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(
        errors.is_empty(),
        "a first start logged errors:\n{}",
        errors.join("\n")
    );
    ns.cleanup().await;
}
