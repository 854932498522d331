//! Ports for the processes and servers tests start, below the kernel's ephemeral range.
//!
//! A port from `bind(0)` is an ephemeral one, the same kind the kernel gives the source end
//! of every outgoing connection. A test that stops its own Redis, broker or Postgres and
//! starts it again on the same port (to be found at the same address) can then find the port
//! taken by some client's connection, or by another test's `bind(0)`, and fail to start.
//! Ports below the range (32768 and up on Linux) are never given out so; each one here is
//! also handed out once per process, and free on every interface when it is.
//!
//! The suite runs one process per test (cargo-nextest), several at once, so "once per
//! process" is not enough: two processes could see the same port free at the same moment,
//! or one could take the port another test's stopped server is about to start on again. A
//! port handed out is also locked for the life of the process, with an advisory lock on a
//! file named after it in a shared folder: another process skips a locked port, and the
//! kernel drops the lock when the process ends, however it ends.

use std::collections::HashSet;
use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::sync::Mutex;

/// Where the ports come from: below the ephemeral range and above the well-known services
/// (the local Redis Cluster of `scripts/redis-cluster.sh` is on 17001-17003).
pub const TEST_PORTS: std::ops::Range<u16> = 20000..32000;

/// Every port this process handed out: none is given twice, so a test that restarts its
/// server on its port never meets another test's server there.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// The locks on the ports this process handed out, held until it exits.
static LOCKS: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Where the port locks live: one folder for every test process of the machine.
fn lock_dir() -> PathBuf {
    let dir = std::env::temp_dir().join("seckill-test-ports");
    std::fs::create_dir_all(&dir).expect("create the port lock folder");
    dir
}

/// Locks `port` for this process, or `None` when another process holds it.
fn lock(port: u16) -> Option<File> {
    let file = File::create(lock_dir().join(port.to_string())).expect("create a port lock");
    file.try_lock().ok().map(|()| file)
}

/// A TCP port free on every interface right now, never handed out before by this process,
/// for a process or server told to bind it.
pub fn free_port() -> u16 {
    free_ports::<1>()[0]
}

/// `N` distinct ports, as [`free_port`].
pub fn free_ports<const N: usize>() -> [u16; N] {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    let span = TEST_PORTS.end - TEST_PORTS.start;
    // A random start, then every port in turn: another test process (or another run's)
    // starts elsewhere.
    let random = RandomState::new().hash_one(std::process::id()) % u64::from(span);
    let start = u16::try_from(random).expect("below the span");
    let mut ports = [0; N];
    let mut picked = 0;
    for step in 0..span {
        if picked == N {
            break;
        }
        let port = TEST_PORTS.start + (start + step) % span;
        if handed_out.contains(&port) {
            continue;
        }
        // Locked first, then checked free: another test process never checks a port this
        // one holds. Not even in use on one address: a server told to bind 0.0.0.0 would fail.
        let Some(lock) = lock(port) else { continue };
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            handed_out.insert(port);
            LOCKS.lock().unwrap_or_else(|e| e.into_inner()).push(lock);
            ports[picked] = port;
            picked += 1;
        }
    }
    assert_eq!(picked, N, "no {N} free ports left in {TEST_PORTS:?}");
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_free_and_below_the_ephemeral_range() {
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let [a, b] = free_ports::<2>();
            for port in [a, b, free_port()] {
                assert!(TEST_PORTS.contains(&port), "{port}");
                assert!(seen.insert(port), "{port} handed out twice");
            }
        }
    }

    #[test]
    fn a_port_another_process_locked_is_never_handed_out() {
        // Another process's lock, as this one sees it: a lock on its own file handle (locks
        // taken through different handles exclude each other, within a process too).
        let span = TEST_PORTS.end - TEST_PORTS.start;
        let held: Vec<(u16, File)> = TEST_PORTS
            .step_by(7)
            .take(usize::from(span / 7) / 2)
            .filter_map(|port| lock(port).map(|file| (port, file)))
            .collect();
        assert!(!held.is_empty(), "no port could be locked");
        let locked: HashSet<u16> = held.iter().map(|(port, _)| *port).collect();
        for _ in 0..300 {
            let port = free_port();
            assert!(
                !locked.contains(&port),
                "{port} is locked by another process"
            );
        }
    }

    #[test]
    fn a_port_in_use_is_never_handed_out() {
        let held: Vec<TcpListener> = TEST_PORTS
            .step_by(50)
            .filter_map(|port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).ok())
            .collect();
        let taken: HashSet<u16> = held
            .iter()
            .map(|l| l.local_addr().expect("addr").port())
            .collect();
        for _ in 0..300 {
            let port = free_port();
            assert!(!taken.contains(&port), "{port} is in use");
        }
    }
}
