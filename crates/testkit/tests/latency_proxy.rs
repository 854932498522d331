//! The latency proxy carries bytes both ways, holds what clients send for the delay it is
//! set to, and survives the server behind it going away.

use std::time::{Duration, Instant};

use seckill_testkit::LatencyProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An echo server on a free loopback port.
async fn echo_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn round_trip(client: &mut TcpStream, message: &[u8]) -> (Vec<u8>, Duration) {
    let sent = Instant::now();
    client.write_all(message).await.expect("write");
    let mut echoed = vec![0u8; message.len()];
    client.read_exact(&mut echoed).await.expect("read the echo");
    (echoed, sent.elapsed())
}

#[tokio::test]
async fn what_a_client_sends_waits_the_set_delay_and_arrives_intact() {
    let proxy = LatencyProxy::start(echo_server().await)
        .await
        .expect("start the proxy");
    let mut client = TcpStream::connect(proxy.addr()).await.expect("connect");

    let (echoed, _) = round_trip(&mut client, b"PING").await;
    assert_eq!(echoed, b"PING");

    proxy.set_delay(Duration::from_millis(300));
    let (echoed, took) = round_trip(&mut client, b"slow PING").await;
    assert_eq!(echoed, b"slow PING");
    assert!(
        took >= Duration::from_millis(300),
        "came back after {took:?}"
    );

    // Back to no delay: the next round trip is not held 300 ms.
    proxy.set_delay(Duration::ZERO);
    let (echoed, took) = round_trip(&mut client, b"PING again").await;
    assert_eq!(echoed, b"PING again");
    assert!(took < Duration::from_millis(300), "still delayed: {took:?}");
}

#[tokio::test]
async fn a_client_of_a_server_that_is_gone_sees_its_connection_closed() {
    // A port nobody listens on: the proxy's connection to it is refused.
    let gone = {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        listener.local_addr().expect("addr")
    };
    let proxy = LatencyProxy::start(gone).await.expect("start the proxy");
    let mut client = TcpStream::connect(proxy.addr()).await.expect("connect");
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
        .await
        .expect("closed within 5 s");
    assert!(matches!(read, Ok(0) | Err(_)), "read {read:?}");
}
