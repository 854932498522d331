//! The waiting room (docs/DESIGN.md §9), through a real gateway in front of the real
//! services: tickets in order, admission that follows the stock, passes, and the refusals.

use std::time::Duration;

use chrono::Utc;
use serde_json::Value;

use gateway::room::{Holder, Pass, RoomKey};
use seckill_testkit::{INTERNAL_KEY, eventually};

use crate::helpers::{
    Platform, assert_error, final_result, spawn_platform, spawn_platform_with_gateway, user_token,
};

async fn join(platform: &Platform, product: i64, user: i64) -> Value {
    join_at(platform, &platform.gateway, product, user).await
}

/// Joins through the gateway at `gateway`.
async fn join_at(platform: &Platform, gateway: &str, product: i64, user: i64) -> Value {
    let response = platform
        .client
        .post(format!("{gateway}/api/rooms/{product}/join"))
        .bearer_auth(user_token(user))
        .send()
        .await
        .expect("join");
    assert_eq!(response.status(), 200);
    assert!(response.headers().contains_key("retry-after"));
    response.json().await.expect("json")
}

async fn poll(platform: &Platform, product: i64, user: i64, ticket: &str) -> Value {
    poll_at(platform, &platform.gateway, product, user, ticket).await
}

/// Polls through the gateway at `gateway`.
async fn poll_at(
    platform: &Platform,
    gateway: &str,
    product: i64,
    user: i64,
    ticket: &str,
) -> Value {
    let response = platform
        .client
        .get(format!("{gateway}/api/rooms/{product}/tickets/{ticket}"))
        .bearer_auth(user_token(user))
        .send()
        .await
        .expect("poll");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// Polls `user`'s ticket until its state is `state`.
async fn until_state(
    platform: &Platform,
    product: i64,
    user: i64,
    ticket: &str,
    state: &str,
    within: Duration,
) -> Value {
    eventually(&format!("user {user} {state}"), within, || async {
        let answer = poll(platform, product, user, ticket).await;
        (answer["state"] == state).then_some(answer)
    })
    .await
}

/// The number seckill-api named `product`'s line with.
async fn line_of(platform: &Platform, product: i64) -> u64 {
    let mut redis = platform.ns.redis().await;
    redis::cmd("HGET")
        .arg(platform.ns.keys().room(product))
        .arg("line")
        .query_async(&mut redis)
        .await
        .expect("the room's line")
}

async fn buy_at(platform: &Platform, path: &str, user: i64) -> reqwest::Response {
    platform.post(path, &user_token(user)).await
}

#[tokio::test]
async fn buyers_are_admitted_in_order_no_more_than_the_stock_then_told_sold_out() {
    let platform = spawn_platform().await;
    let product = platform
        .create_queued_product(2, Duration::from_secs(2))
        .await;
    // Four buyers join before the start, in this order; one joins again.
    let mut tickets = Vec::new();
    for user in 101..=104 {
        let answer = join(&platform, product, user).await;
        assert_eq!(answer["state"], "waiting", "{answer}");
        assert_eq!(answer["place"], user - 101, "{answer}");
        assert!(answer["wait_ms"].as_u64().expect("wait") > 0, "{answer}");
        tickets.push(answer["ticket"].as_str().expect("ticket").to_string());
    }
    let again = join(&platform, product, 101).await;
    assert_eq!(again["place"], 0);
    assert_eq!(
        again["ticket"],
        tickets[0].as_str(),
        "the same ticket, never a better place"
    );
    // Before the start nobody is admitted; the third is two places behind.
    let third = poll(&platform, product, 103, &tickets[2]).await;
    assert_eq!(
        (third["state"].as_str(), third["ahead"].as_u64()),
        (Some("waiting"), Some(2))
    );

    // From the start: the first two, as many as the units, and not the third while they
    // may still buy.
    let first = until_state(
        &platform,
        product,
        101,
        &tickets[0],
        "admitted",
        Duration::from_secs(10),
    )
    .await;
    let second = until_state(
        &platform,
        product,
        102,
        &tickets[1],
        "admitted",
        Duration::from_secs(5),
    )
    .await;
    let third = poll(&platform, product, 103, &tickets[2]).await;
    assert_eq!(
        (third["state"].as_str(), third["ahead"].as_u64()),
        (Some("waiting"), Some(0)),
        "{third}"
    );
    let path = first["purchase_path"].as_str().expect("a purchase path");
    assert!(
        path.starts_with(&format!("/api/seckill/{product}/")),
        "{path}"
    );
    assert!(first["pass_expires_at_ms"].as_i64().expect("expiry") > Utc::now().timestamp_millis());

    // Without a pass, with another buyer's, with an expired one: refused, nothing sold.
    assert_error(
        platform.buy(product, &user_token(103)).await,
        428,
        "admission_required",
    )
    .await;
    assert_error(buy_at(&platform, path, 103).await, 403, "invalid_pass").await;
    // Nor with the gateway's own query written by the client, on either path.
    let forged = buy_at(
        &platform,
        &format!("/api/seckill/{product}?admitted=0"),
        103,
    )
    .await;
    assert_error(forged, 428, "admission_required").await;
    let key = RoomKey::derived_from(INTERNAL_KEY.as_bytes());
    let start_ms = first["starts_at_ms"].as_i64().expect("start");
    let stale = key.pass(
        Holder {
            product_id: product,
            user_id: 103,
            sale: start_ms,
            line: line_of(&platform, product).await,
        },
        Pass {
            rank: 2,
            expires_ms: Utc::now().timestamp_millis() - 1,
        },
    );
    assert_error(
        buy_at(&platform, &format!("/api/seckill/{product}/{stale}"), 103).await,
        403,
        "pass_expired",
    )
    .await;
    assert_error(
        buy_at(&platform, &format!("/api/seckill/{product}/2.1.00"), 103).await,
        403,
        "invalid_pass",
    )
    .await;

    // The admitted buy: one unit each; the pass buys no second one.
    assert_eq!(buy_at(&platform, path, 101).await.status(), 202);
    assert_error(buy_at(&platform, path, 101).await, 409, "already_purchased").await;
    let second_path = second["purchase_path"].as_str().expect("a purchase path");
    assert_eq!(buy_at(&platform, second_path, 102).await.status(), 202);
    for user in [101, 102] {
        let result = final_result(&platform, product, &user_token(user)).await;
        assert_eq!(result["status"], "success", "{result}");
    }
    // Sold out: everyone still waiting is told so.
    for (user, ticket) in [(103, &tickets[2]), (104, &tickets[3])] {
        until_state(
            &platform,
            product,
            user,
            ticket,
            "sold_out",
            Duration::from_secs(3),
        )
        .await;
    }
    // Sold to the two admitted, and to nobody refused.
    let buyers: Vec<i64> =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE product_id = $1 ORDER BY user_id")
            .bind(product)
            .fetch_all(&platform.ns.db().await)
            .await
            .expect("orders");
    assert_eq!(buyers, [101, 102]);
    platform.shutdown().await;
}

#[tokio::test]
async fn a_product_without_a_room_has_none_to_join_and_sells_as_before() {
    let platform = spawn_platform().await;
    let product = platform.create_product(1, -60).await;
    let join = platform
        .post(&format!("/api/rooms/{product}/join"), &user_token(7))
        .await;
    assert_error(join, 404, "no_waiting_room").await;
    let poll = platform
        .get(
            &format!("/api/rooms/{product}/tickets/0.1.00"),
            &user_token(7),
        )
        .await;
    assert_error(poll, 404, "no_waiting_room").await;
    // A pass for a sale without a room is no pass.
    assert_error(
        buy_at(&platform, &format!("/api/seckill/{product}/0.1.00"), 7).await,
        403,
        "invalid_pass",
    )
    .await;
    assert_eq!(platform.buy(product, &user_token(7)).await.status(), 202);
    // Without a token: 401 like any route.
    let anonymous = platform
        .client
        .post(format!("{}/api/rooms/{product}/join", platform.gateway))
        .send()
        .await
        .expect("join");
    assert_eq!(anonymous.status(), 401);
    platform.shutdown().await;
}

#[tokio::test]
async fn a_ticket_is_its_buyers_alone() {
    let platform = spawn_platform_with_gateway(|s| s.room_admit_per_sec = 1).await;
    let product = platform
        .create_queued_product(5, Duration::from_secs(600))
        .await;
    let ticket = join(&platform, product, 31).await["ticket"]
        .as_str()
        .expect("ticket")
        .to_string();
    let stolen = platform
        .get(
            &format!("/api/rooms/{product}/tickets/{ticket}"),
            &user_token(32),
        )
        .await;
    assert_error(stolen, 403, "invalid_ticket").await;
    let mangled = platform
        .get(
            &format!("/api/rooms/{product}/tickets/{ticket}0"),
            &user_token(31),
        )
        .await;
    assert_error(mangled, 403, "invalid_ticket").await;
    assert_eq!(poll(&platform, product, 31, &ticket).await["place"], 0);
    platform.shutdown().await;
}

#[tokio::test]
async fn two_gateways_hand_out_one_line_and_admit_the_same_buyers() {
    let mut platform = spawn_platform().await;
    let other = platform.add_gateway().await;
    let product = platform
        .create_queued_product(2, Duration::from_secs(2))
        .await;
    let gateways = [platform.gateway.clone(), other];
    // Joins alternate between the replicas: one line, in the order they came.
    let mut tickets = Vec::new();
    for (i, user) in (201..=204).enumerate() {
        let answer = join_at(&platform, &gateways[i % 2], product, user).await;
        assert_eq!(answer["place"], i, "{answer}");
        tickets.push(answer["ticket"].as_str().expect("ticket").to_string());
    }
    // Each replica checks the other's tickets, and both admit the first two only.
    for gateway in &gateways {
        for (i, user) in (201..=202).enumerate() {
            eventually(
                "admitted on every replica",
                Duration::from_secs(10),
                || async {
                    let answer = poll_at(&platform, gateway, product, user, &tickets[i]).await;
                    (answer["state"] == "admitted").then_some(())
                },
            )
            .await;
        }
    }
    for gateway in &gateways {
        for (i, user) in (203..=204).enumerate() {
            let answer = poll_at(&platform, gateway, product, user, &tickets[i + 2]).await;
            assert_eq!(answer["state"], "waiting", "{gateway}: {answer}");
            assert_eq!(answer["ahead"], i, "{gateway}: {answer}");
        }
    }
    platform.shutdown().await;
}

#[tokio::test]
async fn a_unit_that_comes_back_admits_the_next_in_line() {
    let platform = spawn_platform().await;
    let product = platform
        .create_queued_product(1, Duration::from_secs(2))
        .await;
    let first = join(&platform, product, 301).await["ticket"]
        .as_str()
        .expect("ticket")
        .to_string();
    let next = join(&platform, product, 302).await["ticket"]
        .as_str()
        .expect("ticket")
        .to_string();
    let admitted = until_state(
        &platform,
        product,
        301,
        &first,
        "admitted",
        Duration::from_secs(10),
    )
    .await;
    let path = admitted["purchase_path"].as_str().expect("a purchase path");
    assert_eq!(buy_at(&platform, path, 301).await.status(), 202);
    let result = final_result(&platform, product, &user_token(301)).await;
    assert_eq!(result["status"], "success", "{result}");
    until_state(
        &platform,
        product,
        302,
        &next,
        "sold_out",
        Duration::from_secs(3),
    )
    .await;

    // The buyer cancels: the unit goes back on sale and the next in line is let in.
    let order = result["order_id"].as_i64().expect("an order id");
    let cancelled = platform
        .post(&format!("/api/orders/{order}/cancel"), &user_token(301))
        .await;
    assert_eq!(cancelled.status(), 200);
    let admitted = until_state(
        &platform,
        product,
        302,
        &next,
        "admitted",
        Duration::from_secs(10),
    )
    .await;
    let path = admitted["purchase_path"].as_str().expect("a purchase path");
    assert_eq!(buy_at(&platform, path, 302).await.status(), 202);
    let result = final_result(&platform, product, &user_token(302)).await;
    assert_eq!(result["status"], "success", "{result}");
    platform.shutdown().await;
}

#[tokio::test]
async fn a_client_cannot_say_it_was_admitted_even_to_a_gateway_that_knows_no_room() {
    let mut platform = spawn_platform().await;
    let product = platform
        .create_queued_product(1, Duration::from_secs(600))
        .await;
    // A replica that has heard of no room: the query is dropped all the same, and
    // seckill-api refuses the purchase from the product's mode.
    let fresh = platform.add_gateway().await;
    for query in ["?admitted=0", "?admitted=0&x=1", "?x=1&admitted=0"] {
        let response = platform
            .client
            .post(format!("{fresh}/api/seckill/{product}{query}"))
            .bearer_auth(user_token(401))
            .send()
            .await
            .expect("purchase");
        assert_error(response, 428, "admission_required").await;
    }
    platform.shutdown().await;
}

#[tokio::test]
async fn a_line_redis_lost_starts_again_and_its_old_tickets_do_not_verify() {
    let platform = spawn_platform().await;
    let product = platform
        .create_queued_product(5, Duration::from_secs(600))
        .await;
    let old = join(&platform, product, 501).await;
    let old_ticket = old["ticket"].as_str().expect("ticket").to_string();
    join(&platform, product, 502).await;
    let line = line_of(&platform, product).await;
    // Redis loses the room: seckill-api's sync sets it up again, as a new line.
    let keys = platform.ns.keys();
    let mut redis = platform.ns.redis().await;
    for key in [
        keys.room(product),
        keys.room_tickets(product),
        keys.room_admits(product),
    ] {
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut redis)
            .await
            .expect("lose the room");
    }
    eventually("the room set up again", Duration::from_secs(15), || async {
        let mut redis = platform.ns.redis().await;
        let again: Option<u64> = redis::cmd("HGET")
            .arg(platform.ns.keys().room(product))
            .arg("line")
            .query_async(&mut redis)
            .await
            .ok()?;
        again.filter(|&again| again != line)
    })
    .await;
    // The old ticket is no ticket of the new line; joining again starts from the front.
    let stale = eventually(
        "the old ticket refused",
        Duration::from_secs(10),
        || async {
            let response = platform
                .get(
                    &format!("/api/rooms/{product}/tickets/{old_ticket}"),
                    &user_token(501),
                )
                .await;
            (response.status() == 403).then_some(response)
        },
    )
    .await;
    assert_error(stale, 403, "invalid_ticket").await;
    let again = join(&platform, product, 502).await;
    assert_eq!(again["place"], 0, "{again}");
    platform.shutdown().await;
}

/// The published draw of `product`'s raffle, as `user` reads it.
async fn draw(platform: &Platform, product: i64, user: i64) -> Value {
    let response = platform
        .client
        .get(format!("{}/api/rooms/{product}/draw", platform.gateway))
        .bearer_auth(user_token(user))
        .send()
        .await
        .expect("draw");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// The drawn order re-derived from what the room published, as an auditor would (the
/// contract in DESIGN.md §9, not the gateway's code): the places by ascending SHA-256 of
/// `seed:place`.
fn drawn_order(seed: &str, entries: u64) -> Vec<u64> {
    use sha2::{Digest, Sha256};
    let mut keyed: Vec<(Vec<u8>, u64)> = (0..entries)
        .map(|place| (Sha256::digest(format!("{seed}:{place}")).to_vec(), place))
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, place)| place).collect()
}

#[tokio::test]
async fn a_raffle_admits_in_the_order_its_published_seed_gives() {
    use sha2::{Digest, Sha256};
    // An admitted buyer counts as one who may still buy for the pass's whole life: however
    // slowly a loaded machine runs the three purchases below, nobody else is let in.
    let platform = spawn_platform_with_gateway(|s| s.room_no_show = s.room_pass_ttl).await;
    // Far enough off that the twelve joins below are in before entry closes, however
    // loaded the machine.
    let product = platform
        .create_room_product(3, Duration::from_secs(6), "raffle")
        .await;
    let before = draw(&platform, product, 500).await;
    let commitment = before["commitment"]
        .as_str()
        .expect("a commitment")
        .to_string();
    assert_eq!(commitment.len(), 64, "{before}");
    assert!(
        before["seed"].is_null() && before["tickets"].is_null(),
        "{before}"
    );
    // Twelve buyers enter before the start: no rank yet, nobody counted ahead.
    let mut tickets = Vec::new();
    for user in 501..=512 {
        let answer = join(&platform, product, user).await;
        assert_eq!(answer["place"], user - 501, "{answer}");
        assert_eq!(answer["state"], "waiting", "{answer}");
        assert!(
            answer["ahead"].is_null() && answer.get("rank").is_none(),
            "{answer}"
        );
        tickets.push(answer["ticket"].as_str().expect("ticket").to_string());
    }

    // At the start the seed is revealed: the one committed to, over the twelve entries.
    let after = eventually("the draw", Duration::from_secs(15), || async {
        let published = draw(&platform, product, 500).await;
        published["seed"].is_string().then_some(published)
    })
    .await;
    let seed = after["seed"].as_str().expect("seed");
    let mut hex = String::new();
    for byte in Sha256::digest(seed.as_bytes()) {
        hex.push_str(&format!("{byte:02x}"));
    }
    assert_eq!(hex, commitment, "the seed is the one committed to");
    assert_eq!(after["commitment"], commitment.as_str());
    assert_eq!(after["entries"], 12, "{after}");
    let listed: Vec<i64> = (501..=512).collect();
    assert_eq!(after["tickets"], serde_json::json!(listed), "{after}");
    let order = drawn_order(seed, 12);
    assert_ne!(
        order,
        (0..12).collect::<Vec<_>>(),
        "drawn, not arrival order"
    );

    // Joined after the close: behind all twelve, whatever the draw.
    let late = join(&platform, product, 513).await;
    assert_eq!(
        (late["place"].as_u64(), late["rank"].as_u64()),
        (Some(12), Some(12))
    );

    // The first three drawn are admitted and buy; the fourth drawn waits while they may.
    let mut winners = Vec::new();
    for &place in &order[..3] {
        let user = 501 + place as i64;
        let ticket = &tickets[place as usize];
        let admitted = until_state(
            &platform,
            product,
            user,
            ticket,
            "admitted",
            Duration::from_secs(10),
        )
        .await;
        let rank = order.iter().position(|&p| p == place).expect("drawn") as u64;
        assert_eq!(admitted["rank"], rank, "{admitted}");
        let path = admitted["purchase_path"].as_str().expect("a purchase path");
        assert_eq!(buy_at(&platform, path, user).await.status(), 202);
        winners.push(user);
    }
    let fourth = order[3];
    let answer = poll(
        &platform,
        product,
        501 + fourth as i64,
        &tickets[fourth as usize],
    )
    .await;
    assert_eq!(answer["rank"], 3, "{answer}");
    assert_ne!(answer["state"], "admitted", "{answer}");
    until_state(
        &platform,
        product,
        501 + fourth as i64,
        &tickets[fourth as usize],
        "sold_out",
        Duration::from_secs(10),
    )
    .await;
    let mut buyers: Vec<i64> =
        sqlx::query_scalar("SELECT user_id FROM orders WHERE product_id = $1")
            .bind(product)
            .fetch_all(&platform.ns.db().await)
            .await
            .expect("orders");
    buyers.sort_unstable();
    winners.sort_unstable();
    assert_eq!(buyers, winners, "sold to the drawn, in the draw's order");

    // A fifo room has no draw.
    let fifo = platform
        .create_queued_product(1, Duration::from_secs(60))
        .await;
    join(&platform, fifo, 500).await;
    let none = platform
        .client
        .get(format!("{}/api/rooms/{fifo}/draw", platform.gateway))
        .bearer_auth(user_token(500))
        .send()
        .await
        .expect("draw");
    assert_error(none, 404, "no_draw").await;
    platform.shutdown().await;
}
