//! The seckill-api binary as an operator starts it: the public identity key stops it unless
//! the development switch is set, and by default it listens on loopback only (the gateway is
//! the public face; a backend believes any caller holding the identity key); a misspelt
//! variable stops it, naming the setting it was probably meant for.

use seckill_testkit::process::{
    assert_backend_listens_on_loopback_only, assert_each_public_secret_stops_backend,
    assert_misspelt_variable_stops, backend_command,
};

const BINARY: &str = env!("CARGO_BIN_EXE_seckill-api");
const PORT_VARIABLE: &str = "SECKILL_API_PORT";

#[tokio::test]
async fn each_public_secret_stops_seckill_api_naming_the_variable() {
    assert_each_public_secret_stops_backend(BINARY, PORT_VARIABLE).await;
}

#[tokio::test]
async fn with_the_switch_seckill_api_starts_and_listens_on_loopback_only() {
    assert_backend_listens_on_loopback_only(BINARY, PORT_VARIABLE).await;
}

#[tokio::test]
async fn a_misspelt_variable_stops_seckill_api_naming_the_closest_setting() {
    let ns = seckill_testkit::TestNamespace::new();
    assert_misspelt_variable_stops(
        &mut backend_command(BINARY, PORT_VARIABLE, seckill_testkit::free_port(), &ns),
        "SECKILL_API_STOCK_BUCKET",
        "SECKILL_API_STOCK_BUCKETS",
    )
    .await;
}
