//! Caps on open connections, all clients together and per client address, taken at the
//! accept and given back when the connection ends: past either, the accept loop answers
//! `503` and closes instead of serving (the gateway's `serve`).
//!
//! Per address means the TCP peer's address: the cap acts before a byte is read, so an
//! `X-Forwarded-For` is not known yet, and a header is the client's word anyway. Behind a
//! proxy every client shares the proxy's address, so a peer the caller says is a trusted
//! proxy is held to the global cap only (the per-address cap belongs on that proxy).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapReason {
    /// `max_connections`: the gateway as a whole is full.
    Global,
    /// `max_connections_per_ip`: this client address has its share.
    PerIp,
}

impl CapReason {
    /// A metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Global => "max_connections",
            Self::PerIp => "max_connections_per_ip",
        }
    }
}

/// The open connections, counted against the two caps; shared by the accept loop and
/// every worker thread (a connection ends on its worker).
#[derive(Debug)]
pub struct ConnectionCaps {
    open: AtomicUsize,
    max: usize,
    /// Open connections per address; an address leaves the map with its last connection,
    /// so the map is as large as the set of connected clients, not of clients ever seen.
    per_ip: Mutex<HashMap<IpAddr, usize>>,
    max_per_ip: usize,
}

impl ConnectionCaps {
    /// At most `max` connections, at most `max_per_ip` from one address.
    pub fn new(max: usize, max_per_ip: usize) -> Self {
        Self {
            open: AtomicUsize::new(0),
            max,
            per_ip: Mutex::new(HashMap::new()),
            max_per_ip,
        }
    }

    /// A place for a connection from `ip` until the ticket is dropped, or why there is
    /// none; `per_ip_applies` false (a trusted proxy) skips the per-address cap.
    pub fn admit(&self, ip: IpAddr, per_ip_applies: bool) -> Result<Ticket<'_>, CapReason> {
        let before = self.open.fetch_add(1, Ordering::AcqRel);
        if before >= self.max {
            self.open.fetch_sub(1, Ordering::AcqRel);
            return Err(CapReason::Global);
        }
        let counted_ip = if per_ip_applies {
            let mut per_ip = self.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            let count = per_ip.entry(ip).or_insert(0);
            if *count >= self.max_per_ip {
                if *count == 0 {
                    per_ip.remove(&ip);
                }
                drop(per_ip);
                self.open.fetch_sub(1, Ordering::AcqRel);
                return Err(CapReason::PerIp);
            }
            *count += 1;
            Some(ip)
        } else {
            None
        };
        Ok(Ticket {
            caps: self,
            ip: counted_ip,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

/// One admitted connection's place under the caps.
#[derive(Debug)]
pub struct Ticket<'a> {
    caps: &'a ConnectionCaps,
    /// The address it counts against, when the per-address cap applied.
    ip: Option<IpAddr>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut per_ip = self.caps.per_ip.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(count) = per_ip.get_mut(&ip) {
                *count -= 1;
                if *count == 0 {
                    per_ip.remove(&ip);
                }
            }
        }
        self.caps.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_caps_refuse_past_their_count_and_give_places_back_on_drop() {
        let caps = ConnectionCaps::new(3, 2);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let first = caps.admit(a, true).expect("first");
        let second = caps.admit(a, true).expect("second");
        assert_eq!(caps.admit(a, true).err(), Some(CapReason::PerIp));
        let proxied = caps
            .admit(a, false)
            .expect("a trusted proxy skips the per-address cap");
        assert_eq!(caps.admit(b, true).err(), Some(CapReason::Global));
        drop(first);
        let other = caps.admit(b, true).expect("a freed place");
        assert_eq!(caps.open(), 3);
        drop((second, proxied, other));
        assert_eq!(caps.open(), 0);
        assert!(
            caps.per_ip.lock().unwrap().is_empty(),
            "no address left behind"
        );
    }
}
