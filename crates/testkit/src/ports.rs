//! Ports for the processes and servers tests start, below the kernel's ephemeral range.
//!
//! A port from `bind(0)` is an ephemeral one, the same kind the kernel gives the source end
//! of every outgoing connection. A test that stops its own Redis, broker or Postgres and
//! starts it again on the same port (to be found at the same address) can then find the port
//! taken by some client's connection, or by another test's `bind(0)`, and fail to start.
//! Ports below the range (32768 and up on Linux) are never given out so; each one here is
//! also handed out once per process, and free on every interface when it is.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

/// Where the ports come from: below the ephemeral range and above the well-known services
/// (the local Redis Cluster of `scripts/redis-cluster.sh` is on 17001-17003).
pub const TEST_PORTS: std::ops::Range<u16> = 20000..32000;

/// Every port this process handed out: none is given twice, so a test that restarts its
/// server on its port never meets another test's server there.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

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
        // Not even on one address: a server told to bind 0.0.0.0 would fail.
        if TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok() {
            handed_out.insert(port);
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
