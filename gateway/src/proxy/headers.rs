//! What the gateway changes in the headers it forwards: hop-by-hop headers out, client
//! address and scheme recorded, a W3C `traceparent` guaranteed.

use std::net::SocketAddr;

use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::client_ip::TrustedProxies;

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1), with the
/// obsolete `Proxy-Connection`. Bodies are read whole before they are forwarded, so each
/// hop frames its own (`Content-Length`). `Connection` comes first: it also names others.
const HOP_BY_HOP: [HeaderName; 9] = [
    HeaderName::from_static("connection"),
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-authenticate"),
    HeaderName::from_static("proxy-authorization"),
    HeaderName::from_static("te"),
    HeaderName::from_static("trailer"),
    HeaderName::from_static("transfer-encoding"),
    HeaderName::from_static("upgrade"),
    HeaderName::from_static("proxy-connection"),
];
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// The W3C trace context header.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// Removes the headers that describe one hop only: the fixed list and every header the
/// `Connection` header names (RFC 9110 §7.6.1).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most requests carry none: one pass over the names instead of a removal per name.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name)) {
        return;
    }
    let values = headers.get_all(&HOP_BY_HOP[0]).into_iter();
    let named: Vec<HeaderName> = list_items(values.map(HeaderValue::as_bytes))
        .filter_map(|name| HeaderName::from_bytes(name.as_bytes()).ok())
        .collect();
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// Which of a message's raw headers describe one hop only: those on the fixed list, and
/// those its `Connection` headers name.
pub struct HopByHop<'a> {
    headers: &'a [httparse::Header<'a>],
    /// A `Connection` header names something beyond the fixed list.
    names_others: bool,
}

impl<'a> HopByHop<'a> {
    /// The hop-by-hop headers among `headers`.
    pub fn of(headers: &'a [httparse::Header<'a>]) -> Self {
        let names_others = connection_names(headers).any(|named| !is_listed(named));
        Self {
            headers,
            names_others,
        }
    }

    /// Whether the header `name` is one of them.
    pub fn contains(&self, name: &str) -> bool {
        is_listed(name)
            || (self.names_others
                && connection_names(self.headers).any(|named| named.eq_ignore_ascii_case(name)))
    }
}

/// Whether `name` is on the fixed hop-by-hop list.
fn is_listed(name: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|hop| name.eq_ignore_ascii_case(hop.as_str()))
}

/// The names the `Connection` headers among `headers` list.
fn connection_names<'h>(headers: &'h [httparse::Header<'_>]) -> impl Iterator<Item = &'h str> {
    let values = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(HOP_BY_HOP[0].as_str()))
        .map(|h| h.value);
    list_items(values)
}

/// The items of comma-separated header values (RFC 9110 §5.6.1), trimmed; a value that is
/// not text lists nothing.
pub fn list_items<'a>(values: impl Iterator<Item = &'a [u8]>) -> impl Iterator<Item = &'a str> {
    values
        .filter_map(|v| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Drops hop-by-hop headers and the client's token (backends trust only the signed
/// identity), records the client address and scheme, and makes sure a trace context travels
/// on. Returns the trace id, for the logs. (`Host` and the body's framing are the pool's to
/// write: it skips the client's.)
pub fn prepare(headers: &mut HeaderMap, peer: SocketAddr, trusted: &TrustedProxies) -> TraceId {
    strip_hop_by_hop(headers);
    headers.remove(AUTHORIZATION);
    let forwarded_for = match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(previous) => format!("{previous}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    if let Ok(value) = HeaderValue::try_from(forwarded_for) {
        headers.insert(X_FORWARDED_FOR, value);
    }
    // The gateway listens on plain HTTP; only a trusted proxy in front (which ended TLS) can
    // say the client used https.
    let proto = headers
        .get(&X_FORWARDED_PROTO)
        .filter(|_| trusted.trusts(peer.ip().to_canonical()))
        .filter(|v| *v == "https" || *v == "http")
        .cloned()
        .unwrap_or(HeaderValue::from_static("http"));
    headers.insert(X_FORWARDED_PROTO, proto);
    ensure_traceparent(headers)
}

/// A W3C trace id: 32 lower-case hex digits, kept by value (no allocation per request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceId([u8; 32]);

impl TraceId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

/// The trace id of a well-formed `traceparent` in `headers`.
fn trace_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(&TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .and_then(trace_id_of)
}

/// Keeps a caller's well-formed `traceparent` (the gateway records no spans of its own, so
/// the caller's span stays the parent); otherwise starts a trace, sampled, and drops any
/// `tracestate` that belonged to the discarded one. Returns the trace id.
fn ensure_traceparent(headers: &mut HeaderMap) -> TraceId {
    if let Some(kept) = trace_id(headers) {
        return TraceId(
            kept.as_bytes()
                .try_into()
                .expect("trace_id_of checked 32 digits"),
        );
    }
    headers.remove(&TRACESTATE);
    let mut value = *b"00-00000000000000000000000000000000-0000000000000000-01";
    // Zero ids are invalid (W3C trace context §3.2.2.3-4); `| 1` rules them out.
    let (mut trace_id, mut parent_id) = (rand::random::<[u8; 16]>(), rand::random::<[u8; 8]>());
    trace_id[15] |= 1;
    parent_id[7] |= 1;
    seckill_http::write_hex(&trace_id, &mut value[3..35]);
    seckill_http::write_hex(&parent_id, &mut value[36..52]);
    headers.insert(
        TRACEPARENT,
        HeaderValue::from_bytes(&value).expect("hex and dashes"),
    );
    TraceId(value[3..35].try_into().expect("32 digits"))
}

/// The trace id of a version-00 `traceparent`, if it is well formed.
fn trace_id_of(value: &str) -> Option<&str> {
    let lower_hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let mut parts = value.split('-');
    let (version, trace_id, parent_id, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none()
        && version == "00"
        && lower_hex(trace_id, 32)
        && lower_hex(parent_id, 16)
        && lower_hex(flags, 2)
        && trace_id.bytes().any(|b| b != b'0')
        && parent_id.bytes().any(|b| b != b'0');
    ok.then_some(trace_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn peer(text: &str) -> SocketAddr {
        text.parse().expect("socket addr")
    }

    #[test]
    fn a_valid_traceparent_is_kept_and_a_missing_one_is_created() {
        let mut headers = HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(VALID));
        let kept = ensure_traceparent(&mut headers);
        assert_eq!(headers[&TRACEPARENT], VALID);
        assert_eq!(kept.as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");

        let mut created = std::collections::HashSet::new();
        for _ in 0..100 {
            let mut headers = HeaderMap::new();
            let made = ensure_traceparent(&mut headers);
            let value = headers[&TRACEPARENT].to_str().expect("ascii").to_string();
            assert_eq!(trace_id_of(&value), Some(made.as_str()), "{value}");
            assert!(value.starts_with("00-") && value.ends_with("-01"));
            created.insert(value);
        }
        assert_eq!(created.len(), 100, "every new trace has ids of its own");
    }

    #[test]
    fn a_malformed_traceparent_is_replaced_with_its_tracestate_dropped() {
        for bad in [
            "garbage",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(TRACEPARENT, HeaderValue::from_static(bad));
            headers.insert(TRACESTATE, HeaderValue::from_static("vendor=1"));
            ensure_traceparent(&mut headers);
            let now = headers[&TRACEPARENT].to_str().expect("ascii");
            assert_ne!(now, bad);
            assert!(trace_id_of(now).is_some(), "{bad} -> {now}");
            assert!(!headers.contains_key(&TRACESTATE));
        }
    }

    #[test]
    fn forwarded_headers_record_the_peer_and_only_a_trusted_scheme() {
        let trusted = TrustedProxies::parse("10.0.0.1").expect("parse");
        let mut headers = HeaderMap::new();
        headers.insert(X_FORWARDED_FOR, HeaderValue::from_static("1.2.3.4"));
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        headers.insert(AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        headers.insert("connection", HeaderValue::from_static("close, x-hop"));
        headers.insert("x-hop", HeaderValue::from_static("1"));
        headers.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        prepare(&mut headers, peer("10.0.0.1:5000"), &trusted);
        assert!(
            !headers.contains_key("x-hop"),
            "named by Connection: one hop only"
        );
        assert!(!headers.contains_key("proxy-connection"));
        assert_eq!(headers[&X_FORWARDED_FOR], "1.2.3.4, 10.0.0.1");
        assert_eq!(headers[&X_FORWARDED_PROTO], "https");
        assert!(!headers.contains_key(AUTHORIZATION));
        assert!(!headers.contains_key("connection"));

        let mut headers = HeaderMap::new();
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("https"));
        prepare(&mut headers, peer("203.0.113.5:5000"), &trusted);
        assert_eq!(
            headers[&X_FORWARDED_PROTO], "http",
            "an untrusted peer cannot claim https"
        );
        assert_eq!(headers[&X_FORWARDED_FOR], "203.0.113.5");
    }
}
