//! Turning an upstream's host name into addresses: the system resolver by default, or one
//! named DNS server asked for A records (`SECKILL_GATEWAY_DNS_SERVER`; tests point it at
//! `seckill_testkit::dns`).
//!
//! The A query is sent by hand (one UDP datagram, at most two tries) rather than through a
//! resolver library: the gateway needs one record type from one server, and a 60-line
//! encoder/decoder is smaller and easier to audit than a resolver crate's dependency tree.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use tokio::net::UdpSocket;

/// What a resolution future yields: the addresses behind the name (possibly none).
pub type Resolution<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;

/// Resolves a host name to the socket addresses of its replicas.
pub trait Resolve: fmt::Debug + Send + Sync + 'static {
    /// The addresses of `host` with `port`; an empty list when the name has none.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a>;
}

/// The system resolver (`getaddrinfo` through tokio): honours `/etc/hosts` and Docker's
/// embedded DNS.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a> {
        Box::pin(async move {
            match tokio::net::lookup_host((host, port)).await {
                Ok(addresses) => Ok(addresses.collect()),
                Err(e) => Err(e),
            }
        })
    }
}

/// Asks one DNS server for A records over UDP.
#[derive(Debug, Clone, Copy)]
pub struct DnsServer {
    server: SocketAddr,
    timeout: Duration,
}

impl DnsServer {
    /// Asks `server`, waiting `timeout` for each of two tries.
    pub fn new(server: SocketAddr, timeout: Duration) -> Self {
        Self { server, timeout }
    }
}

impl Resolve for DnsServer {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolution<'a> {
        Box::pin(async move {
            let query_id: u16 = rand::random();
            let query = encode_query(query_id, host)?;
            let local: SocketAddr = if self.server.is_ipv4() {
                (Ipv4Addr::UNSPECIFIED, 0).into()
            } else {
                (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
            };
            let socket = UdpSocket::bind(local).await?;
            socket.connect(self.server).await?;
            let mut buf = [0u8; 1500];
            for _ in 0..2 {
                socket.send(&query).await?;
                let answer = tokio::time::timeout(self.timeout, async {
                    loop {
                        let n = socket.recv(&mut buf).await?;
                        // Not ours (a late answer to the first try has the same id: fine).
                        if let Some(answer) = decode_answer(query_id, &buf[..n])? {
                            return Ok::<_, io::Error>(answer);
                        }
                    }
                })
                .await;
                if let Ok(answer) = answer {
                    let addresses = answer?;
                    return Ok(addresses
                        .into_iter()
                        .map(|ip| SocketAddr::new(IpAddr::V4(ip), port))
                        .collect());
                }
            }
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("DNS server {} did not answer", self.server),
            ))
        })
    }
}

fn invalid(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// A recursive A/IN query for `name` (RFC 1035 §4.1).
pub fn encode_query(id: u16, name: &str) -> io::Result<Vec<u8>> {
    let name = name.trim_end_matches('.');
    let mut message = Vec::with_capacity(18 + name.len());
    message.extend_from_slice(&id.to_be_bytes());
    // Flags: a standard query, recursion desired; one question.
    message.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name:?} is not a DNS name"),
            ));
        }
        message.push(label.len() as u8);
        message.extend_from_slice(label.as_bytes());
    }
    if message.len() - 12 > 254 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
    }
    // End of name; QTYPE A, QCLASS IN.
    message.extend_from_slice(&[0, 0, 1, 0, 1]);
    Ok(message)
}

/// The A records of an answer to query `id`: `None` when the message answers another
/// query, an empty list for NXDOMAIN or no records, an error for a failed or malformed
/// answer.
pub fn decode_answer(id: u16, message: &[u8]) -> io::Result<Option<Vec<Ipv4Addr>>> {
    if message.len() < 12 || message[..2] != id.to_be_bytes() || message[2] & 0x80 == 0 {
        return Ok(None);
    }
    match message[3] & 0x0f {
        0 => {}
        3 => return Ok(Some(Vec::new())),
        rcode => {
            return Err(io::Error::other(format!(
                "the DNS server answered rcode {rcode}"
            )));
        }
    }
    let count = |at: usize| u16::from_be_bytes([message[at], message[at + 1]]);
    let (questions, answers) = (count(4), count(6));
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(message, at)? + 4;
    }
    let mut addresses = Vec::new();
    for _ in 0..answers {
        at = skip_name(message, at)?;
        let fixed = message
            .get(at..at + 10)
            .ok_or_else(|| invalid("truncated record"))?;
        let (kind, class) = (
            u16::from_be_bytes([fixed[0], fixed[1]]),
            u16::from_be_bytes([fixed[2], fixed[3]]),
        );
        let length = usize::from(u16::from_be_bytes([fixed[8], fixed[9]]));
        at += 10;
        let data = message
            .get(at..at + length)
            .ok_or_else(|| invalid("truncated record data"))?;
        // CNAMEs are followed by the A records of their target in the same answer.
        if kind == 1 && class == 1 && length == 4 {
            addresses.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
        }
        at += length;
    }
    Ok(Some(addresses))
}

/// The offset just past the (possibly compressed) name at `at`.
fn skip_name(message: &[u8], mut at: usize) -> io::Result<usize> {
    loop {
        let length = *message.get(at).ok_or_else(|| invalid("truncated name"))?;
        match length {
            0 => return Ok(at + 1),
            // A pointer ends the name.
            l if l & 0xc0 == 0xc0 => return Ok(at + 2),
            l => at += 1 + usize::from(l),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_encoded_as_rfc_1035_says() {
        let query = encode_query(0xabcd, "api.test.").expect("encode");
        assert_eq!(
            query,
            [
                0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 3, b'a', b'p', b'i', 4, b't', b'e', b's',
                b't', 0, 0, 1, 0, 1
            ]
        );
        assert!(encode_query(1, "a..b").is_err());
        assert!(encode_query(1, &"x".repeat(64)).is_err());
    }

    #[test]
    fn an_answer_yields_its_a_records_and_skips_others() {
        let mut answer = encode_query(7, "api.test").expect("encode");
        answer[2] = 0x81;
        answer[3] = 0x80;
        answer[7] = 3;
        // A CNAME (type 5) record, then two A records, all naming the question by pointer.
        answer.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 9, 0, 2, 0xc0, 12]);
        for last in [2, 3] {
            answer.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 9, 0, 4, 127, 0, 0, last]);
        }
        assert_eq!(
            decode_answer(7, &answer).expect("decode"),
            Some(vec![
                Ipv4Addr::new(127, 0, 0, 2),
                Ipv4Addr::new(127, 0, 0, 3)
            ])
        );
        assert_eq!(decode_answer(8, &answer).expect("other id"), None);
        let cut = &answer[..answer.len() - 2];
        assert!(decode_answer(7, cut).is_err());
        answer[3] = 0x83;
        assert_eq!(decode_answer(7, &answer).expect("nxdomain"), Some(vec![]));
        answer[3] = 0x82;
        assert!(decode_answer(7, &answer).is_err(), "SERVFAIL is a failure");
    }
}
