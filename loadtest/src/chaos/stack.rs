//! What the fault matrix runs against: its own stores and the three services as processes.
//!
//! The stores ([`Stores`]) are private instances on spare loopback ports (a Redis with an
//! append-only file, a RabbitMQ node with its management API, a PostgreSQL cluster), started
//! once per run and never the machine's shared ones, so a scenario may kill, stop or wipe
//! them. Each scenario gets its own namespace and database on them, and its own
//! [`Services`]: the release binaries, one process per replica, which a scenario may kill
//! with SIGKILL and start again on the same port.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use seckill_testkit::{OwnBroker, OwnPostgres, OwnRedis, Persistence, free_port};

/// How long a service may take to answer `/readyz` after it was (re)started.
const READY_PATIENCE: Duration = Duration::from_secs(60);

/// The run's private stores.
pub struct Stores {
    /// Orders, products, dead letters.
    pub postgres: OwnPostgres,
    /// The stock ledger, markers, outbox streams; AOF fsynced every second.
    pub redis: OwnRedis,
    /// The order queues (its management API feeds the books).
    pub broker: OwnBroker,
}

impl Stores {
    /// Starts the three stores (they take a few seconds each, RabbitMQ the longest).
    pub async fn start() -> Self {
        let redis = OwnRedis::start(Persistence::AppendOnly);
        let (postgres, broker) =
            tokio::join!(OwnPostgres::start(), OwnBroker::start_with_management());
        Self {
            postgres,
            redis,
            broker,
        }
    }
}

/// Which service a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `seckill-api`: the purchase path.
    Api,
    /// `order-service`: the consumer writing orders.
    Orders,
    /// `gateway`: the public front.
    Gateway,
}

impl Role {
    /// The binary's name, also the log file's.
    pub fn binary(self) -> &'static str {
        match self {
            Role::Api => "seckill-api",
            Role::Orders => "order-service",
            Role::Gateway => "gateway",
        }
    }

    /// The variable that sets the service's port.
    fn port_variable(self) -> &'static str {
        match self {
            Role::Api => "SECKILL_API_PORT",
            Role::Orders => "SECKILL_ORDER_PORT",
            Role::Gateway => "SECKILL_GATEWAY_PORT",
        }
    }
}

/// How many replicas of each service, and how the gateways share their rate limits.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Gateway replicas; the burst spreads its buyers over them.
    pub gateways: usize,
    /// seckill-api replicas behind every gateway.
    pub apis: usize,
    /// order-service replicas consuming the one queue.
    pub orders: usize,
}

impl Shape {
    /// One of each.
    pub const SINGLE: Shape = Shape {
        gateways: 1,
        apis: 1,
        orders: 1,
    };
}

/// Where a scenario's services find their stores, and what they share.
#[derive(Debug, Clone)]
pub struct Wiring {
    /// This scenario's database on the run's Postgres.
    pub database_url: String,
    /// Redis as the services see it (the server, or a proxy in front of it).
    pub redis_url: String,
    /// The run's RabbitMQ.
    pub amqp_url: String,
    /// Its management API.
    pub management_url: String,
    /// Keys, queues and exchanges of this scenario start with it.
    pub namespace: String,
    /// HS256 secret the gateways verify tokens with.
    pub jwt_secret: String,
    /// The key the gateway signs identities with for the backends.
    pub internal_key: String,
    /// The key seckill-api signs order messages with and order-service checks them by.
    pub order_signing_key: String,
    /// Settings of seckill-api's own (every replica), e.g. a proxy in front of its broker.
    pub api_extra: Vec<(String, String)>,
    /// Settings of the operator's for every service, applied last.
    pub extra: Vec<(String, String)>,
}

/// One service process.
struct Process {
    role: Role,
    port: u16,
    /// The gateway's operator port (its `/readyz`); `None` for a backend, whose `/readyz`
    /// is on `port`.
    admin_port: Option<u16>,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self, bin_dir: &Path) -> anyhow::Result<()> {
        let binary = bin_dir.join(self.role.binary());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("open {}", self.log.display()))?;
        let mut command = Command::new(&binary);
        // Nothing of the caller's own SECKILL_* settings may reach a scenario's services.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("SECKILL_") {
                command.env_remove(name);
            }
        }
        let child = command
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| {
                format!(
                    "start {} (build it: cargo build --release)",
                    binary.display()
                )
            })?;
        self.child = Some(child);
        Ok(())
    }

    /// SIGKILL, then reap.
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    async fn wait_ready(&mut self, http: &reqwest::Client) -> anyhow::Result<()> {
        let ready_port = self.admin_port.unwrap_or(self.port);
        let url = format!("http://127.0.0.1:{ready_port}/readyz");
        let deadline = Instant::now() + READY_PATIENCE;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "{} exited during start-up ({status}); see {}",
                    self.role.binary(),
                    self.log.display()
                );
            }
            // This service's readiness report, not merely a 200 from whoever holds the port.
            if let Ok(response) = http.get(&url).send().await
                && let Ok(report) = response.json::<serde_json::Value>().await
            {
                match readiness(self.role, &report) {
                    Readiness::Ready => return Ok(()),
                    Readiness::NotYet => {}
                    Readiness::Foreign(other) => bail!(
                        "port {ready_port} of {} is answered by {other}; see {}",
                        self.role.binary(),
                        self.log.display()
                    ),
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} not ready after {}s; see {}",
                    self.role.binary(),
                    READY_PATIENCE.as_secs(),
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// What a `/readyz` answer says of the service `role`.
#[derive(Debug, PartialEq, Eq)]
enum Readiness {
    /// It is up and every dependency answers.
    Ready,
    /// Not (yet): a dependency is missing, or the report does not say whose it is.
    NotYet,
    /// Another service answers on its port: it will never be ready there.
    Foreign(String),
}

/// The report names its service, so another process holding the port cannot pass for it.
fn readiness(role: Role, report: &serde_json::Value) -> Readiness {
    match report["service"].as_str() {
        Some(service) if service != role.binary() => Readiness::Foreign(service.to_string()),
        Some(_) if report["ready"] == true => Readiness::Ready,
        _ => Readiness::NotYet,
    }
}

/// A scenario's service processes.
pub struct Services {
    bin_dir: PathBuf,
    processes: Vec<Process>,
    http: reqwest::Client,
}

impl Services {
    /// Starts the backends, then the gateways in front of them, and waits until every one is
    /// ready. Logs go to `<log_dir>/<binary>-<replica>.log`.
    pub async fn start(
        bin_dir: &Path,
        log_dir: &Path,
        shape: Shape,
        wiring: &Wiring,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("create {}", log_dir.display()))?;
        let mut processes = Vec::new();
        let mut add = |role: Role, replica: usize, extra: Vec<(String, String)>| {
            // Below the ephemeral range, and never one handed out before in this process: no
            // two services, stores or restarts of a scenario share a port.
            let port = free_port();
            let mut env = common_env(wiring);
            env.push((role.port_variable().into(), port.to_string()));
            // Each gateway its own operator port: the default one would be shared.
            let admin_port = match role {
                Role::Gateway => Some(free_port()),
                _ => None,
            };
            if let Some(admin) = admin_port {
                env.push(("SECKILL_GATEWAY_ADMIN_PORT".into(), admin.to_string()));
            }
            env.extend(extra);
            env.extend(wiring.extra.iter().cloned());
            processes.push(Process {
                role,
                port,
                admin_port,
                env,
                log: log_dir.join(format!("{}-{replica}.log", role.binary())),
                child: None,
            });
            anyhow::Ok(port)
        };
        let mut api_urls = Vec::new();
        for replica in 0..shape.apis {
            let port = add(Role::Api, replica, wiring.api_extra.clone())?;
            api_urls.push(format!("http://127.0.0.1:{port}"));
        }
        let mut order_urls = Vec::new();
        for replica in 0..shape.orders {
            let port = add(Role::Orders, replica, Vec::new())?;
            order_urls.push(format!("http://127.0.0.1:{port}"));
        }
        for replica in 0..shape.gateways {
            let mut extra = vec![
                (
                    "SECKILL_GATEWAY_SECKILL_API_URLS".to_string(),
                    api_urls.join(","),
                ),
                (
                    "SECKILL_GATEWAY_ORDER_SERVICE_URLS".to_string(),
                    order_urls.join(","),
                ),
            ];
            // The buyers are one address minting fresh tokens faster than the per-address
            // pre-limit on unverified tokens allows; a real crowd comes from many.
            for name in [
                "SECKILL_GATEWAY_RATE_UNVERIFIED_PER_SEC",
                "SECKILL_GATEWAY_RATE_UNVERIFIED_BURST",
            ] {
                extra.push((name.into(), "100000".into()));
            }
            if shape.gateways > 1 {
                // Replicas share one set of limits, as a deployment of several would.
                extra.push(("SECKILL_GATEWAY_RATE_LIMIT_BACKEND".into(), "redis".into()));
            }
            add(Role::Gateway, replica, extra)?;
        }
        let mut services = Self {
            bin_dir: bin_dir.to_path_buf(),
            processes,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()?,
        };
        for process in &mut services.processes {
            process.spawn(&services.bin_dir)?;
        }
        for process in &mut services.processes {
            process.wait_ready(&services.http).await?;
        }
        Ok(services)
    }

    /// The gateways' base URLs.
    pub fn gateway_urls(&self) -> Vec<String> {
        self.processes
            .iter()
            .filter(|p| p.role == Role::Gateway)
            .map(Process::url)
            .collect()
    }

    fn nth(&mut self, role: Role, replica: usize) -> anyhow::Result<&mut Process> {
        self.processes
            .iter_mut()
            .filter(|p| p.role == role)
            .nth(replica)
            .with_context(|| format!("no replica {replica} of {}", role.binary()))
    }

    /// One replica's `/metrics` (Prometheus text).
    pub async fn metrics(&self, role: Role, replica: usize) -> anyhow::Result<String> {
        let process = self
            .processes
            .iter()
            .filter(|p| p.role == role)
            .nth(replica)
            .with_context(|| format!("no replica {replica} of {}", role.binary()))?;
        let port = process.admin_port.unwrap_or(process.port);
        let text = self
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(text)
    }

    /// Kills one replica with SIGKILL: no shutdown hook runs, whatever it held in memory is
    /// gone.
    pub async fn kill(&mut self, role: Role, replica: usize) -> anyhow::Result<()> {
        self.nth(role, replica)?.kill().await;
        Ok(())
    }

    /// Starts a killed replica again on its port and waits until it is ready.
    pub async fn restart(&mut self, role: Role, replica: usize) -> anyhow::Result<()> {
        let bin_dir = self.bin_dir.clone();
        let http = self.http.clone();
        let process = self.nth(role, replica)?;
        process.kill().await;
        process.spawn(&bin_dir)?;
        process.wait_ready(&http).await
    }

    /// Kills every process (the scenario's verdict is in; nothing of theirs is needed).
    pub async fn stop(&mut self) {
        for process in self.processes.iter_mut().rev() {
            process.kill().await;
        }
    }
}

/// The settings every service of a scenario shares.
fn common_env(wiring: &Wiring) -> Vec<(String, String)> {
    [
        ("SECKILL_DATABASE_URL", wiring.database_url.as_str()),
        ("SECKILL_REDIS_URL", &wiring.redis_url),
        ("SECKILL_AMQP_URL", &wiring.amqp_url),
        ("SECKILL_NAMESPACE", &wiring.namespace),
        ("SECKILL_JWT_SECRET", &wiring.jwt_secret),
        ("SECKILL_INTERNAL_KEY", &wiring.internal_key),
        ("SECKILL_ORDER_SIGNING_KEY", &wiring.order_signing_key),
        ("SECKILL_HOST", "127.0.0.1"),
        ("SECKILL_LOG_FORMAT", "json"),
        // A replica started while a store is down waits for it rather than giving up.
        ("SECKILL_STARTUP_PATIENCE_SECS", "120"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_started_services_readiness_counts() {
        let report = |service: &str, ready: bool| {
            let checks = serde_json::json!({});
            serde_json::json!({ "service": service, "ready": ready, "checks": checks })
        };
        assert_eq!(
            readiness(Role::Api, &report("seckill-api", true)),
            Readiness::Ready
        );
        assert_eq!(
            readiness(Role::Api, &report("seckill-api", false)),
            Readiness::NotYet
        );
        // A sibling answering on the port is not the service it was asked about.
        assert_eq!(
            readiness(Role::Api, &report("order-service", true)),
            Readiness::Foreign("order-service".into())
        );
        assert_eq!(
            readiness(Role::Orders, &report("gateway", false)),
            Readiness::Foreign("gateway".into())
        );
        // A report naming no service proves nothing.
        assert_eq!(
            readiness(Role::Gateway, &serde_json::json!({ "ready": true })),
            Readiness::NotYet
        );
    }
}
