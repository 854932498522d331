//! A TCP proxy between AMQP 0-9-1 clients and RabbitMQ that reads the frames both ways and
//! can lose one publisher confirm, for tests of what a publisher answers when a confirm
//! never comes.
//!
//! Point a client at [`AmqpProxy::amqp_url`] instead of the broker. Every connection is
//! forwarded as it is; the proxy only reads it. On the connections whose client names itself
//! as the *watched* one (the `connection_name` of its `connection.start-ok`), it follows each
//! confirming channel's delivery tags (`confirm.select`, then one per `basic.publish`), keeps
//! the purchases each published message carries (a batch's parts, or a single order's
//! `request_id`, see `seckill_messaging::batch`), and credits them when the broker's
//! `basic.ack` passes through to the client ([`ConfirmReport::passed`]).
//!
//! [`AmqpProxy::lose_next_confirm`] arms it: the next `basic.ack` (class 60, method 80) on a
//! watched connection that confirms at least the given number of purchases is swallowed.
//! From then on that connection hears nothing from the broker for the proxy's silence (what
//! the client sends still reaches the broker, so the broker holds every message the client
//! published and confirmed them all), then the proxy severs it both ways. The client sees a
//! confirm that never came, a silent broker, then a dead connection; it may connect again,
//! and that connection is forwarded and watched as before (one confirm is lost per arming).
//!
//! Parsing covers what the bookkeeping needs (frame boundaries, the methods named above,
//! `channel.open`/`close`, `basic.nack`, a content header's body size and content type);
//! anything it cannot read makes the proxy stop reading that direction and merely forward it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What every AMQP 0-9-1 client sends first.
const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
/// Frame types.
const FRAME_METHOD: u8 = 1;
const FRAME_HEADER: u8 = 2;
const FRAME_BODY: u8 = 3;
/// Every frame ends with it.
const FRAME_END: u8 = 0xCE;
/// Type, channel, size.
const FRAME_PREFIX: usize = 7;

/// A loopback proxy in front of one RabbitMQ node; dropping it stops accepting and ends
/// every connection.
#[derive(Debug)]
pub struct AmqpProxy {
    addr: SocketAddr,
    url: String,
    shared: Arc<Shared>,
    severed: watch::Receiver<usize>,
    acceptor: JoinHandle<()>,
}

/// What the proxy saw of the watched connections' confirms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfirmReport {
    /// Connections the watched client opened through the proxy.
    pub connections: usize,
    /// Messages whose `basic.ack` reached the client.
    pub passed_messages: usize,
    /// The purchases (request ids) in them.
    pub passed: HashSet<String>,
    /// The purchases of the swallowed `basic.ack`, once it was.
    pub swallowed: Option<Vec<String>>,
    /// Watched connections severed after their silence.
    pub severed: usize,
}

#[derive(Debug)]
struct Shared {
    /// The `connection_name` of the connections the proxy follows.
    watched: String,
    /// How long a connection whose confirm was swallowed hears nothing before it is severed.
    silence: Duration,
    /// `Some(n)`: the next ack confirming at least `n` purchases is swallowed.
    armed: Mutex<Option<usize>>,
    report: Mutex<ConfirmReport>,
    severed: watch::Sender<usize>,
}

impl Shared {
    fn report(&self) -> std::sync::MutexGuard<'_, ConfirmReport> {
        self.report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl AmqpProxy {
    /// Listens on a free loopback port and forwards each connection to the broker of
    /// `amqp_url` (`amqp://user:password@host:port/vhost`), following the connections named
    /// `watched`; one whose confirm is swallowed is severed `silence` later.
    pub async fn start(amqp_url: &str, watched: &str, silence: Duration) -> std::io::Result<Self> {
        let (prefix, authority, rest) = split_url(amqp_url).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("not an amqp://host:port/ URL: {amqp_url}"),
            )
        })?;
        let server = tokio::net::lookup_host(authority)
            .await?
            .next()
            .ok_or_else(|| std::io::Error::other(format!("{authority} resolves to nothing")))?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let (severed_tx, severed) = watch::channel(0);
        let shared = Arc::new(Shared {
            watched: watched.to_string(),
            silence,
            armed: Mutex::new(None),
            report: Mutex::new(ConfirmReport::default()),
            severed: severed_tx,
        });
        let serving = shared.clone();
        let acceptor = crate::accept_each(listener, move |client| {
            serve(client, server, serving.clone())
        });
        Ok(Self {
            addr,
            url: format!("{prefix}{addr}{rest}"),
            shared,
            severed,
            acceptor,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The broker's URL with the proxy in place of the broker's address.
    pub fn amqp_url(&self) -> &str {
        &self.url
    }

    /// Swallows the next `basic.ack` on a watched connection that confirms at least
    /// `min_purchases` purchases (at least 1), and severs that connection after the silence.
    pub fn lose_next_confirm(&self, min_purchases: usize) {
        *self
            .shared
            .armed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(min_purchases.max(1));
    }

    /// What it saw so far.
    pub fn report(&self) -> ConfirmReport {
        self.shared.report().clone()
    }

    /// Waits until a connection whose confirm was swallowed has been severed, for at most
    /// `timeout`; whether it was.
    pub async fn wait_severed(&self, timeout: Duration) -> bool {
        let mut severed = self.severed.clone();
        tokio::time::timeout(timeout, severed.wait_for(|n| *n > 0))
            .await
            .is_ok_and(|seen| seen.is_ok())
    }
}

impl Drop for AmqpProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// `amqp://user:pw@host:port/vhost` as (`amqp://user:pw@`, `host:port`, `/vhost`).
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let scheme_end = url.find("://")? + 3;
    let after = &url[scheme_end..];
    let host_start = scheme_end + after.find('@').map_or(0, |at| at + 1);
    let host_len = url[host_start..]
        .find('/')
        .unwrap_or(url.len() - host_start);
    let authority = &url[host_start..host_start + host_len];
    authority
        .contains(':')
        .then(|| (&url[..host_start], authority, &url[host_start + host_len..]))
}

/// One client connection, both ways.
async fn serve(client: TcpStream, server: SocketAddr, shared: Arc<Shared>) {
    let Ok(upstream) = TcpStream::connect(server).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = upstream.into_split();
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let (sever, mut severed) = oneshot::channel::<()>();

    let up_tracker = tracker.clone();
    let up_shared = shared.clone();
    let up = async move {
        let mut reader = FrameReader::client();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = tokio::select! {
                biased;
                // Severed (or the broker's side ended): drop both halves.
                _ = &mut severed => return,
                read = client_read.read(&mut buf) => match read {
                    Ok(0) | Err(_) => {
                        let _ = server_write.shutdown().await;
                        return;
                    }
                    Ok(n) => n,
                },
            };
            // Read before it is forwarded: the broker cannot confirm a message the tracker
            // has not seen yet.
            reader.push(&buf[..n]);
            {
                let mut tracker = lock(&up_tracker);
                while let Ok(Some(frame)) = reader.next_frame() {
                    if tracker.client_sent(&frame, &up_shared.watched) {
                        up_shared.report().connections += 1;
                    }
                }
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let down = async move {
        let mut reader = FrameReader::server();
        let mut buf = vec![0u8; 64 * 1024];
        let mut silent_until: Option<Instant> = None;
        let mut out = Vec::with_capacity(buf.len());
        loop {
            let read = match silent_until {
                Some(until) => tokio::select! {
                    read = server_read.read(&mut buf) => read,
                    () = tokio::time::sleep_until(until) => {
                        shared.report().severed += 1;
                        shared.severed.send_modify(|n| *n += 1);
                        let _ = sever.send(());
                        return;
                    }
                },
                None => server_read.read(&mut buf).await,
            };
            let n = match read {
                Ok(0) | Err(_) => {
                    let _ = client_write.shutdown().await;
                    return;
                }
                Ok(n) => n,
            };
            if silent_until.is_some() {
                continue;
            }
            reader.push(&buf[..n]);
            out.clear();
            loop {
                let frame = match reader.next_frame() {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    // Unreadable: from here on it is forwarded as it comes.
                    Err(_) => {
                        out.extend_from_slice(&reader.take_rest());
                        break;
                    }
                };
                if swallows(&tracker, &shared, &frame) {
                    silent_until = Some(Instant::now() + shared.silence);
                    break;
                }
                out.extend_from_slice(&frame.bytes);
            }
            if !out.is_empty() && client_write.write_all(&out).await.is_err() {
                return;
            }
        }
    };
    tokio::join!(up, down);
}

fn lock(tracker: &Mutex<Tracker>) -> std::sync::MutexGuard<'_, Tracker> {
    tracker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Books a frame from the broker; whether it is the ack to swallow.
fn swallows(tracker: &Mutex<Tracker>, shared: &Shared, frame: &Frame) -> bool {
    let mut tracker = lock(tracker);
    let Some(acked) = tracker.broker_sent(frame) else {
        return false;
    };
    if !tracker.watched {
        return false;
    }
    drop(tracker);
    let messages = acked.len();
    let purchases: Vec<String> = acked.into_iter().flatten().collect();
    let mut armed = shared
        .armed
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if armed.is_some_and(|min| purchases.len() >= min) {
        *armed = None;
        shared.report().swallowed = Some(purchases);
        return true;
    }
    drop(armed);
    let mut report = shared.report();
    report.passed_messages += messages;
    report.passed.extend(purchases);
    false
}

/// One whole frame, as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Frame {
    bytes: Vec<u8>,
}

impl Frame {
    fn kind(&self) -> u8 {
        self.bytes[0]
    }

    fn channel(&self) -> u16 {
        u16::from_be_bytes([self.bytes[1], self.bytes[2]])
    }

    fn payload(&self) -> &[u8] {
        &self.bytes[FRAME_PREFIX..self.bytes.len() - 1]
    }

    /// Class and method of a method frame.
    fn method(&self) -> Option<(u16, u16)> {
        let p = self.payload();
        (self.kind() == FRAME_METHOD && p.len() >= 4).then(|| {
            (
                u16::from_be_bytes([p[0], p[1]]),
                u16::from_be_bytes([p[2], p[3]]),
            )
        })
    }
}

/// A frame that cannot be read: the stream is no AMQP 0-9-1 (or the proxy lost its place).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Malformed;

/// Cuts a byte stream into frames, whatever the chunks it arrives in.
#[derive(Debug)]
struct FrameReader {
    buf: Vec<u8>,
    /// The client's protocol header is still to come.
    header_due: bool,
    /// It lost its place: nothing more is read.
    broken: bool,
}

impl FrameReader {
    /// For what a client sends: the protocol header, then frames.
    fn client() -> Self {
        Self {
            buf: Vec::new(),
            header_due: true,
            broken: false,
        }
    }

    /// For what the broker sends: frames only.
    fn server() -> Self {
        Self {
            buf: Vec::new(),
            header_due: false,
            broken: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if !self.broken {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The next whole frame, `None` until one is complete.
    fn next_frame(&mut self) -> Result<Option<Frame>, Malformed> {
        if self.broken {
            return Err(Malformed);
        }
        if self.header_due {
            if self.buf.len() < PROTOCOL_HEADER.len() {
                return Ok(None);
            }
            if &self.buf[..PROTOCOL_HEADER.len()] != PROTOCOL_HEADER {
                self.broken = true;
                return Err(Malformed);
            }
            self.buf.drain(..PROTOCOL_HEADER.len());
            self.header_due = false;
        }
        if self.buf.len() < FRAME_PREFIX {
            return Ok(None);
        }
        let size = u32::from_be_bytes([self.buf[3], self.buf[4], self.buf[5], self.buf[6]]);
        let whole = FRAME_PREFIX + size as usize + 1;
        if self.buf.len() < whole {
            return Ok(None);
        }
        if self.buf[whole - 1] != FRAME_END {
            self.broken = true;
            return Err(Malformed);
        }
        let bytes: Vec<u8> = self.buf.drain(..whole).collect();
        Ok(Some(Frame { bytes }))
    }

    /// What it holds and has not returned as frames (once it stopped reading).
    fn take_rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// A message being published: its tag, then its content header and body.
#[derive(Debug, Default)]
struct Publishing {
    /// `None` on a channel not confirming.
    tag: Option<u64>,
    content_type: Option<String>,
    /// `None` until the content header came.
    size: Option<u64>,
    body: Vec<u8>,
}

#[derive(Debug, Default)]
struct Channel {
    /// After `confirm.select`: the tag of the next message published.
    next_tag: Option<u64>,
    publishing: Option<Publishing>,
    /// The purchases of each published message not yet confirmed, by delivery tag.
    unconfirmed: BTreeMap<u64, Vec<String>>,
}

/// One connection's confirm bookkeeping.
#[derive(Debug, Default)]
struct Tracker {
    /// The client named itself as the watched one.
    watched: bool,
    channels: HashMap<u16, Channel>,
}

impl Tracker {
    /// Books a frame the client sent; true when it is the `connection.start-ok` that names
    /// the connection as `watched`.
    fn client_sent(&mut self, frame: &Frame, watched: &str) -> bool {
        let channel = frame.channel();
        match frame.kind() {
            FRAME_METHOD => match frame.method() {
                Some((10, 11)) => {
                    let named = connection_name(&frame.payload()[4..]);
                    self.watched = named.as_deref() == Some(watched);
                    return self.watched;
                }
                // channel.open, channel.close, channel.close-ok: a fresh channel.
                Some((20, 10 | 40 | 41)) => {
                    self.channels.remove(&channel);
                }
                Some((85, 10)) => {
                    self.channels.entry(channel).or_default().next_tag = Some(1);
                }
                Some((60, 40)) => {
                    let state = self.channels.entry(channel).or_default();
                    let tag = state.next_tag;
                    if let Some(next) = state.next_tag.as_mut() {
                        *next += 1;
                    }
                    state.publishing = Some(Publishing {
                        tag,
                        ..Publishing::default()
                    });
                }
                _ => {}
            },
            FRAME_HEADER => {
                if let Some(state) = self.channels.get_mut(&channel)
                    && let Some(publishing) = state.publishing.as_mut()
                    && let Some((size, content_type)) = content_header(frame.payload())
                {
                    publishing.size = Some(size);
                    publishing.content_type = content_type;
                    state.complete();
                }
            }
            FRAME_BODY => {
                if let Some(state) = self.channels.get_mut(&channel)
                    && let Some(publishing) = state.publishing.as_mut()
                {
                    publishing.body.extend_from_slice(frame.payload());
                    state.complete();
                }
            }
            _ => {}
        }
        false
    }

    /// Books a frame the broker sent; for a `basic.ack`, the purchases of each message it
    /// confirms (an ack of nothing known: none).
    fn broker_sent(&mut self, frame: &Frame) -> Option<Vec<Vec<String>>> {
        let channel = frame.channel();
        match frame.method() {
            // channel.close (the broker closing it), channel.close-ok.
            Some((20, 40 | 41)) => {
                self.channels.remove(&channel);
                None
            }
            Some((60, 80 | 120)) => {
                let ack = frame.method() == Some((60, 80));
                let args = &frame.payload()[4..];
                if args.len() < 9 {
                    return None;
                }
                let tag = u64::from_be_bytes(args[..8].try_into().ok()?);
                let multiple = args[8] & 1 == 1;
                let state = self.channels.get_mut(&channel)?;
                let covered: Vec<u64> = if multiple {
                    state
                        .unconfirmed
                        .keys()
                        .copied()
                        .take_while(|t| tag == 0 || *t <= tag)
                        .collect()
                } else {
                    vec![tag]
                };
                let confirmed = covered
                    .into_iter()
                    .filter_map(|t| state.unconfirmed.remove(&t))
                    .collect();
                ack.then_some(confirmed)
            }
            _ => None,
        }
    }
}

impl Channel {
    /// Files the message being published once its body is whole.
    fn complete(&mut self) {
        let whole = self
            .publishing
            .as_ref()
            .is_some_and(|p| p.size.is_some_and(|size| p.body.len() as u64 >= size));
        if !whole {
            return;
        }
        if let Some(done) = self.publishing.take()
            && let Some(tag) = done.tag
        {
            self.unconfirmed
                .insert(tag, purchases(done.content_type.as_deref(), &done.body));
        }
    }
}

/// The request ids a published message carries: a batch's parts, or a single order's own.
fn purchases(content_type: Option<&str>, body: &[u8]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        request_id: String,
    }
    if content_type == Some(seckill_messaging::batch::CONTENT_TYPE) {
        let properties = lapin::BasicProperties::default()
            .with_content_type(seckill_messaging::batch::CONTENT_TYPE.into());
        return seckill_messaging::batch::unpack(body, &properties)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.properties.message_id().as_ref())
                    .map(|id| id.as_str().to_string())
                    .filter(|id| !id.is_empty())
                    .collect()
            })
            .unwrap_or_default();
    }
    serde_json::from_slice::<Named>(body)
        .map(|named| vec![named.request_id])
        .unwrap_or_default()
}

/// A content header's body size and content type.
fn content_header(payload: &[u8]) -> Option<(u64, Option<String>)> {
    // class, weight, body size, property flags.
    let size = u64::from_be_bytes(payload.get(4..12)?.try_into().ok()?);
    let flags = u16::from_be_bytes(payload.get(12..14)?.try_into().ok()?);
    let content_type = if flags & 0x8000 != 0 {
        let mut cursor = Cursor(payload.get(14..)?);
        Some(cursor.short_str()?)
    } else {
        None
    };
    Some((size, content_type))
}

/// The `connection_name` among the client properties of a `connection.start-ok`'s
/// arguments (the field table comes first).
fn connection_name(args: &[u8]) -> Option<String> {
    let mut cursor = Cursor(args);
    let table = cursor.take_long()?;
    let mut table = Cursor(table);
    while !table.0.is_empty() {
        let name = table.short_str()?;
        let kind = table.byte()?;
        if name == "connection_name" && kind == b'S' {
            return String::from_utf8(table.take_long()?.to_vec()).ok();
        }
        table.skip_value(kind)?;
    }
    None
}

/// Reads AMQP's encodings off a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (taken, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(taken)
    }

    fn byte(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn short_str(&mut self) -> Option<String> {
        let len = self.byte()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }

    /// A 32-bit length, then that many bytes.
    fn take_long(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_be_bytes(self.take(4)?.try_into().ok()?);
        self.take(len as usize)
    }

    /// Skips a field value of type `kind` (RabbitMQ's field types).
    fn skip_value(&mut self, kind: u8) -> Option<()> {
        let fixed = match kind {
            b't' | b'b' | b'B' => 1,
            b's' | b'u' => 2,
            b'I' | b'i' | b'f' => 4,
            b'l' | b'L' | b'd' | b'T' => 8,
            b'D' => 5,
            b'V' => 0,
            b'S' | b'F' | b'A' | b'x' => {
                self.take_long()?;
                return Some(());
            }
            _ => return None,
        };
        self.take(fixed).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
        let mut bytes = vec![kind];
        bytes.extend_from_slice(&channel.to_be_bytes());
        bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bytes.extend_from_slice(payload);
        bytes.push(FRAME_END);
        bytes
    }

    fn method(channel: u16, class: u16, method: u16, args: &[u8]) -> Vec<u8> {
        let mut payload = class.to_be_bytes().to_vec();
        payload.extend_from_slice(&method.to_be_bytes());
        payload.extend_from_slice(args);
        frame(FRAME_METHOD, channel, &payload)
    }

    fn short(s: &str) -> Vec<u8> {
        let mut bytes = vec![s.len() as u8];
        bytes.extend_from_slice(s.as_bytes());
        bytes
    }

    fn long(bytes: &[u8]) -> Vec<u8> {
        let mut out = (bytes.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        out
    }

    /// A `connection.start-ok` as lapin writes it: nested capabilities, then the name.
    fn start_ok(name: &str) -> Vec<u8> {
        let mut capabilities = short("publisher_confirms");
        capabilities.extend_from_slice(b"t\x01");
        let mut table = short("product");
        table.push(b'S');
        table.extend(long(b"lapin"));
        table.extend(short("capabilities"));
        table.push(b'F');
        table.extend(long(&capabilities));
        table.extend(short("frame_max_hint"));
        table.push(b'I');
        table.extend_from_slice(&131_072u32.to_be_bytes());
        table.extend(short("connection_name"));
        table.push(b'S');
        table.extend(long(name.as_bytes()));
        let mut args = long(&table);
        args.extend(short("PLAIN"));
        args.extend(long(b"\0guest\0guest"));
        args.extend(short("en_US"));
        method(0, 10, 11, &args)
    }

    fn publish(channel: u16) -> Vec<u8> {
        let mut args = 0u16.to_be_bytes().to_vec();
        args.extend(short("orders"));
        args.extend(short("order.created"));
        args.push(0b01); // mandatory
        method(channel, 60, 40, &args)
    }

    fn content_header_frame(channel: u16, size: u64, content_type: &str) -> Vec<u8> {
        let mut payload = 60u16.to_be_bytes().to_vec();
        payload.extend_from_slice(&0u16.to_be_bytes());
        payload.extend_from_slice(&size.to_be_bytes());
        // content-type and delivery-mode.
        payload.extend_from_slice(&(0x8000u16 | 0x1000).to_be_bytes());
        payload.extend(short(content_type));
        payload.push(2);
        frame(FRAME_HEADER, channel, &payload)
    }

    fn ack(channel: u16, tag: u64, multiple: bool) -> Frame {
        let mut args = tag.to_be_bytes().to_vec();
        args.push(u8::from(multiple));
        Frame {
            bytes: method(channel, 60, 80, &args),
        }
    }

    fn batch_body(ids: &[&str]) -> Vec<u8> {
        let parts: Vec<String> = ids
            .iter()
            .map(|id| {
                format!(
                    r#"{{"signature":"v1:x","http_request_id":"h","order":{{"request_id":"{id}","user_id":1}}}}"#
                )
            })
            .collect();
        format!(r#"{{"orders":[{}]}}"#, parts.join(",")).into_bytes()
    }

    fn frames_of(reader: &mut FrameReader) -> Vec<Frame> {
        std::iter::from_fn(|| reader.next_frame().expect("well-formed")).collect()
    }

    #[test]
    fn frames_come_out_whole_however_the_bytes_are_cut() {
        let mut stream = PROTOCOL_HEADER.to_vec();
        let sent = [
            start_ok("seckill-api publisher"),
            method(1, 85, 10, &[0]),
            frame(8, 0, &[]),
            frame(FRAME_BODY, 1, &[7u8; 300]),
        ];
        for f in &sent {
            stream.extend_from_slice(f);
        }
        for cut in [1, 2, 3, 7, 8, 9, 64, stream.len()] {
            let mut reader = FrameReader::client();
            let mut got = Vec::new();
            for chunk in stream.chunks(cut) {
                reader.push(chunk);
                got.extend(frames_of(&mut reader));
            }
            let bytes: Vec<Vec<u8>> = got.into_iter().map(|f| f.bytes).collect();
            assert_eq!(bytes, sent.to_vec(), "cut every {cut} bytes");
        }
    }

    #[test]
    fn a_frame_without_its_end_octet_or_a_foreign_header_is_refused() {
        let mut bad = frame(FRAME_METHOD, 0, &[0, 10, 0, 11]);
        *bad.last_mut().unwrap() = 0;
        let mut reader = FrameReader::server();
        reader.push(&bad);
        assert_eq!(reader.next_frame(), Err(Malformed));
        // Once lost, it stays lost, and hands back what it held.
        reader.push(&frame(8, 0, &[]));
        assert_eq!(reader.next_frame(), Err(Malformed));
        assert_eq!(reader.take_rest(), bad);

        let mut reader = FrameReader::client();
        reader.push(b"HTTP/1.1 200 OK\r\n");
        assert_eq!(reader.next_frame(), Err(Malformed));
    }

    #[test]
    fn the_connection_is_named_by_its_start_ok() {
        let frame = Frame {
            bytes: start_ok("seckill-api publisher"),
        };
        assert_eq!(frame.method(), Some((10, 11)));
        assert_eq!(
            connection_name(&frame.payload()[4..]).as_deref(),
            Some("seckill-api publisher")
        );
        let mut tracker = Tracker::default();
        assert!(tracker.client_sent(&frame, "seckill-api publisher"));
        assert!(tracker.watched);
        let mut other = Tracker::default();
        assert!(!other.client_sent(&frame, "seckill-api relay"));
        assert!(!other.watched);
    }

    #[test]
    fn acks_confirm_the_purchases_of_the_messages_they_cover() {
        let (a, b, c) = (
            "018f0000-0000-7000-8000-00000000000a",
            "018f0000-0000-7000-8000-00000000000b",
            "018f0000-0000-7000-8000-00000000000c",
        );
        let mut tracker = Tracker::default();
        let mut from_client = |bytes: Vec<u8>| {
            tracker.client_sent(&Frame { bytes }, "w");
        };
        from_client(method(1, 20, 10, &short("")));
        from_client(method(1, 85, 10, &[0]));
        // Tag 1: a batch of two, its body in two frames, and another channel in between.
        let batch = batch_body(&[a, b]);
        from_client(publish(1));
        from_client(content_header_frame(
            1,
            batch.len() as u64,
            seckill_messaging::batch::CONTENT_TYPE,
        ));
        from_client(frame(FRAME_BODY, 1, &batch[..10]));
        from_client(method(2, 20, 10, &short("")));
        from_client(frame(FRAME_BODY, 1, &batch[10..]));
        // Tag 2: a single order.
        let single = format!(r#"{{"request_id":"{c}","user_id":3}}"#).into_bytes();
        from_client(publish(1));
        from_client(content_header_frame(
            1,
            single.len() as u64,
            "application/json",
        ));
        from_client(frame(FRAME_BODY, 1, &single));
        // Tag 3: nacked later; tag 4: acked by a `multiple` ack with tag 3's nack gone.
        for _ in 0..2 {
            let body = batch_body(&[c]);
            from_client(publish(1));
            from_client(content_header_frame(
                1,
                body.len() as u64,
                seckill_messaging::batch::CONTENT_TYPE,
            ));
            from_client(frame(FRAME_BODY, 1, &body));
        }

        assert_eq!(
            tracker.broker_sent(&ack(1, 1, false)),
            Some(vec![vec![a.to_string(), b.to_string()]])
        );
        // An ack of a tag already confirmed confirms nothing more.
        assert_eq!(tracker.broker_sent(&ack(1, 1, false)), Some(vec![]));
        let mut nack = ack(1, 3, false);
        nack.bytes[10] = 120;
        assert_eq!(tracker.broker_sent(&nack), None);
        assert_eq!(
            tracker.broker_sent(&ack(1, 4, true)),
            Some(vec![vec![c.to_string()], vec![c.to_string()]])
        );
        // A channel the client never opened, and frames that are no ack.
        assert_eq!(tracker.broker_sent(&ack(9, 1, false)), None);
        assert_eq!(
            tracker.broker_sent(&Frame {
                bytes: frame(8, 0, &[])
            }),
            None
        );
    }

    #[test]
    fn a_channel_not_confirming_has_no_tags() {
        let mut tracker = Tracker::default();
        let body = batch_body(&["018f0000-0000-7000-8000-00000000000a"]);
        for bytes in [
            method(1, 20, 10, &short("")),
            publish(1),
            content_header_frame(1, body.len() as u64, seckill_messaging::batch::CONTENT_TYPE),
            frame(FRAME_BODY, 1, &body),
        ] {
            tracker.client_sent(&Frame { bytes }, "w");
        }
        assert_eq!(tracker.broker_sent(&ack(1, 1, false)), Some(vec![]));
    }

    #[test]
    fn the_url_points_at_the_proxy() {
        assert_eq!(
            split_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            Some(("amqp://guest:guest@", "127.0.0.1:5672", "/%2f"))
        );
        assert_eq!(
            split_url("amqp://localhost:5672"),
            Some(("amqp://", "localhost:5672", ""))
        );
        assert_eq!(split_url("localhost:5672"), None);
    }
}
