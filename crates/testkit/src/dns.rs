//! A tiny DNS server for tests: answers A queries over UDP from a name → addresses map the
//! test changes while it runs (NXDOMAIN for a name it does not hold), and can be told to
//! fail (SERVFAIL) to show what a client does when resolution breaks.
//!
//! Only what a stub resolver's A query needs is understood: one question, an uncompressed
//! name. More questions are answered FORMERR; other record types get no records; anything
//! unreadable, silence.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::UdpSocket;
use tokio::task::JoinHandle;

#[derive(Default)]
struct Zone {
    names: Mutex<HashMap<String, Vec<Ipv4Addr>>>,
    failing: AtomicBool,
    queries: AtomicUsize,
}

/// A running DNS server on a loopback UDP port; stopped when dropped.
pub struct DnsServer {
    addr: SocketAddr,
    zone: Arc<Zone>,
    task: JoinHandle<()>,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DnsServer {
    /// Starts a server on `127.0.0.1:<free port>` holding no names.
    pub async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind dns");
        let addr = socket.local_addr().expect("dns addr");
        let zone = Arc::new(Zone::default());
        let served = zone.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                served.queries.fetch_add(1, Ordering::SeqCst);
                if let Some(answer) = answer(&served, &buf[..n]) {
                    let _ = socket.send_to(&answer, peer).await;
                }
            }
        });
        Self { addr, zone, task }
    }

    /// The server's address, for a client's configuration (`127.0.0.1:port`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `name` resolves to `addresses` from now on (none: an answer without records).
    pub fn set(&self, name: &str, addresses: &[Ipv4Addr]) {
        self.zone
            .names
            .lock()
            .expect("zone")
            .insert(normalise(name), addresses.to_vec());
    }

    /// `name` no longer exists (NXDOMAIN).
    pub fn remove(&self, name: &str) {
        self.zone
            .names
            .lock()
            .expect("zone")
            .remove(&normalise(name));
    }

    /// While `failing`, every query is answered SERVFAIL.
    pub fn fail(&self, failing: bool) {
        self.zone.failing.store(failing, Ordering::SeqCst);
    }

    /// Queries received so far.
    pub fn queries(&self) -> usize {
        self.zone.queries.load(Ordering::SeqCst)
    }
}

fn normalise(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The answer to `query`, if it is a query worth answering.
fn answer(zone: &Zone, query: &[u8]) -> Option<Vec<u8>> {
    // A response, or too short to be a query: ignored.
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let questions = u16::from_be_bytes([query[4], query[5]]);
    let mut name = Vec::new();
    let mut at = 12;
    loop {
        let length = usize::from(*query.get(at)?);
        if length == 0 {
            at += 1;
            break;
        }
        if length > 63 {
            return None;
        }
        let label = query.get(at + 1..at + 1 + length)?;
        name.push(String::from_utf8_lossy(label).to_ascii_lowercase());
        at += 1 + length;
    }
    let fixed = query.get(at..at + 4)?;
    let (kind, class) = (
        u16::from_be_bytes([fixed[0], fixed[1]]),
        u16::from_be_bytes([fixed[2], fixed[3]]),
    );
    let question = &query[12..at + 4];
    let (rcode, records) = if questions != 1 {
        (1, Vec::new())
    } else if zone.failing.load(Ordering::SeqCst) {
        (2, Vec::new())
    } else {
        match zone.names.lock().expect("zone").get(&name.join(".")) {
            None => (3, Vec::new()),
            // Only A/IN has records; any other type of a known name: none.
            Some(addresses) if kind == 1 && class == 1 => (0, addresses.clone()),
            Some(_) => (0, Vec::new()),
        }
    };
    let mut message = Vec::with_capacity(12 + question.len() + 16 * records.len());
    message.extend_from_slice(&query[..2]);
    // QR, the query's RD, RA; the rcode.
    message.push(0x80 | (query[2] & 0x01));
    message.push(0x80 | rcode);
    message.extend_from_slice(&[0, 1]);
    message.extend_from_slice(&(records.len() as u16).to_be_bytes());
    message.extend_from_slice(&[0, 0, 0, 0]);
    message.extend_from_slice(question);
    for address in records {
        // The name by pointer to the question's; A, IN, TTL 0, four bytes.
        message.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        message.extend_from_slice(&address.octets());
    }
    Some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An A query for `name` with id 0x1234.
    fn query(name: &str) -> Vec<u8> {
        let mut message = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            message.push(label.len() as u8);
            message.extend_from_slice(label.as_bytes());
        }
        message.extend_from_slice(&[0, 0, 1, 0, 1]);
        message
    }

    async fn ask(server: &DnsServer, name: &str) -> Vec<u8> {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        socket
            .send_to(&query(name), server.addr())
            .await
            .expect("send");
        let mut buf = [0u8; 512];
        let (n, _) = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            socket.recv_from(&mut buf),
        )
        .await
        .expect("an answer")
        .expect("recv");
        buf[..n].to_vec()
    }

    #[tokio::test]
    async fn a_names_addresses_are_answered_and_follow_changes() {
        let server = DnsServer::start().await;
        server.set(
            "Api.Test.",
            &[Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3)],
        );
        let answer = ask(&server, "api.test").await;
        assert_eq!(
            &answer[..4],
            &[0x12, 0x34, 0x81, 0x80],
            "id, QR+RD, RA, NOERROR"
        );
        assert_eq!(&answer[6..8], &[0, 2], "two records");
        let q = query("api.test");
        assert_eq!(answer.len(), q.len() + 2 * 16);
        assert_eq!(&answer[answer.len() - 4..], &[127, 0, 0, 3]);
        server.remove("api.test");
        assert_eq!(ask(&server, "api.test").await[3] & 0x0f, 3, "NXDOMAIN");
        server.set("api.test", &[]);
        server.fail(true);
        assert_eq!(ask(&server, "api.test").await[3] & 0x0f, 2, "SERVFAIL");
        assert_eq!(server.queries(), 3);
    }
}
