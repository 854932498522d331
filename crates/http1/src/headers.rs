//! Header helpers both sides share: what each header is to the gateway ([`Kind`]), which
//! of a message's headers describe one hop only ([`HopByHop`]), comma-separated lists,
//! `Content-Length` values and transfer codings, and writing a header line.

/// What a header is to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `Host`: replaced by the replica's.
    Host,
    /// `Content-Length`: the body is re-framed.
    ContentLength,
    /// `Transfer-Encoding`: the body is re-framed.
    TransferEncoding,
    /// `Connection`: one hop only, and names others that are.
    Connection,
    /// The rest of the fixed hop-by-hop list (RFC 9110 §7.6.1) and `Proxy-Connection`.
    HopByHop,
    /// `Expect`: answered here (100 Continue), not forwarded.
    Expect,
    /// `Authorization`: verified here; backends trust the signed identity only.
    Authorization,
    /// `X-Request-Id`.
    RequestId,
    /// `X-Forwarded-For`.
    ForwardedFor,
    /// `X-Forwarded-Proto`.
    ForwardedProto,
    /// `traceparent`.
    Traceparent,
    /// `tracestate`.
    Tracestate,
    /// One of the identity headers backends read (`seckill_auth::identity::IDENTITY_HEADERS`): never
    /// taken from a client.
    Identity,
    /// Anything else: forwarded as it came, unless `Connection` names it.
    Other,
}

impl Kind {
    /// The kind of the header `name` (any case).
    pub fn of(name: &[u8]) -> Self {
        let mut lower = [0u8; 24];
        let Some(lower) = lower.get_mut(..name.len()) else {
            return Self::Other;
        };
        for (to, from) in lower.iter_mut().zip(name) {
            *to = from.to_ascii_lowercase();
        }
        match &*lower {
            b"host" => Self::Host,
            b"content-length" => Self::ContentLength,
            b"transfer-encoding" => Self::TransferEncoding,
            b"connection" => Self::Connection,
            b"keep-alive"
            | b"proxy-connection"
            | b"te"
            | b"trailer"
            | b"upgrade"
            | b"proxy-authorization"
            | b"proxy-authenticate" => Self::HopByHop,
            b"expect" => Self::Expect,
            b"authorization" => Self::Authorization,
            b"x-request-id" => Self::RequestId,
            b"x-forwarded-for" => Self::ForwardedFor,
            b"x-forwarded-proto" => Self::ForwardedProto,
            b"traceparent" => Self::Traceparent,
            b"tracestate" => Self::Tracestate,
            b"x-user-id" | b"x-user-roles" | b"x-identity-ts" | b"x-identity-sig" => Self::Identity,
            _ => Self::Other,
        }
    }
}

/// Which of a message's headers describe one hop only (RFC 9110 §7.6.1): the fixed list,
/// with the obsolete `Proxy-Connection`, and whatever its `Connection` headers name. The
/// same rule for requests going to a replica and responses coming back.
#[derive(Debug)]
pub struct HopByHop<'a> {
    /// Names `Connection` lists beyond the fixed list: usually none (and then no allocation).
    named: Vec<&'a [u8]>,
}

impl<'a> HopByHop<'a> {
    /// The hop-by-hop headers of a message whose `Connection` values are `connection`.
    pub fn of(connection: impl Iterator<Item = &'a [u8]>) -> Self {
        let named = list_items(connection)
            .filter(|name| !name.is_empty() && !is_listed(name))
            .collect();
        Self { named }
    }

    /// Whether the header `name` is one of them.
    pub fn contains(&self, name: &[u8]) -> bool {
        is_listed(name) || self.named_by_connection(name)
    }

    /// Whether `Connection` names the header `name` (for a header already known not to be
    /// on the fixed list).
    pub fn named_by_connection(&self, name: &[u8]) -> bool {
        self.named.iter().any(|n| n.eq_ignore_ascii_case(name))
    }
}

/// Whether `name` is on the fixed hop-by-hop list.
fn is_listed(name: &[u8]) -> bool {
    matches!(
        Kind::of(name),
        Kind::Connection | Kind::HopByHop | Kind::TransferEncoding
    )
}

/// The items of comma-separated header values (RFC 9110 §5.6.1), trimmed.
pub fn list_items<'a>(values: impl Iterator<Item = &'a [u8]>) -> impl Iterator<Item = &'a [u8]> {
    values
        .flat_map(|v| v.split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
}

/// Whether the last transfer coding, over every `Transfer-Encoding` line, is `chunked`.
pub fn last_coding_is_chunked<'a>(values: impl Iterator<Item = &'a [u8]>) -> bool {
    let last = list_items(values).filter(|c| !c.is_empty()).last();
    last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked"))
}

/// The value of `Content-Length` headers: every value (and every comma-separated entry)
/// digits only and all equal; `None` when malformed or conflicting (RFC 9110 §8.6).
pub fn content_length<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<u64> {
    let mut length = None;
    for value in values {
        for entry in value.split(|&b| b == b',') {
            let entry = entry.trim_ascii();
            if entry.is_empty() || entry.len() > 19 || !entry.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let parsed = entry.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
            if length.is_some_and(|seen| seen != parsed) {
                return None;
            }
            length = Some(parsed);
        }
    }
    length
}

/// Appends the header line `name: value\r\n` to `out`. The caller vouches that the name is
/// a token and the value holds no CR or LF.
pub fn header_line(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_lengths_must_be_digits_and_agree() {
        let of = |values: &[&'static str]| content_length(values.iter().map(|v| v.as_bytes()));
        assert_eq!(of(&["42"]), Some(42));
        assert_eq!(of(&["7", "7"]), Some(7));
        assert_eq!(of(&["7, 7"]), Some(7));
        for bad in [
            &["2", "10"][..],
            &["+2"],
            &["-1"],
            &[""],
            &["1 2"],
            &["0x10"],
            &["99999999999999999999"],
            &["3,"],
        ] {
            assert_eq!(of(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn every_identity_header_a_backend_reads_is_classified_as_identity() {
        for name in seckill_auth::identity::IDENTITY_HEADERS {
            assert_eq!(Kind::of(name.as_str().as_bytes()), Kind::Identity, "{name}");
            assert_eq!(
                Kind::of(name.as_str().to_uppercase().as_bytes()),
                Kind::Identity
            );
        }
        assert_eq!(Kind::of(b"X-Request-ID"), Kind::RequestId);
        assert_eq!(
            Kind::of(b"x-a-header-name-longer-than-the-buffer"),
            Kind::Other
        );
    }
}
