//! What the gateway changes in the messages it forwards.
//!
//! A request goes to a replica as bytes written straight from the client's head: its
//! request line, the replica's `Host`, every end-to-end header as it came, then the
//! gateway's own — `X-Forwarded-For` (the client's list plus the peer), `X-Forwarded-Proto`
//! (`https` only when a trusted proxy says so), `X-Request-Id`, a W3C `traceparent` (the
//! client's trace if well formed, else a new trace, its `tracestate` dropped; the parent
//! is the gateway's request span either way) and the signed
//! identity, bound to this request line, request id, body and target service
//! ([`seckill_auth::identity::credential`]) — and the body framed by its `Content-Length`. Never forwarded: hop-by-hop
//! headers and those `Connection` names, the client's `Authorization` (backends trust only
//! the signed identity), any identity header the client sent, `Expect` (answered here), and
//! the client's framing.
//!
//! A response comes back with its end-to-end headers only ([`seckill_http1::HopByHop`], the
//! same rule as on the way out).

use std::io::Write;
use std::net::SocketAddr;

use axum::http::Method;

use seckill_auth::{IdentitySigner, RequestFacts};
use seckill_http1::{Kind, RequestHead, header_line};
use seckill_telemetry::{Planned, TraceParent};

use crate::auth::Caller;
use crate::client_ip::TrustedProxies;

/// A request on its way to a replica: everything its bytes are written from.
#[derive(Debug, Clone, Copy)]
pub struct Forward<'a> {
    /// The client's head.
    pub head: &'a RequestHead,
    /// The target written to the replica and signed: the client's, or the one the gateway
    /// put in its place (a purchase's, `crate::room`).
    pub target: &'a str,
    /// The body, read whole.
    pub body: &'a [u8],
    /// The socket peer.
    pub peer: SocketAddr,
    /// Whose `X-Forwarded-Proto` is believed.
    pub trusted: &'a TrustedProxies,
    /// The request id, kept or made by the pipeline.
    pub request_id: &'a [u8],
    /// The trace context travelling on.
    pub trace: &'a TraceContext,
    /// The verified caller, signed for the backend.
    pub caller: &'a Caller,
    /// Signs the identity for the service the request goes to.
    pub signer: &'a IdentitySigner,
}

impl Forward<'_> {
    /// The request as written to the replica whose authority is `host`.
    pub fn encode(&self, host: &[u8]) -> Vec<u8> {
        let head = self.head;
        let mut out = Vec::with_capacity(512 + self.body.len());
        out.extend_from_slice(head.method().as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        header_line(&mut out, b"host", host);
        for (name, value) in head.end_to_end() {
            header_line(&mut out, name, value);
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        for previous in head.values(Kind::ForwardedFor) {
            out.extend_from_slice(previous);
            out.extend_from_slice(b", ");
        }
        let peer = self.peer.ip().to_canonical();
        // Writing into a Vec cannot fail.
        let _ = write!(out, "{peer}\r\n");
        // The gateway listens on plain HTTP; only a trusted proxy in front (which ended TLS)
        // can say the client used https.
        let proto = head
            .value(Kind::ForwardedProto)
            .filter(|_| self.trusted.trusts(peer))
            .filter(|v| *v == b"https" || *v == b"http")
            .unwrap_or(b"http");
        header_line(&mut out, b"x-forwarded-proto", proto);
        header_line(&mut out, b"x-request-id", self.request_id);
        self.trace.write(&mut out, head);
        // Bound to the request as written: the target and request id above, the body below.
        let facts = RequestFacts {
            method: head.method().as_str(),
            target: self.target,
            request_id: std::str::from_utf8(self.request_id).unwrap_or(""),
            body: self.body,
        };
        self.signer.write_lines(
            &mut out,
            self.caller.user_id,
            &self.caller.roles_joined,
            &facts,
        );
        let carries_body = !self.body.is_empty()
            || matches!(*head.method(), Method::POST | Method::PUT | Method::PATCH);
        if carries_body {
            let mut length = itoa::Buffer::new();
            header_line(
                &mut out,
                b"content-length",
                length.format(self.body.len()).as_bytes(),
            );
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(self.body);
        out
    }
}

/// The W3C trace context a forwarded request carries: the trace of the client's
/// `traceparent` when it is well formed (its `tracestate` forwarded), otherwise a new
/// sampled trace (a `tracestate` belonged to the discarded trace and is dropped). Either
/// way the parent named to the replica is the gateway's own request span.
#[derive(Debug, Clone, Copy)]
pub struct TraceContext {
    /// The `traceparent` sent to the replica.
    onwards: TraceParent,
    /// Whether the client's trace is continued (so its `tracestate` goes along).
    kept: bool,
}

impl TraceContext {
    /// The context of a request with `head`, which continues `received` (its
    /// `traceparent`, parsed) as `planned` says ([`seckill_telemetry::plan`]): through
    /// `span` when the request is exported (its `trace_id` field recorded; see
    /// [`seckill_telemetry::continue_trace`]), else the plan's own context.
    pub fn start(
        head: &RequestHead,
        received: Option<&TraceParent>,
        planned: &Planned,
        span: Option<&tracing::Span>,
    ) -> Self {
        let onwards = match span {
            Some(span) => {
                // Only read when spans are exported: the state rides along in the header anyway.
                let state = match received {
                    Some(_) if seckill_telemetry::exporting() => head
                        .value(Kind::Tracestate)
                        .and_then(|v| std::str::from_utf8(v).ok()),
                    _ => None,
                };
                planned.continue_in(span, received, state)
            }
            None => planned.onwards,
        };
        Self {
            onwards,
            kept: received.is_some(),
        }
    }

    /// The `traceparent` value sent on.
    pub fn value(&self) -> seckill_telemetry::trace_context::HeaderText {
        self.onwards.header()
    }

    /// The trace id, for the logs.
    pub fn trace_id(&self) -> seckill_telemetry::trace_context::TraceIdText {
        self.onwards.trace_id_hex()
    }

    fn write(&self, out: &mut Vec<u8>, head: &RequestHead) {
        header_line(out, b"traceparent", self.value().as_bytes());
        if self.kept {
            for state in head.values(Kind::Tracestate) {
                header_line(out, b"tracestate", state);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;

    use super::*;
    use seckill_http1::HeadLimits;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn head(text: &str) -> RequestHead {
        let limits = HeadLimits {
            max_header_bytes: 4096,
            max_headers: 32,
        };
        RequestHead::parse(&mut BytesMut::from(text), limits)
            .expect("valid")
            .expect("complete")
    }

    fn caller() -> Caller {
        Caller {
            user_id: 42,
            roles: vec!["admin".into()],
            roles_joined: "admin".into(),
        }
    }

    /// The context of a request with `head`, planned as the pipeline does (export is off in
    /// these tests: no span).
    fn start(head: &RequestHead) -> TraceContext {
        let received = head.value(Kind::Traceparent).and_then(TraceParent::parse);
        let planned = seckill_telemetry::plan(received.as_ref());
        assert!(!planned.exported);
        TraceContext::start(head, received.as_ref(), &planned, None)
    }

    /// The forwarded request of `text` from `peer`, as text, with a new trace unless the
    /// client sent a valid one.
    fn forwarded(text: &str, peer: &str, trusted: &str, body: &[u8]) -> String {
        let head = head(text);
        let trace = start(&head);
        let forward = Forward {
            head: &head,
            target: head.target(),
            body,
            peer: peer.parse().expect("peer"),
            trusted: &TrustedProxies::parse(trusted).expect("trusted"),
            request_id: b"rid-1",
            trace: &trace,
            caller: &caller(),
            signer: &IdentitySigner::new("k", "seckill-api"),
        };
        String::from_utf8(forward.encode(b"replica:8081")).expect("text")
    }

    /// The header lines of a forwarded request, without the identity's time and signature.
    fn lines(request: &str) -> Vec<&str> {
        let head = request.split("\r\n\r\n").next().expect("head");
        head.split("\r\n")
            .filter(|l| !l.starts_with("x-identity-"))
            .collect()
    }

    #[test]
    fn a_request_is_written_with_the_gateways_headers_and_its_own_framing() {
        let request = forwarded(
            "POST /api/seckill/7?x=1 HTTP/1.1\r\nHost: client.example\r\nX-Custom: a\r\n\
             Authorization: Bearer secret\r\nX-User-Id: 1\r\nx-identity-sig: forged\r\n\
             Content-Length: 2\r\nExpect: 100-continue\r\nConnection: keep-alive\r\n\
             X-Request-Id: from-client\r\nTraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\
             Tracestate: v=1\r\n\r\n",
            "203.0.113.5:5000",
            "",
            b"{}",
        );
        // The client's trace, with the gateway's span as the parent.
        let sent = request
            .split("\r\n")
            .find_map(|l| l.strip_prefix("traceparent: "))
            .expect("a traceparent");
        let sent = TraceParent::parse_str(sent).expect("valid");
        let received = TraceParent::parse_str(VALID).expect("valid");
        assert_eq!(sent.trace_id, received.trace_id);
        assert_ne!(sent.span_id, received.span_id);
        assert_eq!(sent.flags, received.flags);
        let sent = sent.header();
        assert_eq!(
            lines(&request),
            [
                "POST /api/seckill/7?x=1 HTTP/1.1",
                "host: replica:8081",
                "X-Custom: a",
                "x-forwarded-for: 203.0.113.5",
                "x-forwarded-proto: http",
                "x-request-id: rid-1",
                &format!("traceparent: {}", sent.as_str()),
                "tracestate: v=1",
                "x-user-id: 42",
                "x-user-roles: admin",
                "content-length: 2",
            ]
        );
        assert!(request.ends_with("\r\n\r\n{}"));
        assert_eq!(
            request.matches("x-identity-sig").count(),
            1,
            "the gateway's only"
        );
    }

    #[test]
    fn forwarded_headers_record_the_peer_and_only_a_trusted_scheme() {
        let text = "GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 1.2.3.4\r\n\
                    X-Forwarded-For: 5.6.7.8\r\nX-Forwarded-Proto: https\r\n\r\n";
        let trusted = forwarded(text, "10.0.0.1:5000", "10.0.0.1", b"");
        assert!(trusted.contains("\r\nx-forwarded-for: 1.2.3.4, 5.6.7.8, 10.0.0.1\r\n"));
        assert!(trusted.contains("\r\nx-forwarded-proto: https\r\n"));
        assert!(!trusted.contains("content-length"), "a GET without a body");
        let untrusted = forwarded(text, "203.0.113.5:5000", "10.0.0.1", b"");
        assert!(untrusted.contains("\r\nx-forwarded-proto: http\r\n"));
        let mapped = forwarded(
            "GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            "[::ffff:10.0.0.9]:1",
            "",
            b"",
        );
        assert!(mapped.contains("\r\nx-forwarded-for: 10.0.0.9\r\n"));
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
            let text = format!(
                "GET / HTTP/1.1\r\nHost: x\r\ntraceparent: {bad}\r\ntracestate: v=1\r\n\r\n"
            );
            let request = forwarded(&text, "127.0.0.1:1", "", b"");
            assert!(!request.contains(bad), "{bad}");
            assert!(!request.contains("tracestate"), "{bad}");
            let value = request
                .split("\r\n")
                .find_map(|l| l.strip_prefix("traceparent: "))
                .expect("a traceparent");
            assert!(TraceParent::parse_str(value).is_some(), "{value}");
        }
    }

    #[test]
    fn new_traces_are_valid_and_distinct() {
        let head = head("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100 {
            let trace = start(&head);
            let value = trace.value();
            let parsed = TraceParent::parse(value.as_bytes()).expect("valid");
            assert_eq!(parsed.trace_id_hex(), trace.trace_id());
            assert!(value.as_str().starts_with("00-") && value.as_str().ends_with("-01"));
            seen.insert(parsed.trace_id);
        }
        assert_eq!(seen.len(), 100, "every new trace has ids of its own");
        let kept = head_with_trace();
        assert_eq!(
            start(&kept).trace_id().as_str(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    fn head_with_trace() -> RequestHead {
        head(&format!(
            "GET / HTTP/1.1\r\nHost: x\r\ntraceparent: {VALID}\r\n\r\n"
        ))
    }
}
