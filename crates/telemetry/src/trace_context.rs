//! W3C trace context (`traceparent`), parsed and written without allocating, so the
//! gateway can continue a trace on its hot path and the services can record the trace id
//! whether spans are exported or not.

use std::fmt;

/// The length of a version-00 `traceparent` value.
pub const TRACEPARENT_LEN: usize = 55;

/// The `traceparent` header or field name.
pub const TRACEPARENT: &str = "traceparent";
/// The `tracestate` header or field name.
pub const TRACESTATE: &str = "tracestate";

/// A parsed `traceparent`: the trace, the span that is the parent of whatever continues
/// it, and the flags (bit 0: sampled).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The parent span id (never all zero).
    pub span_id: [u8; 8],
    /// The trace flags.
    pub flags: u8,
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.header().as_str())
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.header().as_str())
    }
}

impl TraceParent {
    /// Parses a `traceparent` value (W3C Trace Context §3.2). Version `00` must be exactly
    /// 55 characters; a later version is read by its first four fields, as the spec asks;
    /// version `ff`, upper-case hex, all-zero ids or a wrong length are refused (`None`).
    pub fn parse(value: &[u8]) -> Option<Self> {
        if value.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_byte(&value[0..2])?;
        match version {
            0xff => return None,
            0x00 if value.len() != TRACEPARENT_LEN => return None,
            // A later version may append fields, after a dash.
            _ if value.len() > TRACEPARENT_LEN && value[TRACEPARENT_LEN] != b'-' => return None,
            _ => {}
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        for (i, byte) in trace_id.iter_mut().enumerate() {
            *byte = hex_byte(&value[3 + 2 * i..5 + 2 * i])?;
        }
        for (i, byte) in span_id.iter_mut().enumerate() {
            *byte = hex_byte(&value[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&value[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// [`TraceParent::parse`] of a text value.
    pub fn parse_str(value: &str) -> Option<Self> {
        Self::parse(value.as_bytes())
    }

    /// A new sampled trace, with a random trace id and span id.
    pub fn new_root() -> Self {
        Self {
            trace_id: nonzero(rand::random()),
            span_id: nonzero(rand::random()),
            flags: 0x01,
        }
    }

    /// The same trace and flags with a new random span id: the context of a span whose
    /// parent is `self`.
    pub fn child(&self) -> Self {
        Self {
            span_id: nonzero(rand::random()),
            ..*self
        }
    }

    /// Whether the sampled flag is set.
    pub fn sampled(&self) -> bool {
        self.flags & 0x01 == 0x01
    }

    /// The version-00 header value.
    pub fn header(&self) -> HeaderText {
        let mut out = *b"00-00000000000000000000000000000000-0000000000000000-00";
        write_hex(&self.trace_id, &mut out[3..35]);
        write_hex(&self.span_id, &mut out[36..52]);
        write_hex(&[self.flags], &mut out[53..55]);
        HeaderText(out)
    }

    /// The trace id as 32 lower-case hex digits (how it appears in logs).
    pub fn trace_id_hex(&self) -> TraceIdText {
        let mut out = [0u8; 32];
        write_hex(&self.trace_id, &mut out);
        TraceIdText(out)
    }
}

/// A `traceparent` value on the stack.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HeaderText([u8; TRACEPARENT_LEN]);

impl HeaderText {
    /// The value as text.
    pub fn as_str(&self) -> &str {
        // Written as ASCII hex and dashes only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }

    /// The value as bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for HeaderText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A trace id as hex on the stack.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TraceIdText([u8; 32]);

impl TraceIdText {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl fmt::Debug for TraceIdText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for TraceIdText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn nonzero<const N: usize>(mut id: [u8; N]) -> [u8; N] {
    // All-zero ids are invalid (W3C Trace Context §3.2.2.3-4).
    id[N - 1] |= 1;
    id
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex_byte(pair: &[u8]) -> Option<u8> {
    Some(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?)
}

fn write_hex(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (byte, pair) in bytes.iter().zip(out.chunks_exact_mut(2)) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0x0f)];
    }
}

/// The longest `trace_id` kept (a W3C trace id has 32 characters).
const MAX_TRACE_ID: usize = 64;

/// A span's trace id, as recorded in its `trace_id` field (or a request scope's): kept in
/// place, so that recording it allocates nothing beyond the span's extension.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpanTraceId {
    len: u8,
    text: [u8; MAX_TRACE_ID],
}

impl SpanTraceId {
    /// Only a plain id, 1 to [`MAX_TRACE_ID`] letters and digits: it is written into the
    /// JSON line unescaped.
    pub(crate) fn new(value: &str) -> Option<Self> {
        let len = value.len();
        if len == 0 || len > MAX_TRACE_ID || !value.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let mut text = [0; MAX_TRACE_ID];
        text[..len].copy_from_slice(value.as_bytes());
        Some(Self {
            len: len as u8,
            text,
        })
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.text[..usize::from(self.len)]).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let parsed = TraceParent::parse_str(VALID).expect("valid");
        assert_eq!(
            parsed.trace_id_hex().as_str(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(
            parsed.span_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert!(parsed.sampled());
        assert_eq!(parsed.header().as_str(), VALID);
        let unsampled = TraceParent::parse_str(&VALID.replace("-01", "-00")).expect("valid");
        assert!(!unsampled.sampled());
        assert_eq!(unsampled.header().as_str(), VALID.replace("-01", "-00"));
    }

    #[test]
    fn invalid_versions_lengths_and_ids_are_refused() {
        for bad in [
            "",
            "garbage",
            // Version ff is forbidden; 00 has exactly four fields.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // All-zero trace or span id.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Upper case, wrong separators, short fields.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            // A later version with something glued on without a dash.
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
        ] {
            assert_eq!(TraceParent::parse_str(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        let parsed = TraceParent::parse_str(later).expect("forward compatible");
        // Continued as version 00, the only one this writes.
        assert_eq!(parsed.header().as_str(), VALID);
    }

    #[test]
    fn new_roots_and_children_are_valid_and_distinct() {
        let root = TraceParent::new_root();
        assert!(root.sampled());
        assert_eq!(TraceParent::parse(root.header().as_bytes()), Some(root));
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_eq!(child.flags, root.flags);
        let roots: std::collections::HashSet<_> =
            (0..100).map(|_| TraceParent::new_root().trace_id).collect();
        assert_eq!(roots.len(), 100);
    }
}
