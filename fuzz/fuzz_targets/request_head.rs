//! The request-head parser (`seckill_http1::request`) on arbitrary bytes. Beyond "no
//! panic": what it accepts is what `httparse` reads from the same bytes (method, version,
//! headers, length; the target reduced to origin form), the framing it derives follows from
//! the headers, a prefix of an accepted head is incomplete, never something else, and the
//! head written again from its parts parses to the same head.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use seckill_http1::{Framing, HeadError, HeadLimits, Kind, RequestHead, Version};

/// Small enough that inputs reach both limits (libFuzzer's inputs are up to 4 KiB).
const LIMITS: HeadLimits = HeadLimits {
    max_header_bytes: 2048,
    max_headers: 16,
};

fn parse(bytes: &[u8], limits: HeadLimits) -> (Result<Option<RequestHead>, HeadError>, BytesMut) {
    let mut buffer = BytesMut::from(bytes);
    let parsed = RequestHead::parse(&mut buffer, limits);
    (parsed, buffer)
}

fuzz_target!(|data: &[u8]| {
    let (parsed, rest) = parse(data, LIMITS);
    match parsed {
        Err(e) => {
            assert!(
                [400, 417, 431, 501].contains(&e.status.as_u16()),
                "unexpected status {e:?}"
            );
            assert!(!e.message.is_empty());
        }
        Ok(None) => {
            assert_eq!(
                &rest[..],
                data,
                "an incomplete head leaves the buffer alone"
            );
            assert!(
                data.len() <= LIMITS.max_header_bytes,
                "over the limit yet waiting"
            );
            assert!(
                matches!(theirs(data), Ok(httparse::Status::Partial)),
                "ours waits, httparse does not: {:?}",
                theirs(data)
            );
        }
        Ok(Some(head)) => {
            let consumed = data.len() - rest.len();
            assert_eq!(&rest[..], &data[consumed..], "only the head is split off");
            assert!(consumed <= LIMITS.max_header_bytes);
            agrees_with_httparse(data, consumed, &head);
            framing_follows_from_headers(&head);
            prefixes_are_incomplete(data, consumed);
            round_trips(&head);
        }
    }
});

fn theirs(data: &[u8]) -> Result<httparse::Status<usize>, httparse::Error> {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    httparse::Request::new(&mut slots).parse(data)
}

/// Whatever ours accepts, httparse reads the same way.
fn agrees_with_httparse(data: &[u8], consumed: usize, head: &RequestHead) {
    let mut slots = [httparse::EMPTY_HEADER; 64];
    let mut request = httparse::Request::new(&mut slots);
    let status = request
        .parse(data)
        .expect("ours accepts what httparse refuses");
    assert_eq!(status, httparse::Status::Complete(consumed));
    assert_eq!(request.method, Some(head.method().as_str()));
    let version = match head.version() {
        Version::Http10 => 0,
        Version::Http11 => 1,
    };
    assert_eq!(request.version, Some(version));
    let path = request.path.expect("a path");
    if path.starts_with('/') || path == "*" {
        assert_eq!(path, head.target());
    } else {
        // Absolute form: scheme and authority dropped, the rest kept (or `/` for none).
        assert!(
            path.ends_with(head.target()) || head.target() == "/",
            "{path:?} reduced to {:?}",
            head.target()
        );
    }
    let ours: Vec<(&[u8], &[u8])> = head.fields().map(|(n, v, _)| (n, v)).collect();
    let theirs: Vec<(&[u8], &[u8])> = request
        .headers
        .iter()
        .map(|h| (h.name.as_bytes(), h.value))
        .collect();
    assert_eq!(ours, theirs);
    for (name, _, kind) in head.fields() {
        assert_eq!(kind, Kind::of(name));
    }
}

/// The framing, keep-alive and `Expect` the head reports are what its headers say.
fn framing_follows_from_headers(head: &RequestHead) {
    let has_te = head.value(Kind::TransferEncoding).is_some();
    let lengths: Vec<&[u8]> = head.values(Kind::ContentLength).collect();
    assert!(
        !(has_te && !lengths.is_empty()),
        "TE and CL accepted together"
    );
    match head.framing() {
        Framing::Chunked => assert!(has_te && head.version() == Version::Http11),
        Framing::Length(n) => {
            assert!(n > 0 && !has_te);
            // Every entry of every value (a list of equal values is allowed) says n.
            for entry in lengths.iter().flat_map(|v| v.split(|&b| b == b',')) {
                let text = std::str::from_utf8(entry).expect("digits");
                assert_eq!(text.trim().parse::<u64>().ok(), Some(n), "{text:?} vs {n}");
            }
        }
        Framing::None => {
            assert!(!has_te);
            for entry in lengths.iter().flat_map(|v| v.split(|&b| b == b',')) {
                assert_eq!(entry.trim_ascii(), b"0".repeat(entry.trim_ascii().len()));
            }
        }
    }
    if head.version() == Version::Http11 {
        assert_eq!(head.values(Kind::Host).count(), 1);
    }
    assert!(!head.expect_continue() || head.version() == Version::Http11);
    for (name, _) in head.end_to_end() {
        assert_eq!(Kind::of(name), Kind::Other);
    }
}

/// Every proper prefix of an accepted head is just incomplete.
fn prefixes_are_incomplete(data: &[u8], consumed: usize) {
    let cuts = [0, 1, consumed / 2, consumed.saturating_sub(2), consumed - 1];
    for cut in cuts.into_iter().filter(|&c| c < consumed) {
        let (parsed, _) = parse(&data[..cut], LIMITS);
        assert!(
            matches!(parsed, Ok(None)),
            "prefix of {cut} bytes: {parsed:?}"
        );
    }
}

/// The head written again from its parts parses to the same head.
fn round_trips(head: &RequestHead) {
    let version = match head.version() {
        Version::Http10 => "1.0",
        Version::Http11 => "1.1",
    };
    let mut bytes = format!("{} {} HTTP/{version}\r\n", head.method(), head.target()).into_bytes();
    for (name, value, _) in head.fields() {
        bytes.extend_from_slice(name);
        bytes.extend_from_slice(b": ");
        bytes.extend_from_slice(value);
        bytes.extend_from_slice(b"\r\n");
    }
    bytes.extend_from_slice(b"\r\n");
    // ": " may be a byte longer than what came: room for that.
    let roomy = HeadLimits {
        max_header_bytes: bytes.len(),
        ..LIMITS
    };
    let (again, rest) = parse(&bytes, roomy);
    let again = again
        .unwrap_or_else(|e| {
            panic!(
                "{:?} refused when written again: {e:?}",
                String::from_utf8_lossy(&bytes)
            )
        })
        .expect("complete");
    assert!(rest.is_empty());
    assert_eq!(again.method(), head.method());
    assert_eq!(again.target(), head.target());
    assert_eq!(again.version(), head.version());
    assert!(again.fields().eq(head.fields()));
    assert_eq!(again.framing(), head.framing());
    assert_eq!(again.keep_alive(), head.keep_alive());
    assert_eq!(again.expect_continue(), head.expect_continue());
}
