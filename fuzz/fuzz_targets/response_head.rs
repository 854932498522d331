//! The client's reading of an upstream response head (`seckill_http1::client`) on arbitrary
//! bytes. Beyond "no panic": whatever it accepts, `httparse` accepts with the same length
//! and status; the header lines it keeps are httparse's, in order, less the hop-by-hop
//! ones, those `Connection` names and `Content-Length` (unless a HEAD's or a 304's); they
//! parse again as they are; and a prefix of a head is incomplete, never something else.
//!
//! Input: one byte whose low bit says the request was a `HEAD`, then the bytes on the wire.
#![no_main]

use libfuzzer_sys::fuzz_target;
use seckill_http1::fuzzing::{ResponseHeadView, parse_response_head};
use seckill_http1::{HopByHop, Kind};

/// As `seckill_http1::client` has it.
const MAX_RESPONSE_HEADERS: usize = 100;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, wire)) = data.split_first() else {
        return;
    };
    let head_only = flags & 1 == 1;
    let ours = parse_response_head(wire, head_only);
    let mut slots = [httparse::EMPTY_HEADER; MAX_RESPONSE_HEADERS];
    let mut theirs = httparse::Response::new(&mut slots);
    let their_status = theirs.parse(wire);
    let head = match (ours, their_status) {
        (Ok(Some(head)), Ok(httparse::Status::Complete(length))) => {
            assert_eq!(head.length, length);
            head
        }
        // Ours may be stricter than httparse, never looser.
        (Ok(None), Ok(httparse::Status::Partial)) | (Err(_), _) => return,
        (ours, theirs) => panic!("ours {ours:?}, httparse {theirs:?}"),
    };
    assert_eq!(Some(head.status), theirs.code);
    assert!(head.status <= 999);
    assert_eq!(
        head.bodiless,
        head_only || head.status == 204 || head.status == 304
    );
    let hop_by_hop = HopByHop::of(
        theirs
            .headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case("connection"))
            .map(|h| h.value),
    );
    let expected: Vec<(&[u8], &[u8])> = theirs
        .headers
        .iter()
        .map(|h| (h.name.as_bytes(), h.value))
        .filter(|(name, _)| !hop_by_hop.contains(name))
        // A bodiless response keeps its Content-Length (a HEAD's, a 304's), except a 204,
        // which has none to speak of.
        .filter(|(name, _)| {
            (head.bodiless && head.status != 204) || Kind::of(name) != Kind::ContentLength
        })
        .collect();
    let kept = lines_of(&head.lines);
    assert_eq!(kept, expected);
    // ": " where the replica may have written ":", CRLF where it ended a line with a bare LF
    // (httparse reads one): two bytes per header at most.
    assert!(head.lines.len() <= head.length + 2 * kept.len());
    prefixes_are_incomplete(wire, head.length, head_only);
    lines_parse_again(&head, head_only);
});

/// The `(name, value)` pairs of header lines the client wrote.
fn lines_of(lines: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut pairs = Vec::new();
    let mut rest = lines;
    while !rest.is_empty() {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("CRLF ends each line");
        let line = &rest[..end];
        let colon = line.iter().position(|&b| b == b':').expect("a colon");
        assert_eq!(line.get(colon + 1), Some(&b' '));
        pairs.push((&line[..colon], &line[colon + 2..]));
        rest = &rest[end + 2..];
    }
    pairs
}

/// Every proper prefix of an accepted head is just incomplete.
fn prefixes_are_incomplete(wire: &[u8], length: usize, head_only: bool) {
    for cut in [0, 1, length / 2, length.saturating_sub(2), length - 1] {
        if cut < length {
            let parsed = parse_response_head(&wire[..cut], head_only);
            assert!(matches!(parsed, Ok(None)), "prefix of {cut}: {parsed:?}");
        }
    }
}

/// The kept lines under the same status line read back to themselves.
fn lines_parse_again(head: &ResponseHeadView, head_only: bool) {
    let mut again = format!("HTTP/1.1 {:03} X\r\n", head.status).into_bytes();
    again.extend_from_slice(&head.lines);
    again.extend_from_slice(b"\r\n");
    let parsed = parse_response_head(&again, head_only)
        .expect("written lines parse")
        .expect("complete");
    assert_eq!(parsed.length, again.len());
    assert_eq!(parsed.lines, head.lines);
}
