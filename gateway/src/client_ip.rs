//! Who the client is, as far as the network can tell: the socket peer, or — only when that
//! peer is a configured trusted proxy — the address that proxy vouches for in
//! `X-Forwarded-For`.
//!
//! Each proxy appends the address it received the request from, so the entries a client can
//! forge are on the left and the trustworthy ones on the right. Walking from the right and
//! skipping trusted hops, the first untrusted address is the client: whatever it wrote before
//! that is ignored, so a client cannot choose its own rate-limit bucket.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

use seckill_http1::list_items;

/// The proxies in front of the gateway whose `X-Forwarded-For` entries are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses a comma-separated list of CIDRs (`10.0.0.0/8`) or single addresses.
    pub fn parse(list: &str) -> Result<Self, String> {
        seckill_config::split_list(list)
            .iter()
            .map(|entry| {
                entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| format!("trusted_proxies entry {entry:?} is not an IP or CIDR"))
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The client address of a request that arrived from `peer` with the `X-Forwarded-For`
    /// values `forwarded_for`.
    pub fn client_ip<'a>(
        &self,
        peer: IpAddr,
        forwarded_for: impl Iterator<Item = &'a [u8]>,
    ) -> IpAddr {
        let peer = peer.to_canonical();
        if !self.trusts(peer) {
            return peer;
        }
        // Several X-Forwarded-For lines form one list, in order; an entry that is not text
        // is garbage like any other.
        let entries: Vec<&str> = list_items(forwarded_for)
            .map(|entry| std::str::from_utf8(entry).unwrap_or("?"))
            .collect();
        let mut nearest = peer;
        for entry in entries.iter().rev() {
            let Some(ip) = parse_entry(entry) else {
                // A trusted hop would have written an address; text here came from further
                // left than we can vouch for, so the nearest trusted hop is all we know.
                return nearest;
            };
            if !self.trusts(ip) {
                return ip;
            }
            nearest = ip;
        }
        // Every hop is trusted: the leftmost one is the furthest we can see.
        nearest
    }
}

/// One `X-Forwarded-For` entry: an address, possibly with a port (`1.2.3.4:5`, `[::1]:5`).
fn parse_entry(entry: &str) -> Option<IpAddr> {
    let entry = entry.trim();
    entry
        .parse::<IpAddr>()
        .or_else(|_| entry.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    fn xff(values: &[&'static str]) -> Vec<&'static [u8]> {
        values.iter().map(|v| v.as_bytes()).collect()
    }

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_it_forwards() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").expect("parse");
        let headers = xff(&["1.1.1.1, 2.2.2.2"]);
        assert_eq!(
            trusted.client_ip(ip("203.0.113.9"), headers.iter().copied()),
            ip("203.0.113.9")
        );
        let nobody = TrustedProxies::default();
        assert_eq!(
            nobody.client_ip(ip("10.0.0.1"), headers.iter().copied()),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn the_rightmost_untrusted_entry_is_the_client() {
        let trusted = TrustedProxies::parse("10.0.0.0/8, 192.168.1.1").expect("parse");
        // client forged 6.6.6.6; real client 198.51.100.7; then two trusted hops.
        let headers = xff(&["6.6.6.6, 198.51.100.7, 10.1.2.3"]);
        assert_eq!(
            trusted.client_ip(ip("192.168.1.1"), headers.iter().copied()),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn several_header_lines_are_one_list() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").expect("parse");
        let headers = xff(&["6.6.6.6", "198.51.100.7", "10.0.0.2"]);
        assert_eq!(
            trusted.client_ip(ip("10.0.0.1"), headers.iter().copied()),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn ports_and_ipv6_and_mapped_addresses_are_understood() {
        let trusted = TrustedProxies::parse("::1, 127.0.0.0/8").expect("parse");
        let headers = xff(&["[2001:db8::5]:4711, 127.0.0.1:80"]);
        assert_eq!(
            trusted.client_ip(ip("::1"), headers.iter().copied()),
            ip("2001:db8::5")
        );
        // An IPv4 peer seen on a dual-stack socket is still the trusted 127.0.0.1.
        let headers = xff(&["198.51.100.7"]);
        assert_eq!(
            trusted.client_ip(ip("::ffff:127.0.0.1"), headers.iter().copied()),
            ip("198.51.100.7")
        );
    }

    #[test]
    fn garbage_or_an_all_trusted_chain_stops_at_the_nearest_known_hop() {
        let trusted = TrustedProxies::parse("10.0.0.0/8").expect("parse");
        let headers = xff(&["198.51.100.7, not-an-ip, 10.0.0.3"]);
        assert_eq!(
            trusted.client_ip(ip("10.0.0.1"), headers.iter().copied()),
            ip("10.0.0.3")
        );
        let headers = xff(&["10.0.0.4, 10.0.0.3"]);
        assert_eq!(
            trusted.client_ip(ip("10.0.0.1"), headers.iter().copied()),
            ip("10.0.0.4")
        );
        assert_eq!(
            trusted.client_ip(ip("10.0.0.1"), std::iter::empty()),
            ip("10.0.0.1")
        );
    }

    #[test]
    fn bad_entries_are_refused_when_parsing() {
        assert!(TrustedProxies::parse("10.0.0.0/33").is_err());
        assert!(TrustedProxies::parse("proxy.local").is_err());
        assert!(TrustedProxies::parse("").expect("empty").0.is_empty());
    }
}
