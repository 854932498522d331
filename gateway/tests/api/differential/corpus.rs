//! The heads the differential test feeds both parsers: named oddities (each a known
//! smuggling or confusion shape, with what the gateway is expected to make of it) and
//! pseudo-random byte edits of the valid heads.

use super::VALID;

/// What the gateway should make of a named case, next to httparse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Both accept it and read it the same way.
    Accept,
    /// Both refuse it (or httparse waits where the gateway refuses).
    Refuse,
    /// httparse reads it; the gateway refuses it.
    Stricter,
    /// Anything but looser: where either answer would do.
    NotLooser,
}

/// One named case.
pub struct Case {
    /// What it tries.
    pub name: &'static str,
    /// The bytes on the wire.
    pub bytes: Vec<u8>,
    /// The expected outcome.
    pub expect: Expect,
}

/// `GET /` with a Host and `extra` header lines (each ending in CRLF).
fn with_headers(extra: &str) -> String {
    format!("GET / HTTP/1.1\r\nHost: gw\r\n{extra}\r\n")
}

/// A request line of its own, then a Host.
fn with_line(line: &str) -> String {
    format!("{line}\r\nHost: gw\r\n\r\n")
}

/// Every named case.
pub fn named() -> Vec<Case> {
    let mut cases: Vec<Case> = table()
        .into_iter()
        .map(|(name, bytes, expect)| Case {
            name,
            bytes: bytes.into_bytes(),
            expect,
        })
        .collect();
    cases.push(Case {
        name: "raw non-UTF-8 byte in the target",
        bytes: b"GET /\xff HTTP/1.1\r\nHost: gw\r\n\r\n".to_vec(),
        expect: Expect::NotLooser,
    });
    cases.push(Case {
        name: "raw non-UTF-8 byte in a value",
        bytes: b"GET / HTTP/1.1\r\nHost: gw\r\nX-A: \xff\r\n\r\n".to_vec(),
        expect: Expect::Accept,
    });
    cases
}

/// The named cases that are text: one a line, as a table reads best.
#[rustfmt::skip]
fn table() -> Vec<(&'static str, String, Expect)> {
    use Expect::*;
    let long = |n: usize| with_headers(&format!("X-Long: {}\r\n", "a".repeat(n)));
    let many = |n: usize| with_headers(&(0..n).map(|i| format!("X-{i}: 1\r\n")).collect::<String>());
    vec![
        ("obs-fold, space", with_headers("X-A: 1\r\n folded\r\n"), Refuse),
        ("obs-fold, tab", with_headers("X-A: 1\r\n\tfolded\r\n"), Refuse),
        ("obs-fold of Transfer-Encoding", with_headers("Transfer-Encoding:\r\n chunked\r\n"), Refuse),
        ("bare LF everywhere", "GET / HTTP/1.1\nHost: gw\n\n".into(), Stricter),
        ("bare LF after the request line", "GET / HTTP/1.1\nHost: gw\r\n\r\n".into(), Stricter),
        ("bare LF ending the head", "GET / HTTP/1.1\r\nHost: gw\r\n\n".into(), Stricter),
        ("bare LF inside a value", with_headers("X-A: 1\nTransfer-Encoding: chunked\r\n"), Stricter),
        ("bare CR ending a line", "GET / HTTP/1.1\r\nHost: gw\rX-A: 1\r\n\r\n".into(), Refuse),
        ("bare CR inside a value", with_headers("X-A: a\rb\r\n"), Refuse),
        ("NUL in a value", with_headers("X-A: a\0b\r\n"), Refuse),
        ("NUL in a name", with_headers("X-\0A: 1\r\n"), Refuse),
        ("NUL in the target", with_line("GET /a\0b HTTP/1.1"), Refuse),
        ("control byte in a value", with_headers("X-A: a\x01b\r\n"), Refuse),
        ("DEL in a value", with_headers("X-A: a\x7fb\r\n"), Refuse),
        ("space before the colon", with_headers("Content-Length : 5\r\n"), Refuse),
        ("tab before the colon", with_headers("Content-Length\t: 5\r\n"), Refuse),
        ("header line without a colon", with_headers("X-No-Value\r\n"), Refuse),
        ("empty header name", with_headers(": 1\r\n"), Refuse),
        ("separator in a name", with_headers("X(y): 1\r\n"), Refuse),
        ("space in a name", with_headers("X y: 1\r\n"), Refuse),
        ("UTF-8 in a name", with_headers("X-\u{e9}: 1\r\n"), Refuse),
        ("UTF-8 in a value", with_headers("X-A: caf\u{e9}\r\n"), Accept),
        ("blanks around a value", with_headers("X-A: \t a b \t\r\n"), Accept),
        ("empty value", with_headers("X-A:\r\n"), Accept),
        ("two equal Content-Lengths", with_headers("Content-Length: 5\r\nContent-Length: 5\r\n"), Accept),
        ("a list of equal Content-Lengths", with_headers("Content-Length: 5, 5\r\n"), Accept),
        ("two different Content-Lengths", with_headers("Content-Length: 5\r\nContent-Length: 6\r\n"), Stricter),
        ("a list of different Content-Lengths", with_headers("Content-Length: 5, 6\r\n"), Stricter),
        ("signed Content-Length", with_headers("Content-Length: +5\r\n"), Stricter),
        ("hex Content-Length", with_headers("Content-Length: 0x5\r\n"), Stricter),
        ("empty Content-Length", with_headers("Content-Length:\r\n"), Stricter),
        ("Content-Length past u64", with_headers("Content-Length: 99999999999999999999\r\n"), Stricter),
        ("Transfer-Encoding and Content-Length", with_headers("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"), Stricter),
        ("Content-Length then Transfer-Encoding", with_headers("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"), Stricter),
        ("chunked twice", with_headers("Transfer-Encoding: chunked, chunked\r\n"), Stricter),
        ("chunked not last", with_headers("Transfer-Encoding: chunked, identity\r\n"), Stricter),
        ("a coding besides chunked", with_headers("Transfer-Encoding: gzip, chunked\r\n"), Stricter),
        ("an unknown coding", with_headers("Transfer-Encoding: xchunked\r\n"), Stricter),
        ("chunked on HTTP/1.0", "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n".into(), Stricter),
        ("chunked in mixed case", with_headers("transfer-ENCODING: Chunked\r\n"), Accept),
        ("no Host on HTTP/1.1", "GET / HTTP/1.1\r\n\r\n".into(), Stricter),
        ("two Hosts", with_headers("Host: other\r\n"), Stricter),
        ("no Host on HTTP/1.0", "GET / HTTP/1.0\r\n\r\n".into(), Accept),
        ("Expect other than 100-continue", with_headers("Expect: 200-ok\r\n"), Stricter),
        ("Connection naming headers", with_headers("Connection: close, X-A\r\nX-A: 1\r\n"), Accept),
        ("an identity header from the client", with_headers("X-User-Id: 1\r\nX-Identity-Sig: x\r\n"), Accept),
        ("a long line within the limit", long(20 * 1024), Accept),
        ("a line past the head limit", long(40 * 1024), Stricter),
        ("as many headers as allowed", many(99), Accept),
        ("more headers than allowed", many(101), Stricter),
        ("lowercase method", with_line("get / HTTP/1.1"), Accept),
        ("extension method", with_line("PURGE /cache HTTP/1.1"), Accept),
        ("separator in the method", with_line("G(T / HTTP/1.1"), Refuse),
        ("two spaces after the method", with_line("GET  / HTTP/1.1"), Refuse),
        ("tab after the method", with_line("GET\t/ HTTP/1.1"), Refuse),
        ("space in the target", with_line("GET /a b HTTP/1.1"), Refuse),
        ("trailing space after the version", with_line("GET / HTTP/1.1 "), Refuse),
        ("HTTP/1.2", with_line("GET / HTTP/1.2"), Refuse),
        ("HTTP/2.0", with_line("GET / HTTP/2.0"), Refuse),
        ("lowercase version", with_line("GET / http/1.1"), Refuse),
        ("no version", "GET /\r\nHost: gw\r\n\r\n".into(), Refuse),
        ("empty lines before the request line", format!("\r\n\r\n{}", with_headers("")), NotLooser),
        ("only empty lines", "\r\n\r\n\r\n".into(), NotLooser),
        ("percent escapes in the target", with_line("GET /a%2Fb%00/%2e%2e?x=%zz HTTP/1.1"), Accept),
        ("UTF-8 in the target", with_line("GET /caf\u{e9}?q=\u{e9} HTTP/1.1"), NotLooser),
        ("quote and braces in the target", with_line("GET /a\"b{c}|d\\e^f`g HTTP/1.1"), NotLooser),
        // httparse reads the fragment as part of the target; the gateway used to drop it.
        ("fragment in the target", with_line("GET /a#frag HTTP/1.1"), Stricter),
        ("fragment in an absolute target", with_line("GET http://gw/a#/../admin HTTP/1.1"), Stricter),
        ("absolute form", with_line("GET http://gw:8080/api/products/1?a=b HTTP/1.1"), Accept),
        ("absolute form, upper-case scheme, no path", with_line("GET HTTPS://gw HTTP/1.1"), Accept),
        ("absolute form with a query but no path", with_line("GET http://gw?q=1 HTTP/1.1"), Stricter),
        ("absolute form with user info", with_line("GET http://user@gw/a HTTP/1.1"), Accept),
        ("another scheme", with_line("GET ftp://gw/a HTTP/1.1"), Stricter),
        ("authority form", with_line("CONNECT gw:443 HTTP/1.1"), Stricter),
        ("network-path reference", with_line("GET //evil.example/a HTTP/1.1"), Accept),
        ("asterisk form", with_line("OPTIONS * HTTP/1.1"), Accept),
        ("scheme without slashes", with_line("GET http:/a HTTP/1.1"), Stricter),
    ]
}

/// Bytes a random edit puts in: the ones parsers disagree about most.
const INTERESTING: &[u8] = b"\0\r\n \t:;,=\"/?#%*@\\\x01\x7f\x80\xffaZ09-_";

/// `rounds` pseudo-random edits (1 to 3 bytes changed, put in, taken out, or a line
/// repeated) of every valid head, the same on every run.
pub fn mutated(rounds: usize) -> Vec<Vec<u8>> {
    let mut random = XorShift(0x9e37_79b9_7f4a_7c15);
    let mut out = Vec::new();
    for valid in VALID {
        for _ in 0..rounds {
            let mut bytes = valid.as_bytes().to_vec();
            for _ in 0..=random.below(3) {
                let at = random.below(bytes.len());
                let byte = INTERESTING[random.below(INTERESTING.len())];
                match random.below(4) {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    2 => {
                        bytes.remove(at);
                    }
                    _ => repeat_line(&mut bytes, at),
                }
                if bytes.is_empty() {
                    bytes.push(byte);
                }
            }
            out.push(bytes);
        }
    }
    out
}

/// Repeats the line around `at`, CRLF included: duplicate headers of every kind.
fn repeat_line(bytes: &mut Vec<u8>, at: usize) {
    let start = bytes[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let end = bytes[at..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |i| at + i + 1);
    let line = bytes[start..end].to_vec();
    bytes.splice(end..end, line);
}

/// A small deterministic generator: the corpus is the same on every run and machine.
struct XorShift(u64);

impl XorShift {
    /// A number below `n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}
