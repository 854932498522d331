//! A TCP proxy that delays what clients send, for tests of a slow dependency.
//!
//! Point a service at [`LatencyProxy::addr`] instead of the server; [`LatencyProxy::set_delay`]
//! then holds every chunk a client sends for that long before it reaches the server. A chunk
//! is stamped when it arrives and forwarded when its time comes, so the proxy adds latency,
//! not a throughput cap: a pipelined client still has many requests in flight. Answers flow
//! back untouched. A new connection to the server is opened per client connection, so the
//! server may restart behind the proxy.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Chunks a client may have waiting in the delay line before its reads stop.
const LINE_CAPACITY: usize = 1024;

/// A loopback proxy in front of one server; dropping it stops accepting and ends every
/// connection.
#[derive(Debug)]
pub struct LatencyProxy {
    addr: SocketAddr,
    /// Microseconds each client chunk waits.
    delay_us: Arc<AtomicU64>,
    acceptor: JoinHandle<()>,
}

impl LatencyProxy {
    /// Listens on a free loopback port and forwards each connection to `server`.
    pub async fn start(server: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let delay_us = Arc::new(AtomicU64::new(0));
        let delay = delay_us.clone();
        let acceptor =
            crate::accept_each(listener, move |client| serve(client, server, delay.clone()));
        Ok(Self {
            addr,
            delay_us,
            acceptor,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How long every chunk a client sends from now on waits; zero: none.
    pub fn set_delay(&self, delay: Duration) {
        let micros = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.delay_us.store(micros, Ordering::Relaxed);
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

/// One client connection: client → delay line → server, server → client.
async fn serve(client: TcpStream, server: SocketAddr, delay_us: Arc<AtomicU64>) {
    let Ok(upstream) = TcpStream::connect(server).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = upstream.into_split();
    let (line, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(LINE_CAPACITY);

    let stamp = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let wait = Duration::from_micros(delay_us.load(Ordering::Relaxed));
                    if line
                        .send((Instant::now() + wait, buf[..n].to_vec()))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    let forward = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if server_write.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let back = async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    // A side that closes passes its close on (after the delay line drained), and the other
    // side's close follows; the connection ends when all three are done.
    tokio::join!(stamp, forward, back);
}
