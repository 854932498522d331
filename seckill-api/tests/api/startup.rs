//! The seckill-api binary as an operator starts it: the public identity key stops it unless
//! the development switch is set, and by default it listens on loopback only (the gateway is
//! the public face; a backend believes any caller holding the identity key).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use seckill_testkit::TestNamespace;
use seckill_testkit::process::{
    backend_command, free_port, http_status, non_loopback_ipv4, run_to_exit, wait_healthy,
};

const BINARY: &str = env!("CARGO_BIN_EXE_seckill-api");
const PORT_VARIABLE: &str = "SECKILL_API_PORT";

#[tokio::test]
async fn each_public_secret_stops_seckill_api_naming_the_variable() {
    // One secret on its public default at a time, the other private: each is named alone.
    for (public, private) in [
        ("SECKILL_INTERNAL_KEY", "SECKILL_ORDER_SIGNING_KEY"),
        ("SECKILL_ORDER_SIGNING_KEY", "SECKILL_INTERNAL_KEY"),
    ] {
        let ns = TestNamespace::new();
        let output = run_to_exit(
            backend_command(BINARY, PORT_VARIABLE, free_port(), &ns)
                .env(private, "a-secret-of-the-operators-own"),
            Duration::from_secs(30),
        )
        .await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "started on a public {public}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("{public} is the public development default")),
            "{stderr}"
        );
        assert!(!stderr.contains(private), "{stderr}");
        assert!(
            stderr.contains("SECKILL_ALLOW_DEV_SECRETS=true"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn with_the_switch_seckill_api_starts_and_listens_on_loopback_only() {
    let ns = TestNamespace::new();
    let port = free_port();
    let mut child = backend_command(BINARY, PORT_VARIABLE, port, &ns)
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .spawn()
        .expect("start seckill-api");
    wait_healthy(&mut child, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await;

    let Some(public_ip) = non_loopback_ipv4() else {
        eprintln!("no non-loopback IPv4 address on this host: only loopback was checked");
        return;
    };
    let public = SocketAddr::from((IpAddr::V4(public_ip), port));
    assert_eq!(
        http_status(public, "/healthz").await,
        None,
        "seckill-api answered on {public}"
    );

    // The probe does see a listener there: one bound as compose binds it (0.0.0.0) answers.
    let open_port = free_port();
    let mut open = backend_command(BINARY, PORT_VARIABLE, open_port, &ns)
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .env("SECKILL_HOST", "0.0.0.0")
        .spawn()
        .expect("start seckill-api on every interface");
    wait_healthy(&mut open, SocketAddr::from((public_ip, open_port))).await;
    child.kill().await.expect("stop seckill-api");
    open.kill().await.expect("stop seckill-api");
    ns.cleanup().await;
}
