//! One request as the application's handler sees it: the checked head, the peer, and the
//! body on demand — read once (kept for whoever asks again), with `100 Continue` sent
//! first when the client waits for it.

use std::net::SocketAddr;
use std::pin::Pin;

use bytes::Bytes;
use tokio::time::Sleep;

use super::body::{Connection, ReadError};
use super::request::{Framing, RequestHead};

/// How far a request's body has been read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyState {
    /// Not touched.
    Unread,
    /// Being read: a deadline here is the client's slowness, not a replica's.
    Reading,
    /// Read to its end.
    Read,
    /// Cut short, too large, malformed, or refused unread: the connection is out of step
    /// (or may be) and must end.
    Broken,
}

/// Why a request's body could not be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// Larger than the limit (413).
    TooLarge(usize),
    /// Not a well-formed body (400).
    Malformed,
    /// The client went away or the socket failed.
    Gone,
}

/// One request as the handler sees it: its head, where it came from, and its body on demand.
pub struct Incoming<'a> {
    /// The checked head.
    pub head: &'a RequestHead,
    /// The socket peer.
    pub peer: SocketAddr,
    /// The connection's timer for one exchange with a replica (see
    /// [`Incoming::upstream_timer`]).
    upstream_timer: Pin<&'a mut Sleep>,
    /// The client's connection, its body not read yet.
    connection: &'a mut Connection,
    /// How far the body has been read: whether the connection is still in step.
    state: BodyState,
    /// Largest body (413 beyond).
    max_body_bytes: usize,
    /// What the first read of the body gave, for every later ask.
    read: Option<Result<Bytes, BodyError>>,
}

impl<'a> Incoming<'a> {
    /// A request on `connection`, its body unread.
    pub(super) fn new(
        head: &'a RequestHead,
        peer: SocketAddr,
        upstream_timer: Pin<&'a mut Sleep>,
        connection: &'a mut Connection,
        max_body_bytes: usize,
    ) -> Self {
        Self {
            head,
            peer,
            upstream_timer,
            connection,
            state: BodyState::Unread,
            max_body_bytes,
            read: None,
        }
    }

    /// A timer of the connection's own for a replica's response, set by the caller: pushing it
    /// forward request after request costs an atomic store, where a new timer per request
    /// is a registration with the runtime's timer wheel and a removal.
    pub fn upstream_timer(&mut self) -> Pin<&mut Sleep> {
        self.upstream_timer.as_mut()
    }

    /// How far the body has been read.
    pub fn body_state(&self) -> BodyState {
        self.state
    }

    /// Leaves the body unread and ends the connection after the response, even when the
    /// whole body is already buffered: for a request refused for having a body at all.
    pub fn refuse_body(&mut self) {
        if self.state == BodyState::Unread {
            self.state = BodyState::Broken;
        }
    }

    /// The whole body (empty when there is none), read once — a later call gets what the
    /// first got; a client waiting for `100 Continue` is told to go on first.
    pub async fn body(&mut self) -> Result<Bytes, BodyError> {
        if let Some(read) = &self.read {
            return read.clone();
        }
        let read = self.read_once().await;
        self.read = Some(read.clone());
        read
    }

    async fn read_once(&mut self) -> Result<Bytes, BodyError> {
        if self.state != BodyState::Unread {
            return Err(BodyError::Gone);
        }
        let framing = self.head.framing();
        if let Framing::Length(length) = framing
            && length > self.max_body_bytes as u64
        {
            // Left unread: the connection closes after the 413.
            return Err(BodyError::TooLarge(self.max_body_bytes));
        }
        if framing == Framing::None {
            self.state = BodyState::Read;
            return Ok(Bytes::new());
        }
        self.state = BodyState::Reading;
        let read = self.read(framing).await;
        self.state = if read.is_ok() {
            BodyState::Read
        } else {
            BodyState::Broken
        };
        read.map_err(|e| match e {
            ReadError::TooLarge(limit) => BodyError::TooLarge(limit),
            ReadError::Malformed(_) => BodyError::Malformed,
            ReadError::Closed | ReadError::Io(_) => BodyError::Gone,
        })
    }

    async fn read(&mut self, framing: Framing) -> Result<Bytes, ReadError> {
        let buffered = match framing {
            Framing::Length(length) => self.connection.buffered().len() as u64 >= length,
            _ => false,
        };
        if self.head.expect_continue() && !buffered {
            self.connection
                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                .await?;
        }
        match framing {
            Framing::None => Ok(Bytes::new()),
            // At most max_body_bytes: checked above.
            Framing::Length(length) => self.connection.read_exactly(length as usize).await,
            Framing::Chunked => self.connection.read_chunked(self.max_body_bytes).await,
        }
    }
}
