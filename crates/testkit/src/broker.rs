//! A private RabbitMQ node for tests that stop and restart the broker.
//!
//! The shared broker on 5672 serves every test running at the same time, so it must never
//! be stopped. A test that needs an outage starts an [`OwnBroker`] instead: its own node
//! (name, AMQP port, distribution port, data dir, Erlang cookie), started from the installed
//! RabbitMQ with `rabbitmq-server -detached`, running as the test's own user.
//!
//! Linux only (it watches the node through `/proc`). It needs RabbitMQ installed
//! (`scripts/infra.sh` does that); `SECKILL_TEST_RABBITMQ_SERVER` names another
//! `rabbitmq-server` script. A node outlives a test process killed before its `Drop` ran;
//! the next [`OwnBroker::start`] kills such orphans and deletes their dirs.

use std::fs;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lapin::{Connection, ConnectionProperties};

use crate::orphans::{self, signal};
use crate::ports::{free_port, free_ports};

/// How long a node may take to come up or go down before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);
/// Names of nodes and dirs start with these; the orphan sweep matches on them.
const NODE_PREFIX: &str = "seckill-test-";
const DIR_PREFIX: &str = "seckill-broker-";
/// The Debian/Ubuntu package's `/usr/sbin/rabbitmq-server` is a wrapper that switches to the
/// `rabbitmq` user (and refuses any user but root and rabbitmq); the script it wraps runs the
/// node as whoever calls it, which is what a test wants: no chown, no sudo.
const DEBIAN_SERVER_SCRIPT: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// A RabbitMQ node of this test alone, on free loopback ports with its own data dir.
///
/// Dropping it kills the node and deletes the dir.
#[derive(Debug)]
pub struct OwnBroker {
    /// `seckill-test-<pid>-<n>@localhost`.
    node_name: String,
    dir: PathBuf,
    amqp_port: u16,
    dist_port: u16,
    /// The management API's port, when the node runs the management plugin.
    management_port: Option<u16>,
    /// The OS pid of the running node, `None` while stopped. Kept here because RabbitMQ
    /// deletes its pid file as it shuts down, before the process has exited.
    pid: Mutex<Option<u32>>,
}

impl OwnBroker {
    /// Starts a fresh RabbitMQ node on free loopback ports with its own data dir; waits until
    /// AMQP accepts guest/guest. Panics (with the node's log tail) if it is not ready in 60 s.
    pub async fn start() -> OwnBroker {
        Self::start_node(false, None).await
    }

    /// Like [`OwnBroker::start`], with the management plugin listening on a free loopback
    /// port of its own ([`OwnBroker::management_url`]): for a service that reads queue
    /// figures from the management API.
    pub async fn start_with_management() -> OwnBroker {
        Self::start_node(true, None).await
    }

    /// A node as above; with `cookie`, the Erlang cookie it shares with the other nodes of a
    /// cluster (else Erlang makes one up on first start).
    pub(crate) async fn start_node(management: bool, cookie: Option<&str>) -> OwnBroker {
        sweep_orphans();
        let id = format!(
            "{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        );
        let dir = std::env::temp_dir().join(format!("{DIR_PREFIX}{id}"));
        // A dir of that name can only be left over from an earlier process with our pid.
        let _ = fs::remove_dir_all(&dir);
        for sub in ["mnesia", "log"] {
            fs::create_dir_all(dir.join(sub))
                .unwrap_or_else(|e| panic!("create {}: {e}", dir.join(sub).display()));
        }
        let [amqp_port, dist_port] = free_ports();
        // Our own config and env files, so the machine's (/etc/rabbitmq: listeners on 5672,
        // NODENAME=rabbit@localhost) cannot leak into this node. `[].` rather than an empty
        // plugins file: an empty one is not a valid Erlang term. The management plugin, when
        // wanted, listens on a port of ours, never the shared broker's 15672.
        let management_port = management.then(free_port);
        match management_port {
            Some(port) => {
                write(&dir.join("enabled_plugins"), "[rabbitmq_management].\n");
                write(
                    &dir.join("rabbitmq.conf"),
                    // Queue figures every 500 ms instead of 5 s: whoever waits for queues to
                    // drain waits less.
                    &format!(
                        "management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = {port}\n\
                         collect_statistics_interval = 500\n"
                    ),
                );
            }
            None => {
                write(&dir.join("enabled_plugins"), "[].\n");
                write(&dir.join("rabbitmq.conf"), "");
            }
        }
        write(&dir.join("rabbitmq-env.conf"), "");
        if let Some(cookie) = cookie {
            // $HOME/.erlang.cookie (HOME is our dir); Erlang refuses one others can read.
            use std::os::unix::fs::PermissionsExt;
            let path = dir.join(".erlang.cookie");
            write(&path, cookie);
            fs::set_permissions(&path, fs::Permissions::from_mode(0o400))
                .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
        }
        let broker = OwnBroker {
            node_name: format!("{NODE_PREFIX}{id}@localhost"),
            dir,
            amqp_port,
            dist_port,
            management_port,
            pid: Mutex::new(None),
        };
        // `broker` exists before the node does, so a panic below still runs Drop.
        broker.launch();
        broker.wait_ready("start").await;
        broker
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn amqp_url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// `http://guest:guest@127.0.0.1:<port>` of the management API, if the node runs it.
    pub fn management_url(&self) -> Option<String> {
        self.management_port
            .map(|port| format!("http://guest:guest@127.0.0.1:{port}"))
    }

    /// Stops the node gracefully (data kept) and waits until its process has exited and its
    /// AMQP port refuses connections. Does nothing when it is already stopped.
    ///
    /// SIGTERM rather than `rabbitmqctl stop`: the same graceful shutdown (RabbitMQ traps
    /// the signal), without the ~2 s the CLI needs to boot its own Erlang VM.
    pub async fn stop(&self) {
        let Some(pid) = self.running_pid() else {
            *self.pid.lock().expect("pid lock") = None;
            return;
        };
        signal(pid, "TERM");
        let deadline = Instant::now() + PATIENCE;
        while node_alive(pid, &self.node_name) {
            if Instant::now() >= deadline {
                panic!(
                    "{} (pid {pid}) still running {}s after SIGTERM\n{}",
                    self.node_name,
                    PATIENCE.as_secs(),
                    self.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        *self.pid.lock().expect("pid lock") = None;
        loop {
            match tokio::net::TcpStream::connect(self.amqp_addr()).await {
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => return,
                _ if Instant::now() >= deadline => panic!(
                    "{} exited, but 127.0.0.1:{} still does not refuse connections",
                    self.node_name, self.amqp_port
                ),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Starts the node again on the same ports and data dir (stopping it first if it runs)
    /// and waits until AMQP accepts guest/guest. Durable queues and persistent messages are
    /// back; anything else is gone.
    pub async fn restart(&self) {
        self.stop().await;
        self.launch();
        self.wait_ready("restart").await;
    }

    /// Raises a memory alarm (watermark 0): the node stops reading from publishing
    /// connections, so publishes hang unconfirmed. Consumers are not affected.
    pub async fn block_publishers(&self) {
        self.ctl(&["set_vm_memory_high_watermark", "0"]).await;
    }

    /// Clears the alarm of [`OwnBroker::block_publishers`].
    pub async fn unblock_publishers(&self) {
        self.ctl(&["set_vm_memory_high_watermark", "0.4"]).await;
    }

    /// Runs `rabbitmqctl -n <node> <args>` against this node, panicking if it fails.
    pub async fn ctl(&self, args: &[&str]) {
        self.cli("rabbitmqctl", args).await;
    }

    /// The node's name, `seckill-test-<pid>-<n>@localhost`.
    pub fn node_name(&self) -> &str {
        &self.node_name
    }

    /// Kills the node with SIGKILL (no orderly shutdown) and waits until its process is
    /// gone; [`OwnBroker::restart`] brings it back with its data.
    pub async fn kill(&self) {
        if let Some(pid) = self.running_pid() {
            signal(pid, "KILL");
            let deadline = Instant::now() + PATIENCE;
            while node_alive(pid, &self.node_name) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        *self.pid.lock().expect("pid lock") = None;
    }

    /// Waits until the node (started again by a cluster join) accepts AMQP logins.
    pub(crate) async fn wait_accepting(&self) {
        self.wait_ready("join").await;
    }

    /// Runs one of RabbitMQ's CLI tools (`rabbitmqctl`, `rabbitmq-queues`, …) with
    /// `-n <node> <args>` against this node and returns what it printed, panicking if it
    /// fails.
    pub(crate) async fn cli(&self, tool: &str, args: &[&str]) -> String {
        // Bounded: a command that never returns (an `add_member` once hung for ten minutes
        // on a loaded machine) fails the caller instead of stalling it for good.
        let running = tokio::process::Command::new(cli_script(tool))
            .arg("-n")
            .arg(&self.node_name)
            .args(args)
            .envs(self.env())
            .current_dir(&self.dir)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(CLI_TIMEOUT, running)
            .await
            .unwrap_or_else(|_| panic!("{tool} {args:?} did not finish within {CLI_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"));
        assert!(
            output.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn amqp_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.amqp_port))
    }

    /// Environment of the node's scripts: every path under our dir, every port ours.
    fn env(&self) -> Vec<(&'static str, String)> {
        let path = |name: &str| self.dir.join(name).display().to_string();
        vec![
            // Erlang reads (and on first start creates) the cookie at $HOME/.erlang.cookie;
            // a home of our own keeps the user's real home untouched.
            ("HOME", path("")),
            ("RABBITMQ_NODENAME", self.node_name.clone()),
            ("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1".into()),
            ("RABBITMQ_NODE_PORT", self.amqp_port.to_string()),
            ("RABBITMQ_DIST_PORT", self.dist_port.to_string()),
            ("RABBITMQ_MNESIA_BASE", path("mnesia")),
            ("RABBITMQ_LOG_BASE", path("log")),
            ("RABBITMQ_PID_FILE", path("node.pid")),
            ("RABBITMQ_ENABLED_PLUGINS_FILE", path("enabled_plugins")),
            ("RABBITMQ_CONFIG_FILE", path("rabbitmq.conf")),
            ("RABBITMQ_ADVANCED_CONFIG_FILE", path("advanced.config")),
            ("RABBITMQ_CONF_ENV_FILE", path("rabbitmq-env.conf")),
            // Erlang distribution listens on every interface unless told otherwise; and if
            // no epmd runs yet, the one erl starts should be loopback-only too.
            (
                "ERL_FLAGS",
                "-kernel inet_dist_use_interface {127,0,0,1}".into(),
            ),
            ("ERL_EPMD_ADDRESS", "127.0.0.1".into()),
        ]
    }

    /// Runs `rabbitmq-server -detached`, which returns once erl has forked the node off
    /// (tens of milliseconds), so blocking the runtime for it is harmless.
    fn launch(&self) {
        let out = fs::File::create(self.dir.join("start.out")).expect("create start.out");
        let err = out.try_clone().expect("clone start.out");
        let status = Command::new(server_script())
            .arg("-detached")
            .envs(self.env())
            // erl writes erl_crash.dump to its working directory.
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {} (is RabbitMQ installed? scripts/infra.sh installs it): {e}",
                    server_script().display()
                )
            });
        assert!(
            status.success(),
            "rabbitmq-server -detached failed ({status}) for {}\n{}",
            self.node_name,
            self.diagnostics()
        );
    }

    /// Waits until an AMQP login works, failing fast if the node process dies on the way.
    async fn wait_ready(&self, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        let url = self.amqp_url();
        loop {
            let pid = self.running_pid();
            if let Some(pid) = pid {
                *self.pid.lock().expect("pid lock") = Some(pid);
            } else if self.pid.lock().expect("pid lock").is_some() {
                panic!(
                    "{what}: {} exited while starting\n{}",
                    self.node_name,
                    self.diagnostics()
                );
            }
            // A login proves more than an open port: the listener opens before the vhost
            // and the default user are ready.
            let attempt = tokio::time::timeout(
                Duration::from_secs(5),
                Connection::connect(&url, ConnectionProperties::default()),
            )
            .await;
            if let Ok(Ok(connection)) = attempt {
                let _ = connection.close(200, "ready".into()).await;
                if pid.is_some() {
                    return;
                }
            }
            if Instant::now() >= deadline {
                panic!(
                    "{what}: {} not accepting AMQP logins on 127.0.0.1:{} after {}s (node pid: {pid:?})\n{}",
                    self.node_name,
                    self.amqp_port,
                    PATIENCE.as_secs(),
                    self.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The pid of our node if it runs: the one we recorded, else the one in its pid file.
    fn running_pid(&self) -> Option<u32> {
        let known = *self.pid.lock().expect("pid lock");
        known
            .into_iter()
            .chain(read_pid(&self.dir.join("node.pid")))
            .find(|&pid| node_alive(pid, &self.node_name))
    }

    /// The script's output and the tail of the node's log, for panic messages.
    fn diagnostics(&self) -> String {
        let start_out = fs::read_to_string(self.dir.join("start.out")).unwrap_or_default();
        let log_path = self.dir.join("log").join(format!("{}.log", self.node_name));
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        let crash_dump = self.dir.join("erl_crash.dump");
        let crash = if crash_dump.exists() {
            format!("\nErlang crash dump: {}", crash_dump.display())
        } else {
            String::new()
        };
        format!(
            "--- rabbitmq-server output ---\n{}\n--- last lines of {} ---\n{tail}{crash}",
            start_out.trim_end(),
            log_path.display()
        )
    }
}

impl Drop for OwnBroker {
    /// Kills the node and deletes its dir, best effort. SIGKILL rather than a graceful stop:
    /// the data is deleted right after, so the ~2 s of an orderly shutdown buy nothing.
    fn drop(&mut self) {
        if let Some(pid) = self.running_pid() {
            signal(pid, "KILL");
            let deadline = Instant::now() + Duration::from_secs(5);
            while node_alive(pid, &self.node_name) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn server_script() -> PathBuf {
    if let Some(path) = std::env::var_os("SECKILL_TEST_RABBITMQ_SERVER") {
        return path.into();
    }
    if Path::new(DEBIAN_SERVER_SCRIPT).exists() {
        return DEBIAN_SERVER_SCRIPT.into();
    }
    "rabbitmq-server".into()
}

/// The longest a RabbitMQ command-line tool may run.
const CLI_TIMEOUT: Duration = Duration::from_secs(120);

/// A CLI tool (`rabbitmqctl`, …) next to the server script we run (the Debian wrappers in
/// /usr/sbin would switch users and lose our `HOME`, hence the node's cookie).
fn cli_script(tool: &str) -> PathBuf {
    let server = server_script();
    match server.parent() {
        Some(dir) if dir.join(tool).exists() => dir.join(tool),
        _ => tool.into(),
    }
}

fn write(path: &Path, contents: &str) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn read_pid(path: &Path) -> Option<u32> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// True while `pid` is a live process started as node `node_name`: its environment names
/// the node, which also rules out a pid the kernel has since given to someone else (and a
/// zombie, whose environment reads empty).
fn node_alive(pid: u32, node_name: &str) -> bool {
    let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let wanted = format!("RABBITMQ_NODENAME={node_name}");
    environ
        .split(|&b| b == 0)
        .any(|entry| entry == wanted.as_bytes())
}

/// Kills the nodes of test processes that died before their `OwnBroker` was dropped and
/// deletes their dirs.
fn sweep_orphans() {
    for (entry, id) in orphans::orphaned(&[std::env::temp_dir()], DIR_PREFIX) {
        let node_name = format!("{NODE_PREFIX}{id}@localhost");
        if let Some(pid) = read_pid(&entry.path().join("node.pid"))
            && node_alive(pid, &node_name)
        {
            signal(pid, "KILL");
        }
        let _ = fs::remove_dir_all(entry.path());
    }
}
