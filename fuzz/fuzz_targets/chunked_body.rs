//! The chunked body decoder (`seckill_http1::body`, `Connection::read_chunked`) on
//! arbitrary bytes arriving over a real loopback socket. Beyond "no panic": the outcome
//! (the body, too large, or refused) is the one a plain reading of RFC 9112 §7.1 with the
//! same strictness gives (`reference` below), the body is never larger than the limit nor
//! than the bytes that came, and exactly the chunked message is consumed: what follows
//! stays readable.
//!
//! Input: two bytes of body limit (little-endian), then the bytes on the wire.
#![no_main]

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use seckill_http1::{Connection, ReadError};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

/// As `seckill_http1::body` has them.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;
const MAX_TRAILER_FIELDS: usize = 64;

fn runtime() -> &'static (Runtime, TcpListener, SocketAddr) {
    static SETUP: OnceLock<(Runtime, TcpListener, SocketAddr)> = OnceLock::new();
    SETUP.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let address = listener.local_addr().expect("address");
        (runtime, listener, address)
    })
}

/// What a reading of the body ended in.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    /// The body, and how many bytes the message took.
    Body(Vec<u8>, usize),
    TooLarge,
    /// Malformed, or cut short by the end of the stream.
    Refused,
}

fuzz_target!(|data: &[u8]| {
    let Some((limit, wire)) = data.split_first_chunk::<2>() else {
        return;
    };
    let max = usize::from(u16::from_le_bytes(*limit));
    let (ours, rest) = decode(wire, max);
    let expected = reference(wire, max);
    match (&ours, &expected) {
        (Outcome::Body(body, _), _) => {
            assert!(body.len() <= max, "over the limit");
            assert!(body.len() <= wire.len(), "more out than in");
        }
        _ => assert!(rest.is_none()),
    }
    assert_eq!(ours, expected, "{:?}", String::from_utf8_lossy(wire));
    if let (Outcome::Body(_, used), Some(rest)) = (&ours, rest) {
        assert_eq!(
            rest,
            &wire[*used..],
            "what follows the body is left as it came"
        );
    }
});

/// `read_chunked` on `wire` sent over a loopback connection whose sender then closes; after
/// a body, what remained on the connection.
fn decode(wire: &[u8], max: usize) -> (Outcome, Option<Vec<u8>>) {
    let (runtime, listener, address) = runtime();
    runtime.block_on(async {
        let (accepted, sender) = tokio::join!(listener.accept(), TcpStream::connect(address));
        let (receiver, mut sender) = (accepted.expect("accept").0, sender.expect("connect"));
        // Closed by a reset, not a FIN handshake: millions of connections leave no TIME_WAIT.
        for stream in [&receiver, &sender] {
            socket2::SockRef::from(stream)
                .set_linger(Some(Duration::ZERO))
                .expect("linger");
        }
        let mut connection = Connection::new(receiver);
        let send = async {
            sender.write_all(wire).await.expect("write");
            sender.shutdown().await.expect("shutdown");
            sender
        };
        let (read, _sender) = tokio::join!(connection.read_chunked(max), send);
        match read {
            Ok(body) => {
                let rest = connection.read_to_end(usize::MAX).await.expect("rest");
                let used = wire.len() - rest.len();
                (Outcome::Body(body.to_vec(), used), Some(rest.to_vec()))
            }
            Err(ReadError::TooLarge(limit)) => {
                assert_eq!(limit, max);
                (Outcome::TooLarge, None)
            }
            Err(ReadError::Malformed(_) | ReadError::Closed) => (Outcome::Refused, None),
            Err(ReadError::Io(e)) => panic!("socket failed: {e}"),
        }
    })
}

/// RFC 9112 §7.1 read plainly, as strict as the gateway: a size line is 1 to 16 hex digits,
/// then blanks and `;` extensions of visible characters and blanks, then CRLF, at most
/// `MAX_CHUNK_LINE` bytes before its CR; each chunk ends in CRLF; then the trailers.
fn reference(wire: &[u8], max: usize) -> Outcome {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find_crlf(&wire[at..]) else {
            return Outcome::Refused;
        };
        let line = &wire[at..at + line_end];
        if line.len() > MAX_CHUNK_LINE {
            return Outcome::Refused;
        }
        let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
        if digits == 0 || digits > 16 {
            return Outcome::Refused;
        }
        let mut in_extension = false;
        for &b in &line[digits..] {
            match b {
                b';' => in_extension = true,
                b' ' | b'\t' => {}
                b'!'..=b'~' if in_extension => {}
                _ => return Outcome::Refused,
            }
        }
        let size = u64::from_str_radix(std::str::from_utf8(&line[..digits]).unwrap(), 16).unwrap();
        at += line_end + 2;
        if size == 0 {
            break;
        }
        if (body.len() as u64).saturating_add(size) > max as u64 {
            return Outcome::TooLarge;
        }
        let size = size as usize;
        if wire.len() - at < size + 2 {
            return Outcome::Refused;
        }
        body.extend_from_slice(&wire[at..at + size]);
        if &wire[at + size..at + size + 2] != b"\r\n" {
            return Outcome::Refused;
        }
        at += size + 2;
    }
    // Trailers: none (CRLF), or header lines as httparse reads them, every line ended by
    // CRLF, the section ended by an empty line, at most MAX_TRAILERS bytes and
    // MAX_TRAILER_FIELDS fields.
    let rest = &wire[at..];
    if rest.starts_with(b"\r\n") {
        return Outcome::Body(body, at + 2);
    }
    let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Outcome::Refused;
    };
    let section = &rest[..end + 4];
    let bare_lf = section
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || section[i - 1] != b'\r'));
    if section.len() > MAX_TRAILERS || bare_lf {
        return Outcome::Refused;
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    match httparse::parse_headers(section, &mut slots) {
        Ok(httparse::Status::Complete((length, _))) if length == section.len() => {
            Outcome::Body(body, at + length)
        }
        _ => Outcome::Refused,
    }
}

fn find_crlf(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\r\n")
}
