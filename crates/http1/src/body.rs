//! A TCP connection with its read buffer, and reading HTTP/1.1 message bodies off it: the
//! one reader both sides share, for client requests ([`super::server`]) and for replica
//! responses ([`super::client`]).
//!
//! Bodies are read whole and checked strictly: a chunked body's size lines are hex digits
//! (an extension may follow a `;`) ended by CRLF, each chunk is followed by CRLF, trailers
//! are read, checked as header lines (CRLF only) and dropped. Whatever framed a body here, it leaves the gateway framed by a
//! `Content-Length` of what was read, so a peer on the other side never has to agree with
//! this parser about where a message ends.

use std::io;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::request::{HeadError, HeadLimits, RequestHead};

/// How much a read buffer grows at most per read, and the capacity beyond which a buffer
/// is replaced by a small one between messages (a large message should not keep its memory
/// on an idle connection).
pub const GROWTH_STEP: usize = 64 * 1024;
/// The capacity a buffer starts with.
pub const INITIAL_CAPACITY: usize = 4096;
/// Longest chunk-size line (with its extensions) and longest trailer section.
const MAX_CHUNK_LINE: usize = 4096;
const MAX_TRAILERS: usize = 16 * 1024;
/// Most trailer fields in one section.
const MAX_TRAILER_FIELDS: usize = 64;
/// How long, and for how many bytes, a closing connection is drained.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 * 1024;

/// Why a message could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
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

/// How an idle connection is checked for a close by its peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Ask the socket itself (a non-blocking peek): tokio's readiness learns of a close
    /// only when the reactor next turns.
    Socket,
    /// Peek only when the reactor has seen the socket become readable since the last
    /// message was read (a short read clears that); a would-block clears it again.
    Reactor,
}

/// An open connection and what has been read from it but not used yet.
#[derive(Debug)]
pub struct Connection {
    /// The socket: read into `buffer` only, written through the methods below.
    stream: TcpStream,
    /// Bytes read and not yet consumed: the start of the next message, if any.
    buffer: BytesMut,
}

impl Connection {
    /// A connection with an empty buffer.
    pub fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            buffer: BytesMut::with_capacity(INITIAL_CAPACITY),
        }
    }

    /// Reads more into the buffer; the end of the stream is [`ReadError::Closed`].
    pub async fn fill(&mut self) -> Result<(), ReadError> {
        self.buffer.reserve(INITIAL_CAPACITY);
        match self.stream.read_buf(&mut self.buffer).await? {
            0 => Err(ReadError::Closed),
            _ => Ok(()),
        }
    }

    /// The bytes read and not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buffer
    }

    /// Drops the first `length` buffered bytes (at most all of them).
    pub fn consume(&mut self, length: usize) {
        self.buffer.advance(length.min(self.buffer.len()));
    }

    /// The request head at the start of the buffer, split off it; `None` while incomplete
    /// and within the limits.
    pub fn request_head(&mut self, limits: HeadLimits) -> Result<Option<RequestHead>, HeadError> {
        RequestHead::parse(&mut self.buffer, limits)
    }

    /// Gives a buffer that grew for a large message back, keeping a small one.
    pub fn shrink(&mut self) {
        if self.buffer.is_empty() && self.buffer.capacity() > GROWTH_STEP {
            self.buffer = BytesMut::with_capacity(INITIAL_CAPACITY);
        }
    }

    /// Writes some of `bytes` in one write; how many went out (0: the peer closed).
    pub async fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.stream.write(bytes).await
    }

    /// Writes all of `bytes`.
    pub async fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Whether an idle connection is still open: nothing to read yet. End of stream (the
    /// peer closed it), stray bytes or an error all mean it must not be used.
    pub fn still_open(&self, probe: Probe) -> bool {
        let peek = || {
            let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
            socket2::SockRef::from(&self.stream).peek(&mut byte)
        };
        let result = match probe {
            Probe::Socket => peek(),
            Probe::Reactor => self.stream.try_io(Interest::READABLE, peek),
        };
        matches!(result, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    /// Closes a connection the peer may still be writing to: this side first, then what
    /// arrives is read and dropped until the peer closes too, for a short while. A socket
    /// closed with unread bytes sends a reset, which can destroy the last response before
    /// the client has read it (the "lingering close" every HTTP server does).
    pub async fn linger(mut self) {
        if self.stream.shutdown().await.is_err() {
            return;
        }
        let stream = &mut self.stream;
        let drain = async {
            let mut sink = [0u8; 4096];
            let mut drained = 0;
            while drained < LINGER_BYTES {
                match stream.read(&mut sink).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => drained += n,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    }

    /// The next `length` bytes.
    pub async fn read_exactly(&mut self, length: usize) -> Result<Bytes, ReadError> {
        // Grown as the bytes come, not reserved for an announced length up front.
        if self.buffer.len() < length {
            self.buffer
                .reserve((length - self.buffer.len()).min(GROWTH_STEP));
        }
        while self.buffer.len() < length {
            self.fill().await?;
        }
        Ok(self.buffer.split_to(length).freeze())
    }

    /// Everything until the peer closes, at most `max` bytes.
    pub async fn read_to_end(&mut self, max: usize) -> Result<Bytes, ReadError> {
        loop {
            if self.buffer.len() > max {
                return Err(ReadError::TooLarge(max));
            }
            match self.fill().await {
                Ok(()) => {}
                Err(ReadError::Closed) => return Ok(self.buffer.split().freeze()),
                Err(e) => return Err(e),
            }
        }
    }

    /// A chunked body (RFC 9112 §7.1), decoded, at most `max` bytes; trailers dropped.
    pub async fn read_chunked(&mut self, max: usize) -> Result<Bytes, ReadError> {
        let mut body = BytesMut::new();
        loop {
            let (line, size) = loop {
                match chunk_size_line(&self.buffer)? {
                    Some(parsed) => break parsed,
                    None => self.fill().await?,
                }
            };
            self.buffer.advance(line);
            if size == 0 {
                break;
            }
            let size = usize::try_from(size).unwrap_or(usize::MAX);
            if body.len().saturating_add(size) > max {
                return Err(ReadError::TooLarge(max));
            }
            let chunk = self.read_exactly(size).await?;
            body.extend_from_slice(&chunk);
            if self.read_exactly(2).await?.as_ref() != b"\r\n" {
                return Err(ReadError::Malformed("chunk not followed by CRLF"));
            }
        }
        self.skip_trailers().await?;
        Ok(body.freeze())
    }

    /// Reads the trailer section up to and including its empty line, checked as headers
    /// ([`trailer_section`]) and dropped.
    async fn skip_trailers(&mut self) -> Result<(), ReadError> {
        loop {
            if let Some(length) = trailer_section(&self.buffer)? {
                self.buffer.advance(length);
                return Ok(());
            }
            self.fill().await?;
        }
    }
}

/// The length of the trailer section at the start of `buf` (RFC 9112 §7.1.2), up to and
/// including the empty line that ends it; `None` while incomplete. Each trailer must be a
/// well-formed header line ended by CRLF: a bare LF, a malformed field or a section over
/// 16 kB is malformed. Trailers are never forwarded (the body leaves re-framed by its
/// length), so none of them can carry meaning past the gateway.
pub fn trailer_section(buf: &[u8]) -> Result<Option<usize>, ReadError> {
    if buf.starts_with(b"\r\n") {
        return Ok(Some(2));
    }
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let section = end.map_or(buf, |at| &buf[..at + 4]);
    if super::request::has_bare_lf(section) {
        return Err(ReadError::Malformed("bare LF in the trailers"));
    }
    let Some(at) = end else {
        return if buf.len() > MAX_TRAILERS {
            Err(ReadError::Malformed("trailers too large"))
        } else {
            Ok(None)
        };
    };
    if section.len() > MAX_TRAILERS {
        return Err(ReadError::Malformed("trailers too large"));
    }
    let mut slots = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    match httparse::parse_headers(section, &mut slots) {
        Ok(httparse::Status::Complete((length, _))) if length == at + 4 => Ok(Some(length)),
        _ => Err(ReadError::Malformed("malformed trailers")),
    }
}

/// A chunk-size line at the start of `buf`: its length with the CRLF and the size, or
/// `None` while incomplete. Strict: 1 to 16 hex digits, then optionally blanks and a `;`
/// extension of visible characters and blanks, then CRLF. A bare LF, a line without digits
/// or a size that does not fit is malformed.
pub fn chunk_size_line(buf: &[u8]) -> Result<Option<(usize, u64)>, ReadError> {
    let bad = || ReadError::Malformed("bad chunk size line");
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
                matches!(chunk_size_line(bad), Err(ReadError::Malformed(_))),
                "{bad:?}"
            );
        }
        let long = [b"1;".as_slice(), &[b'x'; MAX_CHUNK_LINE + 1]].concat();
        assert!(chunk_size_line(&long).is_err());
    }

    #[test]
    fn trailers_are_header_lines_ended_by_crlf() {
        let complete = |buf: &[u8]| trailer_section(buf).ok().flatten();
        assert_eq!(complete(b"\r\nGET"), Some(2));
        assert_eq!(complete(b"x-a: 1\r\nx-b: 2\r\n\r\nGET"), Some(18));
        for incomplete in [&b""[..], b"\r", b"x-a: 1\r\n", b"x-a: 1\r\n\r"] {
            assert!(
                matches!(trailer_section(incomplete), Ok(None)),
                "{incomplete:?}"
            );
        }
        for bad in [
            &b"\n"[..],
            b"x-a: 1\n\r\n",
            b"x-a: 1\r\n\n",
            b"x-a: 1\nx-b: 2",
            b"bad name: 1\r\n\r\n",
            b"x-a\r\n\r\n",
            b" folded: 1\r\n\r\n",
        ] {
            assert!(
                matches!(trailer_section(bad), Err(ReadError::Malformed(_))),
                "{bad:?}"
            );
        }
        let long = [&[b'x'; MAX_TRAILERS + 1][..]].concat();
        assert!(trailer_section(&long).is_err());
    }
}
