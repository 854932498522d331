//! The gateway follows the replicas behind one upstream name: several loopback addresses
//! (Linux routes all of 127/8) each run a replica on the same port, a test DNS server
//! answers the name, and the answer changes under continuous load.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use seckill_testkit::dns::DnsServer;
use seckill_testkit::eventually;

use crate::echo::{settings, spawn_gateway};
use crate::helpers::user_token;

const NAME: &str = "replicas.seckill.test";

/// A replica speaking just enough HTTP/1.1 (keep-alive, `200 ok` to every request), counting
/// the requests it answered and the connections it has open.
struct Replica {
    ip: Ipv4Addr,
    hits: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Replica {
    fn serve(ip: Ipv4Addr, listener: TcpListener) -> Self {
        let hits = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let (h, a, o) = (hits.clone(), accepted.clone(), open.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                o.fetch_add(1, Ordering::SeqCst);
                let (h, o) = (h.clone(), o.clone());
                tokio::spawn(async move {
                    let mut pending = Vec::new();
                    let mut buf = [0u8; 4096];
                    'connection: loop {
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            pending.drain(..end + 4);
                            h.fetch_add(1, Ordering::SeqCst);
                            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if stream.write_all(answer).await.is_err() {
                                break 'connection;
                            }
                        }
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                    }
                    o.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            ip,
            hits,
            accepted,
            open,
            task,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// A replica on each of `127.0.0.<octet>`, all on one port.
async fn replicas_on_one_port(octets: &[u8]) -> (u16, Vec<Replica>) {
    'attempt: for _ in 0..50 {
        let ip = |octet: u8| Ipv4Addr::new(127, 0, 0, octet);
        let first = TcpListener::bind((ip(octets[0]), 0)).await.expect("bind");
        let port = first.local_addr().expect("addr").port();
        let mut listeners = vec![first];
        for &octet in &octets[1..] {
            // Taken on that address by someone else: another port.
            match TcpListener::bind((ip(octet), port)).await {
                Ok(listener) => listeners.push(listener),
                Err(_) => continue 'attempt,
            }
        }
        let replicas = octets
            .iter()
            .zip(listeners)
            .map(|(&octet, listener)| Replica::serve(ip(octet), listener))
            .collect();
        return (port, replicas);
    }
    panic!("no port free on every address");
}

#[tokio::test]
async fn a_replica_added_behind_the_name_gets_traffic_and_a_departed_one_is_let_go() {
    let (port, replicas) = replicas_on_one_port(&[2, 3, 4]).await;
    let [two, three, four] = &replicas[..] else {
        unreachable!()
    };
    let dns = DnsServer::start().await;
    dns.set(NAME, &[two.ip, three.ip]);
    let interval = gateway::Settings::default().upstream_resolve_interval;
    let gateway = spawn_gateway(gateway::Settings {
        seckill_api_urls: vec![format!("http://{NAME}:{port}")],
        order_service_urls: vec!["http://127.0.0.1:9".into()],
        dns_server: dns.addr().to_string(),
        rate_limit_enabled: false,
        workers: 2,
        ..settings("http://127.0.0.1:9")
    })
    .await;

    // Continuous load: four clients, each on its own connections.
    let stop = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, answered, failed) = (stop.clone(), answered.clone(), failed.clone());
            let url = format!("{}/api/products", gateway.url);
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let token = user_token(61);
                while !stop.load(Ordering::SeqCst) {
                    match client.get(&url).bearer_auth(&token).send().await {
                        Ok(response) if response.status() == 200 => {
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(response) => {
                            eprintln!("answered {}", response.status());
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => {
                            eprintln!("request failed: {e}");
                            failed.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            })
        })
        .collect();
    // Both first addresses serve.
    eventually(
        "both resolved replicas to serve",
        Duration::from_secs(10),
        || async { (two.hits() > 0 && three.hits() > 0).then_some(()) },
    )
    .await;
    assert_eq!(four.hits(), 0);

    // A third replica appears behind the name: it is in rotation within an interval.
    dns.set(NAME, &[two.ip, three.ip, four.ip]);
    let added = Instant::now();
    eventually(
        "the added replica to get traffic",
        interval + Duration::from_secs(5),
        || async { (four.hits() > 0).then_some(()) },
    )
    .await;
    let first_request_after = added.elapsed();
    eprintln!(
        "added replica's first request after {first_request_after:?} (interval {interval:?})"
    );
    assert!(first_request_after < interval + Duration::from_secs(3));

    // The first one leaves: its connections are closed once its requests finished, and it
    // gets no new requests while the others carry on.
    assert!(two.accepted.load(Ordering::SeqCst) > 0);
    dns.set(NAME, &[three.ip, four.ip]);
    eventually(
        "the departed replica's connections to close",
        interval + Duration::from_secs(10),
        || async { (two.open() == 0).then_some(()) },
    )
    .await;
    let (left_with, three_before, four_before) = (two.hits(), three.hits(), four.hits());
    eventually(
        "the others to carry on",
        Duration::from_secs(10),
        || async {
            (three.hits() > three_before + 50 && four.hits() > four_before + 50).then_some(())
        },
    )
    .await;
    assert_eq!(two.hits(), left_with, "no request after it left");
    assert_eq!(two.open(), 0, "and no new connection");

    // The name fails to resolve, then disappears: the last known set stays in service.
    for (outcome, break_it) in [
        ("error", Box::new(|| dns.fail(true)) as Box<dyn Fn()>),
        (
            "empty",
            Box::new(|| {
                dns.fail(false);
                dns.remove(NAME);
            }) as Box<dyn Fn()>,
        ),
    ] {
        let before = gateway
            .metric(
                "gateway_upstream_resolutions_total",
                &[("upstream", "seckill-api"), ("outcome", outcome)],
            )
            .await;
        break_it();
        eventually(
            "failed resolutions to be counted",
            interval * 3 + Duration::from_secs(5),
            || async {
                let now = gateway
                    .metric(
                        "gateway_upstream_resolutions_total",
                        &[("upstream", "seckill-api"), ("outcome", outcome)],
                    )
                    .await;
                (now >= before + 2.0).then_some(())
            },
        )
        .await;
        let (three_before, four_before) = (three.hits(), four.hits());
        eventually(
            "the last known replicas to keep serving",
            Duration::from_secs(10),
            || async {
                (three.hits() > three_before + 50 && four.hits() > four_before + 50).then_some(())
            },
        )
        .await;
    }
    assert_eq!(two.hits(), left_with);

    stop.store(true, Ordering::SeqCst);
    for task in load {
        task.await.expect("load task");
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "every request answered 200"
    );
    assert!(answered.load(Ordering::SeqCst) > 300);
    assert!(dns.queries() >= 4);
}
