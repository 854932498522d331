//! A private PostgreSQL server for tests that stop and restart the database.
//!
//! The shared server on 5432 serves every test running at the same time, so it must never
//! be stopped. A test that needs an outage starts an [`OwnPostgres`] instead: its own
//! cluster (`initdb`, trust auth, user `postgres`) in its own dir, served on a free loopback
//! port with its own Unix socket dir, started with the installed `pg_ctl`.
//!
//! The dir goes to `/dev/shm` (tmpfs: `initdb` is several times faster there on a busy
//! machine) when it has at least 1 GiB free, else to the temp dir.
//!
//! PostgreSQL refuses to run as root. Running as root (as tests do in a container), the
//! server runs as the `postgres` OS user (through `setpriv`) and the dir is chowned to it,
//! so every directory above it must be searchable by that user (`/dev/shm` and `/tmp`
//! are). Running as anyone else, it runs as that user.
//!
//! Linux only (it watches the server through `/proc`). It needs the PostgreSQL server
//! binaries: the newest `/usr/lib/postgresql/<version>/bin` (Debian's layout), else
//! `pg_config --bindir`, else `PATH`; `SECKILL_TEST_POSTGRES_BINDIR` names another dir. A
//! server outlives a test process killed before its `Drop` ran (`pg_ctl` detaches it); the
//! next [`OwnPostgres::start`] shuts such orphans down and deletes their dirs.

use std::fs;
use std::io::ErrorKind;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use sqlx::Connection;

use crate::orphans::{self, signal};
use crate::ports::free_port;

/// How long a server may take to come up or go down before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);
/// Dirs start with this; the orphan sweep matches on it.
const DIR_PREFIX: &str = "seckill-postgres-";
/// Inside our dir: the cluster, the Unix socket dir, the server log.
const DATA: &str = "data";
const SOCKETS: &str = "sock";
const LOG: &str = "postgres.log";
/// The OS user the server runs as when we are root.
const OS_USER: &str = "postgres";
/// The preferred home of our dirs, and the free space it needs to be used (1 GiB).
const SHM: &str = "/dev/shm";
const SHM_MIN_FREE_KIB: u64 = 1 << 20;
/// A freshly picked port can be taken by someone else before the server binds it; then
/// [`OwnPostgres::start`] picks another, this many times in all.
const PORT_ATTEMPTS: u32 = 3;

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// A PostgreSQL server of this test alone, on a free loopback port with its own data dir.
/// Its superuser is `postgres`, without a password (trust auth).
///
/// Dropping it shuts the server down at once (no checkpoint) and deletes the dir.
#[derive(Debug)]
pub struct OwnPostgres {
    /// `<base dir>/seckill-postgres-<pid>-<n>` (see `base_dir`), canonical: the server's
    /// working directory is compared with `<dir>/data` to recognise it.
    dir: PathBuf,
    port: u16,
    /// The OS pid of the running postmaster, `None` while stopped. Kept here because the
    /// postmaster deletes its pid file as it shuts down, before the process has exited.
    pid: Mutex<Option<u32>>,
}

impl OwnPostgres {
    /// Creates a fresh cluster in its own dir, starts it on a free loopback port and waits
    /// until it accepts connections to the `postgres` database. Panics (with the server's
    /// log tail) if that fails or takes more than 60 s.
    pub async fn start() -> OwnPostgres {
        sweep_orphans();
        let id = format!(
            "{}-{}",
            std::process::id(),
            NEXT_ID.fetch_add(1, Ordering::Relaxed)
        );
        let dir = base_dir().join(format!("{DIR_PREFIX}{id}"));
        // A dir of that name can only be left over from an earlier process with our pid.
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join(SOCKETS))
            .unwrap_or_else(|e| panic!("create {}: {e}", dir.join(SOCKETS).display()));
        let dir = fs::canonicalize(&dir)
            .unwrap_or_else(|e| panic!("canonicalize {}: {e}", dir.display()));
        let mut postgres = OwnPostgres {
            dir,
            port: 0,
            pid: Mutex::new(None),
        };
        // `postgres` exists before the server does, so a panic below still runs Drop.
        if let Some((uid, gid)) = run_as() {
            for path in [postgres.dir.clone(), postgres.dir.join(SOCKETS)] {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .unwrap_or_else(|e| panic!("chown {} to {OS_USER}: {e}", path.display()));
            }
        }
        postgres.initdb().await;
        for attempt in 1..=PORT_ATTEMPTS {
            postgres.port = free_port();
            let log_before = fs::metadata(postgres.dir.join(LOG)).map_or(0, |m| m.len());
            let Err(failure) = postgres.launch().await else {
                break;
            };
            // Only this attempt's part of the log counts.
            let log = fs::read(postgres.dir.join(LOG)).unwrap_or_default();
            let log = String::from_utf8_lossy(log.get(log_before as usize..).unwrap_or_default());
            let port_taken = log.contains("could not bind");
            if !port_taken || attempt == PORT_ATTEMPTS {
                panic!(
                    "start: pg_ctl start failed on 127.0.0.1:{}\n{failure}\n{}",
                    postgres.port,
                    postgres.diagnostics()
                );
            }
        }
        postgres.wait_ready("start").await;
        postgres
    }

    /// `postgres://postgres@127.0.0.1:<port>/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The loopback TCP port the server listens on (the same after a restart).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server with a fast shutdown (`pg_ctl stop -m fast`: open sessions are
    /// terminated, a checkpoint is written, the data is kept) and waits until its process
    /// has exited and its port refuses connections. Does nothing when it is already stopped.
    pub async fn stop(&self) {
        let Some(pid) = self.running_pid() else {
            *self.pid.lock().expect("pid lock") = None;
            return;
        };
        let deadline = Instant::now() + PATIENCE;
        let output = self
            .pg_ctl(&[
                "stop",
                "-m",
                "fast",
                "-w",
                "-t",
                &PATIENCE.as_secs().to_string(),
            ])
            .await;
        // pg_ctl also fails when the server went away on its own meanwhile: fine by us.
        if !output.status.success() && postmaster_alive(pid, &self.data_dir()) {
            panic!(
                "stop: pg_ctl stop -m fast failed for pid {pid}\n{}\n{}",
                describe(&output),
                self.diagnostics()
            );
        }
        // pg_ctl returns once the pid file is gone, which the postmaster deletes just
        // before it exits.
        while postmaster_alive(pid, &self.data_dir()) {
            if Instant::now() >= deadline {
                panic!(
                    "stop: postmaster (pid {pid}) still running {}s after a fast shutdown\n{}",
                    PATIENCE.as_secs(),
                    self.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        *self.pid.lock().expect("pid lock") = None;
        loop {
            match tokio::net::TcpStream::connect(self.addr()).await {
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => return,
                _ if Instant::now() >= deadline => panic!(
                    "stop: postmaster exited, but 127.0.0.1:{} still does not refuse connections",
                    self.port
                ),
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Starts the server again on the same port and data dir (stopping it first if it runs)
    /// and waits until it accepts connections. Everything committed before the stop is back.
    pub async fn restart(&self) {
        self.stop().await;
        if let Err(failure) = self.launch().await {
            panic!(
                "restart: pg_ctl start failed on 127.0.0.1:{}\n{failure}\n{}",
                self.port,
                self.diagnostics()
            );
        }
        self.wait_ready("restart").await;
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join(DATA)
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// `initdb`: trust auth, superuser `postgres`, UTF-8 with the C locale (whatever the
    /// machine's locale settings), no fsync (a test cluster need not survive a power cut).
    async fn initdb(&self) {
        let data = self.data_dir();
        let mut command = pg_command("initdb");
        command
            .arg("-D")
            .arg(&data)
            .args([
                "--auth=trust",
                "--username=postgres",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .current_dir(&self.dir);
        let output = run(command, "initdb").await;
        if !output.status.success() {
            let denied = String::from_utf8_lossy(&output.stderr).contains("Permission denied");
            let hint = if run_as().is_some() && denied {
                format!(
                    "\n(initdb runs as the {OS_USER} OS user: every directory above {} must be \
                     searchable by it; TMPDIR moves the temp dir)",
                    self.dir.display()
                )
            } else {
                String::new()
            };
            panic!(
                "start: initdb -D {} failed\n{}{hint}",
                data.display(),
                describe(&output)
            );
        }
    }

    /// `pg_ctl start -w`: returns once the server accepts connections (a few hundred ms),
    /// and records the postmaster's pid. Err carries pg_ctl's output.
    async fn launch(&self) -> Result<(), String> {
        // pg_ctl hands `-o` to a shell, hence the quotes around the path.
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k '{}' -c fsync=off",
            self.port,
            self.dir.join(SOCKETS).display()
        );
        let log = self.dir.join(LOG).display().to_string();
        let timeout = PATIENCE.as_secs().to_string();
        let output = self
            .pg_ctl(&["start", "-w", "-t", &timeout, "-l", &log, "-o", &options])
            .await;
        if !output.status.success() {
            return Err(describe(&output));
        }
        let pid = read_pid(&self.data_dir())
            .filter(|&pid| postmaster_alive(pid, &self.data_dir()))
            .ok_or_else(|| {
                format!(
                    "pg_ctl reported success, but no live postmaster is in {}/postmaster.pid\n{}",
                    self.data_dir().display(),
                    describe(&output)
                )
            })?;
        *self.pid.lock().expect("pid lock") = Some(pid);
        Ok(())
    }

    /// Runs `pg_ctl -D <data> <args>` (as the server's OS user).
    async fn pg_ctl(&self, args: &[&str]) -> Output {
        let mut command = pg_command("pg_ctl");
        command
            .arg("-D")
            .arg(self.data_dir())
            .args(args)
            .current_dir(&self.dir);
        run(command, "pg_ctl").await
    }

    /// Waits until a connection to the `postgres` database works, failing fast if the
    /// postmaster dies on the way.
    async fn wait_ready(&self, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        let url = self.url("postgres");
        loop {
            let pid = self.running_pid();
            if pid.is_none() {
                panic!(
                    "{what}: postmaster exited while starting\n{}",
                    self.diagnostics()
                );
            }
            let attempt =
                tokio::time::timeout(Duration::from_secs(5), sqlx::PgConnection::connect(&url))
                    .await;
            let error = match attempt {
                Ok(Ok(connection)) => {
                    let _ = connection.close().await;
                    return;
                }
                Ok(Err(e)) => e.to_string(),
                Err(_) => "connect timed out after 5 s".to_string(),
            };
            if Instant::now() >= deadline {
                panic!(
                    "{what}: {url} not accepting connections after {}s (postmaster pid {pid:?}): \
                     {error}\n{}",
                    PATIENCE.as_secs(),
                    self.diagnostics()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The postmaster's pid if it runs: the one we recorded, else the one in its pid file.
    fn running_pid(&self) -> Option<u32> {
        let known = *self.pid.lock().expect("pid lock");
        let data = self.data_dir();
        known
            .into_iter()
            .chain(read_pid(&data))
            .find(|&pid| postmaster_alive(pid, &data))
    }

    /// The tail of the server's log, for panic messages.
    fn diagnostics(&self) -> String {
        let log_path = self.dir.join(LOG);
        let log = fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        format!("--- last lines of {} ---\n{tail}", log_path.display())
    }
}

impl Drop for OwnPostgres {
    /// Shuts the server down immediately and deletes its dir, best effort. An immediate
    /// shutdown rather than a fast one: the data is deleted right after, so a checkpoint
    /// buys nothing.
    fn drop(&mut self) {
        if let Some(pid) = self.running_pid() {
            shut_down_immediately(pid, &self.data_dir());
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// What `pg_ctl stop -m immediate` does, without needing pg_ctl (or the user switch): a
/// SIGQUIT, on which the postmaster kills its children, releases its shared memory and
/// exits. SIGKILL after 5 s as a last resort (its children then exit on their own when
/// they notice the postmaster is gone). Synchronous: it runs in `Drop`.
fn shut_down_immediately(pid: u32, data: &Path) {
    for (name, patience) in [
        ("QUIT", Duration::from_secs(5)),
        ("KILL", Duration::from_secs(5)),
    ] {
        signal(pid, name);
        let deadline = Instant::now() + patience;
        while postmaster_alive(pid, data) {
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if !postmaster_alive(pid, data) {
            return;
        }
    }
}

/// Where our dirs go: `/dev/shm` when it is a tmpfs with room to spare, else the temp dir.
/// On a busy disk `initdb` takes 3-4 s on ext4 against about 1 s on tmpfs (it creates about
/// a thousand files, ~40 MB, even with `--no-sync`); a small `/dev/shm` (Docker gives 64 MB)
/// is left alone.
fn base_dir() -> &'static Path {
    static BASE_DIR: OnceLock<PathBuf> = OnceLock::new();
    BASE_DIR.get_or_init(|| {
        if shm_available_kib().is_some_and(|kib| kib >= SHM_MIN_FREE_KIB) {
            PathBuf::from(SHM)
        } else {
            std::env::temp_dir()
        }
    })
}

/// Free space on `/dev/shm` in KiB, from `df` (std has no statvfs, and this crate forbids
/// the unsafe code libc would need).
fn shm_available_kib() -> Option<u64> {
    if !Path::new(SHM).is_dir() {
        return None;
    }
    let output = Command::new("df")
        .args(["-Pk", SHM])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().nth(1)?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// A PostgreSQL tool, run as the `postgres` OS user when we are root.
fn pg_command(tool: &str) -> Command {
    let program = match bin_dir() {
        Some(dir) => dir.join(tool),
        None => PathBuf::from(tool),
    };
    let mut command = if run_as().is_some() {
        let mut command = Command::new("setpriv");
        command
            .arg(format!("--reuid={OS_USER}"))
            .arg(format!("--regid={OS_USER}"))
            .args(["--init-groups", "--"])
            .arg(program);
        command
    } else {
        Command::new(program)
    };
    command.stdin(Stdio::null());
    command
}

/// Runs `command` to completion, bounded by [`PATIENCE`].
async fn run(command: Command, what: &str) -> Output {
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    match tokio::time::timeout(PATIENCE, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => panic!(
            "cannot run {what} ({:?}; are the PostgreSQL server binaries installed? \
             SECKILL_TEST_POSTGRES_BINDIR names their dir): {e}",
            command.as_std().get_program()
        ),
        Err(_) => panic!("{what} did not finish in {}s", PATIENCE.as_secs()),
    }
}

fn describe(output: &Output) -> String {
    format!(
        "({}) {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The dir holding `initdb` and `pg_ctl`, `None` to look them up in `PATH`.
fn bin_dir() -> Option<&'static Path> {
    static BIN_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN_DIR.get_or_init(find_bin_dir).as_deref()
}

fn find_bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("SECKILL_TEST_POSTGRES_BINDIR") {
        return Some(dir.into());
    }
    let has_tools = |dir: &Path| dir.join("initdb").exists() && dir.join("pg_ctl").exists();
    // Debian installs each major version side by side; the newest wins.
    let newest = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .max_by_key(|(version, _)| *version);
    if let Some((_, bin)) = newest {
        return Some(bin);
    }
    let output = Command::new("pg_config").arg("--bindir").output().ok()?;
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    (output.status.success() && has_tools(&dir)).then_some(dir)
}

/// `Some((uid, gid))` of the `postgres` OS user when we are root (PostgreSQL will not run
/// as root), `None` otherwise.
fn run_as() -> Option<(u32, u32)> {
    static RUN_AS: OnceLock<Option<(u32, u32)>> = OnceLock::new();
    *RUN_AS.get_or_init(|| {
        if effective_uid() != Some(0) {
            return None;
        }
        let passwd = fs::read_to_string("/etc/passwd").unwrap_or_default();
        let ids = passwd.lines().find_map(|line| {
            let mut fields = line.split(':');
            if fields.next()? != OS_USER {
                return None;
            }
            let mut fields = fields.skip(1);
            Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
        });
        Some(ids.unwrap_or_else(|| {
            panic!(
                "running as root, and PostgreSQL refuses root: it needs an OS user \
                 {OS_USER:?} (the postgresql package creates one), but /etc/passwd has none"
            )
        }))
    })
}

/// Our effective uid, from `/proc/self/status` (this crate forbids unsafe code, so no
/// `libc::geteuid`).
fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// The postmaster's pid: the first line of `<data>/postmaster.pid`.
fn read_pid(data: &Path) -> Option<u32> {
    fs::read_to_string(data.join("postmaster.pid"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

/// True while `pid` is a live process working in `data`, which is what a postmaster (and
/// its children) of that cluster does: rules out a pid the kernel has since given to
/// someone else, and a zombie, whose cwd cannot be read.
fn postmaster_alive(pid: u32, data: &Path) -> bool {
    fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == data)
}

/// Shuts down the servers of test processes that died before their `OwnPostgres` was
/// dropped and deletes their dirs.
fn sweep_orphans() {
    let bases = [Path::new(SHM).to_path_buf(), std::env::temp_dir()];
    for (entry, _) in orphans::orphaned(&bases, DIR_PREFIX) {
        let Ok(dir) = fs::canonicalize(entry.path()) else {
            continue;
        };
        let data = dir.join(DATA);
        if let Some(pid) = read_pid(&data)
            && postmaster_alive(pid, &data)
        {
            shut_down_immediately(pid, &data);
        }
        // The owner's initdb or pg_ctl can outlive it by a few seconds. Deleting the dir
        // under them would make postgres processes die without releasing their SysV shared
        // memory, so such a dir waits for a later sweep.
        if !processes_working_in(&dir) {
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

/// True if a live process has its working directory in `dir` (initdb, pg_ctl and every
/// postgres process work in our dir or its data dir).
fn processes_working_in(dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.parse::<u32>().is_ok())
            && fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
    })
}
