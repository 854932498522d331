//! A TCP connection with its read buffer, and reading HTTP/1.1 message bodies off it: the
//! one reader both sides of the gateway use, for client requests ([`crate::http1`]) and for
//! replica answers ([`crate::proxy::pool`]).
//!
//! Bodies are read whole and checked strictly: a chunked body's size lines are hex digits
//! (an extension may follow a `;`) ended by CRLF, each chunk is followed by CRLF, trailers
//! are read and dropped. Whatever framed a body here, it leaves the gateway framed by a
//! `Content-Length` of what was read, so a peer on the other side never has to agree with
//! this parser about where a message ends.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// How much a read buffer grows at most per read, and the capacity beyond which a buffer
/// is replaced by a small one between messages (a large message should not keep its memory
/// on an idle connection).
pub const GROWTH_STEP: usize = 64 * 1024;
/// The capacity a buffer starts with.
pub const INITIAL_CAPACITY: usize = 4096;
/// Longest chunk-size line (with its extensions) and longest trailer section.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection before the message ended.
    #[error("the peer closed the connection mid-message")]
    Closed,
    /// The socket failed.
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The body is larger than the limit given.
    #[error("body over {0} bytes")]
    TooLarge(usize),
    /// The bytes are not a well-formed message.
    #[error("{0}")]
    Malformed(&'static str),
}

/// An open connection and what has been read from it but not used yet.
#[derive(Debug)]
pub struct Wire {
    /// The socket, read here and written by the owner.
    pub stream: TcpStream,
    /// Bytes read and not yet consumed: the start of the next message, if any.
    pub read: BytesMut,
}

impl Wire {
    /// A connection with an empty buffer.
    pub fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            read: BytesMut::with_capacity(INITIAL_CAPACITY),
        }
    }

    /// Reads more into the buffer; the end of the stream is [`WireError::Closed`].
    pub async fn fill(&mut self) -> Result<(), WireError> {
        self.read.reserve(INITIAL_CAPACITY);
        match self.stream.read_buf(&mut self.read).await? {
            0 => Err(WireError::Closed),
            _ => Ok(()),
        }
    }

    /// Gives a buffer that grew for a large message back, keeping a small one.
    pub fn shrink(&mut self) {
        if self.read.is_empty() && self.read.capacity() > GROWTH_STEP {
            self.read = BytesMut::with_capacity(INITIAL_CAPACITY);
        }
    }

    /// The next `length` bytes.
    pub async fn read_exactly(&mut self, length: usize) -> Result<Bytes, WireError> {
        // Grown as the bytes come, not reserved for an announced length up front.
        if self.read.len() < length {
            self.read
                .reserve((length - self.read.len()).min(GROWTH_STEP));
        }
        while self.read.len() < length {
            self.fill().await?;
        }
        Ok(self.read.split_to(length).freeze())
    }

    /// Everything until the peer closes, at most `max` bytes.
    pub async fn read_to_end(&mut self, max: usize) -> Result<Bytes, WireError> {
        loop {
            if self.read.len() > max {
                return Err(WireError::TooLarge(max));
            }
            match self.fill().await {
                Ok(()) => {}
                Err(WireError::Closed) => return Ok(self.read.split().freeze()),
                Err(e) => return Err(e),
            }
        }
    }

    /// A chunked body (RFC 9112 §7.1), decoded, at most `max` bytes; trailers dropped.
    pub async fn read_chunked(&mut self, max: usize) -> Result<Bytes, WireError> {
        let mut body = BytesMut::new();
        loop {
            let (line, size) = loop {
                match chunk_size_line(&self.read)? {
                    Some(parsed) => break parsed,
                    None => self.fill().await?,
                }
            };
            self.read.advance(line);
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            if body.len().saturating_add(size) > max {
                return Err(WireError::TooLarge(max));
            }
            let chunk = self.read_exactly(size).await?;
            body.extend_from_slice(&chunk);
            if self.read_exactly(2).await?.as_ref() != b"\r\n" {
                return Err(WireError::Malformed("chunk not followed by CRLF"));
            }
        }
        self.skip_trailers().await?;
        Ok(body.freeze())
    }

    /// Reads the trailer section up to and including its empty line.
    async fn skip_trailers(&mut self) -> Result<(), WireError> {
        let mut seen = 0;
        loop {
            let Some(end) = self.read.windows(2).position(|w| w == b"\r\n") else {
                if seen + self.read.len() > MAX_TRAILERS {
                    return Err(WireError::Malformed("trailers too large"));
                }
                self.fill().await?;
                continue;
            };
            self.read.advance(end + 2);
            seen += end + 2;
            if end == 0 {
                return Ok(());
            }
            if seen > MAX_TRAILERS {
                return Err(WireError::Malformed("trailers too large"));
            }
        }
    }
}

/// A chunk-size line at the start of `buf`: its length with the CRLF and the size, or
/// `None` while incomplete. Strict: 1 to 16 hex digits, then optionally blanks and a `;`
/// extension of visible characters and blanks, then CRLF. A bare LF, a line without digits
/// or a size that does not fit is malformed.
pub fn chunk_size_line(buf: &[u8]) -> Result<Option<(usize, u64)>, WireError> {
    let bad = || WireError::Malformed("bad chunk size line");
    let digits = buf.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits > 16 || (digits == 0 && !buf.is_empty()) {
        return Err(bad());
    }
    let mut at = digits;
    let mut in_extension = false;
    loop {
        let Some(&byte) = buf.get(at) else {
            return if buf.len() > MAX_CHUNK_LINE {
                Err(bad())
            } else {
                Ok(None)
            };
        };
        match byte {
            b'\r' => match buf.get(at + 1) {
                Some(b'\n') => break,
                Some(_) => return Err(bad()),
                None => return Ok(None),
            },
            b';' => in_extension = true,
            b' ' | b'\t' => {}
            b'!'..=b'~' if in_extension => {}
            _ => return Err(bad()),
        }
        at += 1;
        if at > MAX_CHUNK_LINE {
            return Err(bad());
        }
    }
    let hex = std::str::from_utf8(&buf[..digits]).map_err(|_| bad())?;
    let size = u64::from_str_radix(hex, 16).map_err(|_| bad())?;
    Ok(Some((at + 2, size)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_size_lines_are_read_strictly() {
        assert_eq!(chunk_size_line(b"1a\r\nxyz").ok().flatten(), Some((4, 26)));
        assert_eq!(
            chunk_size_line(b"0;name=\"v\" \r\n").ok().flatten(),
            Some((13, 0))
        );
        assert_eq!(
            chunk_size_line(b"FFFF\t;x\r\n").ok().flatten(),
            Some((9, 65535))
        );
        for incomplete in [&b""[..], b"1a", b"1a\r", b"1a;ext"] {
            assert!(
                matches!(chunk_size_line(incomplete), Ok(None)),
                "{incomplete:?}"
            );
        }
        for bad in [
            &b";x\r\n"[..],
            b"\r\n",
            b"1a\n",
            b"1a;x\ny\r\n",
            b"1 a\r\n",
            b"1a\rx",
            b"+1\r\n",
            b"12345678901234567\r\n",
            b"1;\x00\r\n",
        ] {
            assert!(
                matches!(chunk_size_line(bad), Err(WireError::Malformed(_))),
                "{bad:?}"
            );
        }
        let long = [b"1;".as_slice(), &[b'x'; MAX_CHUNK_LINE + 1]].concat();
        assert!(chunk_size_line(&long).is_err());
    }

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
}
