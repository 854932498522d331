//! The seckill-api binary as an operator starts it: the public identity key stops it unless
//! the development switch is set, and by default it listens on loopback only (the gateway is
//! the public face; a backend believes any caller holding the identity key).

use seckill_testkit::process::{
    assert_backend_listens_on_loopback_only, assert_each_public_secret_stops_backend,
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
