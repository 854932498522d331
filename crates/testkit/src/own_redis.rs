//! A private Redis server for tests that kill, restart or wipe Redis.
//!
//! The shared Redis on 6379 serves every test running at the same time, so it must never be
//! stopped. A test that needs Redis to fail starts an [`OwnRedis`] instead: `redis-server`
//! (from `PATH`) on a free loopback port, its files in a temp dir of its own, as a child
//! process killed when the value is dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::ports::free_port;

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// How a server keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Nothing on disk: a restart comes back empty.
    None,
    /// An append-only file fsynced every second (Redis' usual production setting).
    AppendOnly,
}

/// A Redis server of this test alone.
#[derive(Debug)]
pub struct OwnRedis {
    dir: PathBuf,
    port: u16,
    persistence: Persistence,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts a server on a free loopback port and waits until it answers `PING`.
    pub fn start(persistence: Persistence) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "seckill-redis-{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("redis dir");
        let port = free_port();
        let mut redis = Self {
            dir,
            port,
            persistence,
            child: None,
        };
        redis.spawn();
        redis
    }

    /// The loopback port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server with SIGKILL (no shutdown save) and starts it again on the same
    /// port and dir: with [`Persistence::AppendOnly`] it reloads its AOF, else it is empty.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server with SIGKILL and starts it again with its files deleted: Redis
    /// comes back without its memory, whatever its persistence.
    pub fn wipe_and_restart(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
        std::fs::create_dir_all(&self.dir).expect("redis dir");
        self.spawn();
    }

    /// Kills the server with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn spawn(&mut self) {
        let appendonly = match self.persistence {
            Persistence::None => "no",
            Persistence::AppendOnly => "yes",
        };
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", appendonly])
            .args(["--appendfsync", "everysec", "--dir"])
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server (is it installed? scripts/infra.sh installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let client = redis::Client::open(self.url()).expect("redis url");
        loop {
            let pong = client
                .get_connection()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if pong.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on {} did not answer",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
