//! `connect` against a broker that goes away in the middle of the AMQP handshake.
//!
//! A proxy in front of the real broker (`SECKILL_TEST_AMQP`, else the local one) passes the
//! handshake through frame by frame and, after the broker's `n`-th frame, ends the client's
//! connection one way or another: what a client sees of a broker stopped while it connects,
//! or of one that stops answering. The broker itself is never touched. Every attempt must
//! end, with an error, and never hang: a worker stuck in its connect never reconnects (order-service's consumer once stayed
//! so until restarted, when its broker stopped just as it connected).

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use lapin::uri::AMQPUri;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The broker frames of the handshake a cut may follow: `Connection.Start`, `Tune`.
const HANDSHAKE_FRAMES: usize = 2;
/// Rounds of cuts after `Tune` at most: lapin's hang there is a race, met by a few attempts
/// in a hundred.
const ROUNDS: usize = 50;

/// How the proxy ends the client's connection.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// RST once the client answered the last frame passed, as when the broker's process died.
    Reset,
    /// RST at once, without waiting for the client's answer.
    ResetNow,
    /// FIN once the client answered, as when the broker closes the socket in an orderly way.
    Close,
    /// `Connection.Close` 320 once the client answered, as a broker shutting down sends.
    Forced,
    /// Nothing more once the client answered, the socket left open: a broker that hangs.
    Silent,
}

const CUTS: [Cut; 4] = [Cut::Reset, Cut::ResetNow, Cut::Close, Cut::Forced];

fn broker_url() -> String {
    std::env::var("SECKILL_TEST_AMQP")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The broker's address and a URL with the same credentials and vhost (encoded as given)
/// pointing at `proxy`.
fn through(proxy: SocketAddr) -> (String, String) {
    let url = broker_url();
    let uri: AMQPUri = url.parse().expect("an AMQP URL");
    let broker = format!("{}:{}", uri.authority.host, uri.authority.port);
    let rest = url.strip_prefix("amqp://").expect("an amqp:// URL");
    let (userinfo, hosted) = rest.split_once('@').unwrap_or(("guest:guest", rest));
    let path = hosted.find('/').map_or("/%2f", |at| &hosted[at..]);
    (broker, format!("amqp://{userinfo}@{proxy}{path}"))
}

/// What a broker shutting down sends each connection.
fn connection_forced() -> Vec<u8> {
    let text = b"CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'";
    // Class 10 (connection), method 50 (close), reply code, reply text, failing class/method.
    let mut payload = vec![0, 10, 0, 50];
    payload.extend_from_slice(&320u16.to_be_bytes());
    payload.push(u8::try_from(text.len()).expect("a short string"));
    payload.extend_from_slice(text);
    payload.extend_from_slice(&[0, 0, 0, 0]);
    // A method frame on channel 0: type, channel, size, payload, end marker.
    let mut frame = vec![1, 0, 0];
    frame.extend_from_slice(&u32::try_from(payload.len()).expect("small").to_be_bytes());
    frame.extend_from_slice(&payload);
    frame.push(0xCE);
    frame
}

/// The length of the whole frame `bytes` starts with, once its header is in.
fn frame_len(bytes: &[u8]) -> Option<usize> {
    let size: [u8; 4] = bytes.get(3..7)?.try_into().ok()?;
    Some(8 + u32::from_be_bytes(size) as usize)
}

/// Reads from `from` until `pending` starts with a whole frame, and takes that frame; an end
/// of the stream is an `UnexpectedEof` error.
async fn whole_frame(from: &mut TcpStream, pending: &mut Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut buf = [0u8; 4096];
    while frame_len(pending).is_none_or(|len| pending.len() < len) {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        pending.extend_from_slice(&buf[..n]);
    }
    let len = frame_len(pending).expect("a whole frame");
    Ok(pending.drain(..len).collect())
}

/// Where the proxy's part of a handshake stopped short.
#[derive(Debug)]
enum Short {
    /// The client went first (closed, reset, or gave up): its attempt is over, which is all a
    /// cut connect is judged by.
    Client,
    /// The real broker, or the proxy's own listener, failed: the run proves nothing.
    Broker(String),
}

/// Accepts one client and passes the handshake through until the broker's `frames`-th frame
/// reached it, then ends the client's connection by `cut`. It also stops as soon as the
/// client's attempt is over: a client that hangs where no cut expected it, and is then given
/// up on, keeps its socket open, and must not keep the proxy waiting for its answer.
///
/// The handshake is lock-step (the broker sends a frame only once the client answered the one
/// before), so the proxy alternates: a broker frame to the client, the client's answer to
/// the broker.
async fn proxy_once(
    listener: TcpListener,
    broker: String,
    frames: usize,
    cut: Cut,
    attempt_over: CancellationToken,
) -> Result<(), String> {
    let relay = async {
        let (mut client, _) = listener
            .accept()
            .await
            .map_err(|e| Short::Broker(format!("the proxy's accept: {e}")))?;
        let mut server = TcpStream::connect(&broker)
            .await
            .map_err(|e| Short::Broker(format!("reach the broker: {e}")))?;
        // The client speaks first: its protocol header, 8 bytes.
        let mut header = [0u8; 8];
        client
            .read_exact(&mut header)
            .await
            .map_err(|_| Short::Client)?;
        let to_broker = |e: std::io::Error| Short::Broker(format!("broker: {e}"));
        server.write_all(&header).await.map_err(to_broker)?;
        let (mut from_server, mut from_client) = (Vec::new(), Vec::new());
        for passed in 1..=frames {
            let frame = whole_frame(&mut server, &mut from_server)
                .await
                .map_err(to_broker)?;
            client.write_all(&frame).await.map_err(|_| Short::Client)?;
            if passed == frames && matches!(cut, Cut::ResetNow) {
                break;
            }
            // The client's answer; the last one never reaches the broker.
            let answer = whole_frame(&mut client, &mut from_client)
                .await
                .map_err(|_| Short::Client)?;
            if passed < frames {
                server.write_all(&answer).await.map_err(to_broker)?;
            }
        }
        Ok((client, server))
    };
    let (mut client, _server) = tokio::select! {
        relayed = relay => match relayed {
            Ok(sockets) => sockets,
            Err(Short::Client) => return Ok(()),
            Err(Short::Broker(why)) => return Err(why),
        },
        () = attempt_over.cancelled() => return Ok(()),
    };
    // The client may be gone already, whatever the cut: it has no say in what follows.
    match cut {
        Cut::Reset | Cut::ResetNow => {
            let _ = client.set_zero_linger();
        }
        Cut::Close => {
            let _ = client.shutdown().await;
        }
        Cut::Forced => {
            let _ = client.write_all(&connection_forced()).await;
            let _ = client.shutdown().await;
        }
        Cut::Silent => {
            // Until the attempt is over: a connect given up on leaves lapin's socket open
            // (RabbitMQ would close it after its own handshake timeout; this proxy does then).
            attempt_over.cancelled().await;
        }
    }
    Ok(())
}

/// How one cut connect ended.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// With lapin's own error.
    Failed,
    /// With `connect`'s "no handshake within" error: lapin would have hung.
    TimedOut,
}

/// One connect through a proxy that cuts after `frames` broker frames by `cut`.
async fn cut_connect(frames: usize, cut: Cut) -> Result<Ended, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let (broker, url) = through(listener.local_addr().expect("addr"));
    let attempt_over = CancellationToken::new();
    let proxy = tokio::spawn(proxy_once(
        listener,
        broker,
        frames,
        cut,
        attempt_over.clone(),
    ));
    // Zero patience: one attempt, which must end on its own.
    let attempt = seckill_messaging::connect(&url, "handshake cut", Duration::ZERO);
    let ended = tokio::time::timeout(
        seckill_messaging::CONNECT_TIMEOUT + Duration::from_secs(10),
        attempt,
    )
    .await;
    attempt_over.cancel();
    // The client's attempt is over, so is the proxy's part.
    match tokio::time::timeout(Duration::from_secs(5), proxy).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(why))) => return Err(format!("cut after {frames} frame(s) by {cut:?}: {why}")),
        Ok(Err(panicked)) => return Err(format!("the proxy failed: {panicked}")),
        Err(_) => {
            return Err(format!(
                "cut after {frames} frame(s) by {cut:?}: proxy stuck"
            ));
        }
    }
    match ended {
        Ok(Ok(_)) => Err(format!(
            "cut after {frames} frame(s) by {cut:?}: a connection opened"
        )),
        Ok(Err(e)) if format!("{e:#}").contains("no AMQP handshake within") => Ok(Ended::TimedOut),
        Ok(Err(_)) => Ok(Ended::Failed),
        Err(_) => Err(format!("cut after {frames} frame(s) by {cut:?}: hung")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_lost_during_the_handshake_ends_the_connect() {
    for frames in 0..=HANDSHAKE_FRAMES {
        for cut in CUTS {
            let ended = cut_connect(frames, cut).await;
            assert!(ended.is_ok(), "{ended:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_broker_silent_after_tune_is_given_up_on() {
    // lapin has no handshake timeout of its own: only `CONNECT_TIMEOUT` ends this one.
    let ended = cut_connect(HANDSHAKE_FRAMES, Cut::Silent).await;
    assert_eq!(ended, Ok(Ended::TimedOut));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_race_that_hangs_lapin_after_tune_is_cut_short() {
    // The client has answered `Tune` and waits for `Open-Ok` when the broker goes: now and
    // then lapin's connect never ends. Cut there until that happened once, and was ended by
    // `CONNECT_TIMEOUT` rather than waited on forever.
    let mut tries = 0;
    for _ in 0..ROUNDS {
        for cut in CUTS {
            tries += 1;
            match cut_connect(HANDSHAKE_FRAMES, cut).await {
                Ok(Ended::Failed) => {}
                Ok(Ended::TimedOut) => {
                    eprintln!("lapin's connect hung on try {tries}; the bound ended it");
                    return;
                }
                Err(why) => panic!("try {tries}: {why}"),
            }
        }
    }
    eprintln!("lapin's connect did not hang in {tries} tries");
}

#[tokio::test]
async fn the_proxy_passes_a_whole_handshake() {
    // Without a cut, a connect through the same kind of proxy opens a connection: the cuts
    // above are what fails those connects, not the proxy.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let (broker, url) = through(listener.local_addr().expect("addr"));
    let proxy = tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.expect("accept");
        let mut server = TcpStream::connect(&broker).await.expect("reach the broker");
        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
    });
    let connection = seckill_messaging::connect(&url, "handshake whole", Duration::ZERO)
        .await
        .expect("connect through the proxy");
    assert!(connection.status().connected());
    connection.close(200, "done".into()).await.expect("close");
    proxy.abort();
}
