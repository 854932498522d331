//! The proof-of-work on joining a waiting room (docs/DESIGN.md §9), through a real gateway
//! in front of the real services: a join without a proof is refused with a challenge, a
//! wrong, foreign or expired one is refused, a solved one joins; the difficulty rises with
//! the room's join rate and falls back when the crowd is gone; the load tester's buyers
//! (`loadtest/src/pow.rs`) solve their way in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use serde_json::{Value, json};

use gateway::room::pow;
use gateway::room::{Challenge, Holder, RoomKey};
use seckill_loadtest::burst::Buyer;
use seckill_loadtest::room::End;
use seckill_testkit::{INTERNAL_KEY, eventually};

use crate::helpers::{Platform, spawn_platform_with_gateway, user_token};

/// A join of `user`'s, with `body` as its JSON body when given.
async fn join(
    platform: &Platform,
    product: i64,
    user: i64,
    body: Option<Value>,
) -> reqwest::Response {
    let mut request = platform
        .client
        .post(format!("{}/api/rooms/{product}/join", platform.gateway))
        .bearer_auth(user_token(user));
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.expect("join")
}

/// A challenge for `user`.
async fn challenge(platform: &Platform, product: i64, user: i64) -> Value {
    let response = platform
        .get(
            &format!("/api/rooms/{product}/challenge"),
            &user_token(user),
        )
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["cache-control"], "no-store");
    response.json().await.expect("json")
}

/// The challenge of an answer, solved.
fn solved(answer: &Value) -> Value {
    let text = answer["challenge"].as_str().expect("a challenge");
    let bits = u32::try_from(answer["bits"].as_u64().expect("bits")).expect("bits");
    json!({"challenge": text, "nonce": pow::solve(text, bits).to_string()})
}

/// A refusal's status and body.
async fn refusal(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.expect("a JSON body"))
}

/// The gateway's metrics text.
async fn metrics(platform: &Platform) -> String {
    reqwest::get(format!("{}/metrics", platform.gateway_admin))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of the metric line starting with `series` (name and labels), if any.
fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
}

/// The room's `field` in Redis.
async fn room_field(platform: &Platform, product: i64, field: &str) -> Option<i64> {
    let mut redis = platform.ns.redis().await;
    redis::cmd("HGET")
        .arg(platform.ns.keys().room(product))
        .arg(field)
        .query_async(&mut redis)
        .await
        .expect("the room's hash")
}

#[tokio::test]
async fn a_join_takes_a_solved_challenge_of_its_own_while_proof_of_work_is_on() {
    let platform = spawn_platform_with_gateway(|s| {
        s.room_pow_min_bits = 8;
        s.room_pow_max_bits = 16;
    })
    .await;
    let product = platform
        .create_queued_product(5, Duration::from_secs(600))
        .await;
    let (buyer, other) = (201, 202);

    // No proof: 428, with a challenge for the caller at the least difficulty.
    let (status, required) = refusal(join(&platform, product, buyer, None).await).await;
    assert_eq!(status, 428, "{required}");
    assert_eq!(required["code"], "proof_of_work_required", "{required}");
    assert!(required["message"].is_string(), "{required}");
    assert_eq!(required["bits"], 8, "{required}");
    let expires = required["expires_at_ms"].as_i64().expect("expiry");
    let now = Utc::now().timestamp_millis();
    assert!(
        (now + 50_000..=now + 61_000).contains(&expires),
        "good for 60 s: {required}"
    );
    let text = required["challenge"].as_str().expect("challenge");

    // A nonce that does not solve it: 403, and a fresh challenge with it.
    let wrong = (0u64..)
        .find(|n| !pow::solves(text, &n.to_string(), 8))
        .expect("a wrong nonce");
    let (status, invalid) = refusal(
        join(
            &platform,
            product,
            buyer,
            Some(json!({"challenge": text, "nonce": wrong.to_string()})),
        )
        .await,
    )
    .await;
    assert_eq!(
        (status, invalid["code"].as_str()),
        (403, Some("invalid_proof_of_work")),
        "{invalid}"
    );
    assert!(invalid["challenge"].is_string(), "{invalid}");
    // Another buyer's challenge, solved: not this buyer's.
    let foreign = solved(&challenge(&platform, product, other).await);
    let (status, body) = refusal(join(&platform, product, buyer, Some(foreign)).await).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (403, Some("invalid_proof_of_work")),
        "{body}"
    );
    // Not the contract's body: 400.
    for body in [
        json!({"challenge": text}),
        json!("x"),
        json!({"challenge": 1, "nonce": "1"}),
    ] {
        let (status, answer) =
            refusal(join(&platform, product, buyer, Some(body.clone())).await).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some("invalid_request")),
            "{body}: {answer}"
        );
    }

    // A challenge signed with the room's key but issued over a minute ago: expired; one
    // below the least difficulty: invalid, solved or not.
    let key = RoomKey::derived_from(INTERNAL_KEY.as_bytes());
    let holder = Holder {
        product_id: product,
        user_id: buyer,
        sale: room_field(&platform, product, "start_ms")
            .await
            .expect("start"),
        line: u64::try_from(room_field(&platform, product, "line").await.expect("line"))
            .expect("line"),
    };
    for (issued_ms, bits, code) in [
        (
            now - pow::CHALLENGE_TTL_MS - 1_000,
            8,
            "proof_of_work_expired",
        ),
        (now, 2, "invalid_proof_of_work"),
    ] {
        let forged = key.challenge(holder, Challenge { issued_ms, bits });
        let nonce = pow::solve(&forged, bits).to_string();
        let (status, body) = refusal(
            join(
                &platform,
                product,
                buyer,
                Some(json!({"challenge": forged, "nonce": nonce})),
            )
            .await,
        )
        .await;
        assert_eq!((status, body["code"].as_str()), (403, Some(code)), "{body}");
        assert_eq!(body["bits"], 8, "a fresh challenge comes with it: {body}");
    }
    // None of the refused joins reached Redis's line.
    assert_eq!(
        room_field(&platform, product, "joined").await.unwrap_or(0),
        0
    );

    // Solved, from the 428's challenge: in line, with a ticket.
    let response = join(&platform, product, buyer, Some(solved(&required))).await;
    assert_eq!(response.status(), 200);
    let joined: Value = response.json().await.expect("json");
    assert_eq!(joined["place"], 0, "{joined}");
    let ticket = joined["ticket"].as_str().expect("a ticket").to_string();
    // Joining again takes a proof too, and gives the same place; a solved challenge may be
    // used again within its minute (it only ever gives its holder's own place).
    let (status, _) = refusal(join(&platform, product, buyer, None).await).await;
    assert_eq!(status, 428);
    let fresh = challenge(&platform, product, buyer).await;
    assert_eq!(fresh["bits"], 8, "{fresh}");
    for proof in [solved(&fresh), solved(&fresh)] {
        let again: Value = join(&platform, product, buyer, Some(proof))
            .await
            .json()
            .await
            .expect("json");
        assert_eq!(again["ticket"], ticket.as_str(), "{again}");
    }
    assert_eq!(room_field(&platform, product, "joined").await, Some(1));

    let text = metrics(&platform).await;
    for (reason, least) in [("missing", 2.0), ("invalid", 3.0), ("expired", 1.0)] {
        let series = format!("gateway_room_pow_failures_total{{reason=\"{reason}\"}}");
        let counted = metric(&text, &series).unwrap_or(0.0);
        assert!(counted >= least, "{series} {counted}:\n{text}");
    }
    assert_eq!(
        metric(
            &text,
            &format!("gateway_room_pow_bits{{product=\"{product}\"}}")
        ),
        Some(8.0),
        "{text}"
    );
    platform.shutdown().await;
}

#[tokio::test]
async fn without_proof_of_work_a_join_needs_none_and_a_challenge_has_no_bits() {
    let platform = spawn_platform_with_gateway(|_| {}).await;
    let product = platform
        .create_queued_product(5, Duration::from_secs(600))
        .await;
    // A body, even one that proves nothing, is not looked at.
    for body in [None, Some(json!({"challenge": "x", "nonce": "y"}))] {
        let response = join(&platform, product, 301, body).await;
        assert_eq!(response.status(), 200);
    }
    let answer = challenge(&platform, product, 301).await;
    assert_eq!(answer["bits"], 0, "{answer}");
    platform.shutdown().await;
}

#[tokio::test]
async fn the_difficulty_rises_with_the_join_rate_and_falls_back_when_the_crowd_is_gone() {
    let (least, most) = (4, 12);
    let platform = Arc::new(
        spawn_platform_with_gateway(|s| {
            s.room_pow_min_bits = least;
            s.room_pow_max_bits = most;
            s.room_pow_rate = 20;
            // One address sends every buyer's fresh token.
            s.rate_unverified_per_sec = 100_000;
            s.rate_unverified_burst = 100_000;
        })
        .await,
    );
    let product = platform
        .create_queued_product(1, Duration::from_secs(600))
        .await;
    let quiet = challenge(&platform, product, 400).await;
    assert_eq!(quiet["bits"], least, "{quiet}");

    // A crowd: buyers join, each solving its challenge, until the difficulty is seen up.
    let stop = Arc::new(AtomicBool::new(false));
    let joined = Arc::new(AtomicU64::new(0));
    let crowd = {
        let (platform, stop, joined) = (platform.clone(), stop.clone(), joined.clone());
        tokio::spawn(async move {
            futures_util::stream::iter(1_000..21_000)
                .take_while(|_| std::future::ready(!stop.load(Ordering::Relaxed)))
                .for_each_concurrent(16, |user| {
                    let (platform, joined) = (platform.clone(), joined.clone());
                    async move {
                        let proof = solved(&challenge(&platform, product, user).await);
                        let response = join(&platform, product, user, Some(proof)).await;
                        assert_eq!(response.status(), 200, "user {user}");
                        joined.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .await;
        })
    };
    let risen = eventually(
        "the difficulty above the least",
        Duration::from_secs(90),
        || async {
            let bits = challenge(&platform, product, 400).await["bits"].as_u64()?;
            (bits > u64::from(least)).then_some(bits)
        },
    )
    .await;
    assert!(risen <= u64::from(most), "{risen}");
    let gauge = metric(
        &metrics(&platform).await,
        &format!("gateway_room_pow_bits{{product=\"{product}\"}}"),
    )
    .expect("the gauge");
    assert!(gauge > f64::from(least), "gauge {gauge}");
    stop.store(true, Ordering::Relaxed);
    crowd.await.expect("the crowd joined");
    assert!(joined.load(Ordering::Relaxed) > 20, "a crowd joined");

    // The crowd gone, the difficulty is the least again within about a second.
    eventually(
        "the difficulty back to the least",
        Duration::from_secs(30),
        || async {
            let bits = challenge(&platform, product, 400).await["bits"].as_u64()?;
            (bits == u64::from(least)).then_some(())
        },
    )
    .await;
    Arc::into_inner(platform)
        .expect("the crowd let go of the platform")
        .shutdown()
        .await;
}

#[tokio::test]
async fn the_load_testers_buyers_solve_the_challenge_a_refused_join_carries() {
    let platform = spawn_platform_with_gateway(|s| {
        s.room_pow_min_bits = 10;
        s.room_pow_max_bits = 10;
    })
    .await;
    let product = platform
        .create_queued_product(2, Duration::from_secs(2))
        .await;
    let buyers: Vec<Buyer> = (601..=605)
        .map(|user_id| Buyer {
            user_id,
            authorization: format!("Bearer {}", user_token(user_id)),
        })
        .collect();
    let crowd = seckill_loadtest::room::run(
        &platform.client,
        &platform.gateway,
        product,
        buyers,
        Duration::from_millis(200),
        8,
    )
    .await
    .expect("the crowd's trips");
    let mut places: Vec<u64> = crowd.trips.iter().filter_map(|t| t.place).collect();
    places.sort_unstable();
    assert_eq!(
        places,
        [0, 1, 2, 3, 4],
        "every buyer joined: {:?}",
        crowd.trips
    );
    let bought = crowd
        .trips
        .iter()
        .filter(|t| matches!(t.end, End::Bought { status: 202, .. }))
        .count();
    assert_eq!(bought, 2, "{:?}", crowd.trips);
    let text = metrics(&platform).await;
    let missing = metric(&text, "gateway_room_pow_failures_total{reason=\"missing\"}");
    assert!(
        missing >= Some(5.0),
        "each asked for a proof first:\n{text}"
    );
    platform.shutdown().await;
}
