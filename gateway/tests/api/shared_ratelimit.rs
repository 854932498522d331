//! `rate_limit_backend = "redis"`: the quotas hold across gateway replicas, and a Redis
//! outage lets traffic through instead of stopping it.

use gateway::ratelimit::RateLimitFailure;
use seckill_testkit::{OwnRedis, Persistence, TestNamespace};

use crate::echo::{closed_port_url, settings, spawn_echo, spawn_gateway};
use crate::helpers::user_token;
use crate::ratelimit::{assert_is_429, header, until_limited};

fn shared(upstream: &str, ns: &TestNamespace) -> gateway::Settings {
    gateway::Settings {
        rate_limit_backend: gateway::ratelimit::RateLimitBackend::Redis,
        redis_url: ns.redis_url.as_str().into(),
        redis_cluster: ns.redis_cluster,
        namespace: ns.namespace.clone(),
        rate_purchase_per_sec: 1,
        rate_purchase_burst: 3,
        ..settings(upstream)
    }
}

#[tokio::test]
async fn two_gateways_sharing_redis_charge_one_bucket_per_user() {
    let ns = TestNamespace::new();
    let echo = spawn_echo().await;
    let a = spawn_gateway(shared(&echo.url, &ns)).await;
    let b = spawn_gateway(shared(&echo.url, &ns)).await;
    let token = user_token(71);
    let buy = |gateway: &crate::echo::Gateway| {
        let request = gateway.post("/api/seckill/1").bearer_auth(&token);
        async move { request.send().await.expect("request") }
    };

    // The second replica sees what the first one spent.
    let first = buy(&a).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "x-ratelimit-limit"), 3);
    assert_eq!(header(&first, "x-ratelimit-remaining"), 2);
    let second = buy(&b).await;
    assert_eq!(second.status(), 200);
    assert_eq!(header(&second, "x-ratelimit-remaining"), 1);

    let mut turn = 0;
    let (passed, limited) = until_limited(|| {
        turn += 1;
        buy(if turn % 2 == 0 { &a } else { &b })
    })
    .await;
    assert!(passed.iter().all(|s| *s == 200), "{passed:?}");
    assert_is_429(limited, 3).await;

    // The bucket is one key, tagged by client, that expires once it would be full again.
    let mut redis = ns.redis().await;
    let key = format!("{}:ratelimit:{{u:71}}:purchase", ns.namespace);
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut redis)
        .await
        .expect("pttl");
    assert!((1..=4_000).contains(&ttl_ms), "{key} PTTL {ttl_ms}");

    // Another user starts with a full bucket on either replica.
    let other = b
        .post("/api/seckill/1")
        .bearer_auth(user_token(72))
        .send()
        .await
        .expect("request");
    assert_eq!(header(&other, "x-ratelimit-remaining"), 2);
    drop((a, b));
    ns.cleanup().await;
}

#[tokio::test]
async fn with_redis_down_requests_pass_and_the_failure_is_counted() {
    let ns = TestNamespace::new();
    let echo = spawn_echo().await;
    let gateway = spawn_gateway(gateway::Settings {
        redis_url: closed_port_url()
            .await
            .replace("http://", "redis://")
            .as_str()
            .into(),
        redis_cluster: false,
        rate_purchase_burst: 1,
        ..shared(&echo.url, &ns)
    })
    .await;
    let before = gateway
        .metric("gateway_rate_limit_backend_errors_total", &[])
        .await;
    let token = user_token(73);
    for _ in 0..5 {
        let response = gateway
            .post("/api/seckill/1")
            .bearer_auth(&token)
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200, "fail open");
        assert!(!response.headers().contains_key("x-ratelimit-remaining"));
    }
    let after = gateway
        .metric("gateway_rate_limit_backend_errors_total", &[])
        .await;
    assert!(after >= before + 5.0, "{before} -> {after}");
    assert_eq!(echo.hits(), 5);
}

#[tokio::test]
async fn on_its_own_redis_failing_the_limits_fail_closed_or_open_as_configured() {
    let ns = TestNamespace::new();
    let echo = spawn_echo().await;
    let mut own = OwnRedis::start(Persistence::None);
    // Its own Redis for everything, a single server (on the cluster pass too).
    let on_own_redis = |failure| gateway::Settings {
        rate_limit_redis_url: Some(own.url().as_str().into()),
        rate_limit_redis_failure: failure,
        redis_url: own.url().as_str().into(),
        redis_cluster: false,
        ..shared(&echo.url, &ns)
    };
    let closed = spawn_gateway(on_own_redis(RateLimitFailure::Closed)).await;
    let open = spawn_gateway(on_own_redis(RateLimitFailure::Open)).await;
    let buy = |gateway: &crate::echo::Gateway, user: i64| {
        let request = gateway.post("/api/seckill/1").bearer_auth(user_token(user));
        async move { request.send().await.expect("request") }
    };
    for gateway in [&closed, &open] {
        let metered = buy(gateway, 75).await;
        assert_eq!(metered.status(), 200);
        assert!(metered.headers().contains_key("x-ratelimit-remaining"));
    }
    // The bucket is in the gateway's own Redis, not in the shared one.
    let key = format!("{}:ratelimit:{{u:75}}:purchase", ns.namespace);
    let mut shared_redis = ns.redis().await;
    let in_shared: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut shared_redis)
        .await
        .expect("exists");
    assert!(!in_shared, "{key} in the shared Redis");

    own.kill();
    let refused = buy(&closed, 76).await;
    assert_eq!(refused.status(), 503, "fail closed");
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().await.expect("json");
    assert_eq!(body["code"], "unavailable");
    let allowed = buy(&open, 76).await;
    assert_eq!(allowed.status(), 200, "fail open");
    assert!(!allowed.headers().contains_key("x-ratelimit-remaining"));
    drop((closed, open));
    ns.cleanup().await;
}

/// A TCP relay to Redis that the test can cut and restore, as a Redis outage would.
struct Relay {
    address: std::net::SocketAddr,
    stop: tokio_util::sync::CancellationToken,
}

impl Relay {
    async fn start(address: &str, target: String) -> Self {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("bind relay");
        let address = listener.local_addr().expect("addr");
        let stop = tokio_util::sync::CancellationToken::new();
        let cut = stop.clone();
        tokio::spawn(async move {
            loop {
                let (mut client, _) = tokio::select! {
                    _ = cut.cancelled() => return,
                    accepted = listener.accept() => accepted.expect("accept"),
                };
                let target = target.clone();
                let cut = cut.clone();
                tokio::spawn(async move {
                    let mut server = tokio::net::TcpStream::connect(target)
                        .await
                        .expect("connect redis");
                    // Dropping both ends on cut is the outage the gateway sees.
                    tokio::select! {
                        _ = cut.cancelled() => {}
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    }
                });
            }
        });
        Self { address, stop }
    }

    fn cut(&self) {
        self.stop.cancel();
    }
}

#[tokio::test]
async fn after_a_redis_outage_limits_fail_open_then_come_back() {
    // A relay needs one server: the single Redis even when the suite runs on a cluster.
    let redis =
        std::env::var("SECKILL_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let target = redis
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    let ns = TestNamespace::new();
    let echo = spawn_echo().await;
    let relay = Relay::start("127.0.0.1:0", target.clone()).await;
    let gateway = spawn_gateway(gateway::Settings {
        redis_url: format!("redis://{}", relay.address).as_str().into(),
        redis_cluster: false,
        rate_purchase_burst: 1,
        ..shared(&echo.url, &ns)
    })
    .await;
    let buy = |user: i64| {
        let request = gateway.post("/api/seckill/1").bearer_auth(user_token(user));
        async move { request.send().await.expect("request") }
    };

    assert_eq!(buy(74).await.status(), 200);
    assert_eq!(buy(74).await.status(), 429, "limited while Redis answers");

    relay.cut();
    let during = buy(74).await;
    assert_eq!(during.status(), 200, "fail open during the outage");
    assert!(!during.headers().contains_key("x-ratelimit-limit"));

    let _restored = Relay::start(&relay.address.to_string(), target).await;
    let mut user = 1000;
    seckill_testkit::eventually(
        "limits back after the outage",
        std::time::Duration::from_secs(15),
        || {
            user += 1;
            let answer = buy(user);
            async move { answer.await.headers().get("x-ratelimit-limit").map(drop) }
        },
    )
    .await;
    ns.cleanup().await;
}
