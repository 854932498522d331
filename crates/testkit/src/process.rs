//! Support for tests that start a service's binary as a real process: what an operator's
//! start-up looks like (the refusal of public secrets, the default bind address) is only
//! visible there, not in a service built in-process.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::TestNamespace;
pub use crate::ports::free_port;

/// A command for `binary` that inherits none of the caller's `SECKILL_*` settings (a shell
/// that sourced `scripts/lib.sh` exports secrets), with stdin closed and output captured.
pub fn service_command(binary: &str) -> Command {
    let mut command = Command::new(binary);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("SECKILL_") {
            command.env_remove(name);
        }
    }
    command
        .env_remove("RUST_LOG")
        .env("SECKILL_LOG_FILTER", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// A backend's binary (seckill-api or order-service) on `port` (set through
/// `port_variable`) in `ns`, bound and keyed by its defaults: loopback, the public identity
/// key.
pub fn backend_command(
    binary: &str,
    port_variable: &str,
    port: u16,
    ns: &TestNamespace,
) -> Command {
    let mut command = service_command(binary);
    command
        .env(port_variable, port.to_string())
        .env("SECKILL_DATABASE_URL", &ns.database_url)
        .env("SECKILL_REDIS_URL", &ns.redis_url)
        .env("SECKILL_REDIS_CLUSTER", ns.redis_cluster.to_string())
        .env("SECKILL_AMQP_URL", &ns.amqp_url)
        .env("SECKILL_NAMESPACE", &ns.namespace);
    command
}

/// Waits until `child` answers `/healthz` with 200 at `address`, failing the test if it
/// exits first or takes over 60 s (a backend runs its migrations before it listens).
pub async fn wait_healthy(child: &mut Child, address: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr).await;
            }
            panic!("the process exited with {status}: {stderr}");
        }
        if http_status(address, "/healthz").await == Some(200) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no 200 from {address}/healthz after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs `command` to its end, failing the test if it is still running after `limit` (it was
/// expected to stop by itself).
pub async fn run_to_exit(command: &mut Command, limit: Duration) -> Output {
    let child = command.spawn().expect("start the service binary");
    tokio::time::timeout(limit, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the process still ran after {limit:?}: it did not refuse"))
        .expect("wait for the process")
}

/// An IPv4 address of this host other than loopback, if it has one: the source address the
/// kernel picks towards a documentation address (a UDP connect sends nothing), else the
/// first of `hostname -I`.
pub fn non_loopback_ipv4() -> Option<Ipv4Addr> {
    let routed = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
        .and_then(|socket| {
            socket.connect((Ipv4Addr::new(198, 51, 100, 1), 9))?;
            socket.local_addr()
        })
        .ok()
        .and_then(|address| match address.ip() {
            IpAddr::V4(ip) if !ip.is_loopback() && !ip.is_unspecified() => Some(ip),
            _ => None,
        });
    routed.or_else(|| {
        let output = std::process::Command::new("hostname")
            .arg("-I")
            .output()
            .ok()?;
        String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .filter_map(|word| word.parse::<Ipv4Addr>().ok())
            .find(|ip| !ip.is_loopback())
    })
}

/// The status code of `GET path` on `address`, or `None` when nothing answers there.
pub async fn http_status(address: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(address))
        .await
        .ok()?
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut head))
        .await
        .ok()?
        .ok()?;
    // "HTTP/1.1 200"
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Asserts that the backend `binary` (its port set through `port_variable`) refuses to start
/// while one of its secrets is on its public default, naming that one alone and the switch.
pub async fn assert_each_public_secret_stops_backend(binary: &str, port_variable: &str) {
    // One secret on its public default at a time, the other private: each is named alone.
    for (public, private) in [
        ("SECKILL_INTERNAL_KEY", "SECKILL_ORDER_SIGNING_KEY"),
        ("SECKILL_ORDER_SIGNING_KEY", "SECKILL_INTERNAL_KEY"),
    ] {
        let ns = TestNamespace::new();
        let output = run_to_exit(
            backend_command(binary, port_variable, free_port(), &ns)
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

/// Asserts that the backend `binary`, started with the development switch and its default
/// bind address, answers on loopback and not on this host's other address; and, as a
/// control of the probe, that a copy bound as compose binds it (`0.0.0.0`) answers there.
pub async fn assert_backend_listens_on_loopback_only(binary: &str, port_variable: &str) {
    let ns = TestNamespace::new();
    let port = free_port();
    let mut child = backend_command(binary, port_variable, port, &ns)
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .spawn()
        .expect("start the backend");
    wait_healthy(&mut child, SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await;

    let Some(public_ip) = non_loopback_ipv4() else {
        eprintln!("no non-loopback IPv4 address on this host: only loopback was checked");
        return;
    };
    let public = SocketAddr::from((IpAddr::V4(public_ip), port));
    assert_eq!(
        http_status(public, "/healthz").await,
        None,
        "{binary} answered on {public}"
    );

    let open_port = free_port();
    let mut open = backend_command(binary, port_variable, open_port, &ns)
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .env("SECKILL_HOST", "0.0.0.0")
        .spawn()
        .expect("start the backend on every interface");
    wait_healthy(&mut open, SocketAddr::from((public_ip, open_port))).await;
    // Both still run: the answers came from them, not from whoever else held a port they
    // lost (a backend binds only after its migrations, and exits when the bind fails).
    for process in [&mut child, &mut open] {
        let status = process.try_wait().expect("poll the backend");
        assert!(status.is_none(), "{binary} exited: {status:?}");
    }
    child.kill().await.expect("stop the backend");
    open.kill().await.expect("stop the backend");
    ns.cleanup().await;
}

/// Asserts that `command` (a service, its secrets allowed and every other variable known)
/// refuses to start once `misspelt` is set, naming it and `meant`, the setting it was
/// probably meant for.
pub async fn assert_misspelt_variable_stops(command: &mut Command, misspelt: &str, meant: &str) {
    command
        // Nothing else stops it: the public secrets are allowed.
        .env("SECKILL_ALLOW_DEV_SECRETS", "true")
        .env(misspelt, "5");
    let output = run_to_exit(command, Duration::from_secs(30)).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "started with the misspelt {misspelt}: {stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "unknown setting {misspelt}; did you mean {meant}?"
        )),
        "{stderr}"
    );
}
