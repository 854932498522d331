//! The admission rate's ceiling (docs/DESIGN.md §9): `advance.lua` on a real Redis with its
//! clock passed in (no sleeping), and a purchase with a pass the backends cannot take,
//! through a gateway, recorded as their pushback.

use std::time::Duration;

use redis::{Script, Value};

use gateway::room::{PUSHBACK_HOLD, now_ms};
use seckill_store::{RedisConn, RedisKeys};
use seckill_testkit::ports::free_port;
use seckill_testkit::{TestNamespace, eventually};

use crate::helpers::{spawn_platform, user_token};

/// The operator's setting, as `Rooms::refresh` passes it.
const SETTING: i64 = 500;
const PRODUCT: i64 = 7;

/// A room hash written directly, and the step `Rooms::refresh` takes on it.
struct Room {
    conn: RedisConn,
    keys: RedisKeys,
    script: Script,
    /// Members added to the bought set so far (its size).
    bought: i64,
}

impl Room {
    async fn new(ns: &TestNamespace, start_ms: i64) -> Self {
        let mut conn = ns.redis().await;
        let keys = ns.keys();
        let _: i64 = redis::cmd("HSET")
            .arg(keys.room(PRODUCT))
            .arg(&[
                ("mode", "fifo".to_string()),
                ("start_ms", (start_ms - 60_000).to_string()),
                ("end_ms", (start_ms + 3_600_000).to_string()),
                // More than the steps below can admit: the rate alone moves the cursor.
                ("joined", "100000".to_string()),
                ("line", "1".to_string()),
            ])
            .query_async(&mut conn)
            .await
            .expect("write the room");
        Self {
            conn,
            keys,
            script: Script::new(include_str!("../../src/room/advance.lua")),
            bought: 0,
        }
    }

    /// Records `n` more purchases with a pass (a gateway's `bought`), at places already
    /// admitted.
    async fn buy(&mut self, n: i64) {
        for _ in 0..n {
            let _: i64 = redis::cmd("ZADD")
                .arg(self.keys.room_bought(PRODUCT))
                .arg(self.bought)
                .arg(10_000 + self.bought)
                .query_async(&mut self.conn)
                .await
                .expect("zadd");
            self.bought += 1;
        }
    }

    /// The backends pushed back at `ms` (a gateway's `pushed_back`).
    async fn push_back(&mut self, ms: i64) {
        let _: i64 = redis::cmd("HSET")
            .arg(self.keys.room(PRODUCT))
            .arg("pushback_ms")
            .arg(ms)
            .query_async(&mut self.conn)
            .await
            .expect("hset");
    }

    /// One admission step at `now`: the cursor and the rate it credited.
    async fn step(&mut self, now: i64) -> (i64, i64) {
        let reply: Vec<Value> = self
            .script
            .key(self.keys.room(PRODUCT))
            .key(self.keys.room_admits(PRODUCT))
            .key(self.keys.room_bought(PRODUCT))
            .arg(now)
            .arg(SETTING)
            .arg(10)
            .arg(60_000)
            .arg(10_000)
            .arg(1_000_000)
            .arg(now)
            .arg(self.bought)
            .arg(u64::try_from(PUSHBACK_HOLD.as_millis()).expect("ms"))
            .invoke_async(&mut self.conn)
            .await
            .expect("advance.lua");
        let int = |at: usize| match reply.get(at) {
            Some(Value::Int(n)) => *n,
            other => panic!("reply field {at}: {other:?} in {reply:?}"),
        };
        (int(4), int(11))
    }

    /// Writes one field of the room hash, as seckill-api's set-up would.
    async fn set(&mut self, field: &str, value: &str) {
        let _: i64 = redis::cmd("HSET")
            .arg(self.keys.room(PRODUCT))
            .arg(field)
            .arg(value)
            .query_async(&mut self.conn)
            .await
            .expect("hset");
    }

    async fn accepted(&mut self) -> Option<f64> {
        redis::cmd("HGET")
            .arg(self.keys.room(PRODUCT))
            .arg("accepted_per_sec")
            .query_async(&mut self.conn)
            .await
            .expect("hget")
    }
}

#[tokio::test]
async fn while_the_backends_push_back_the_room_admits_a_quarter_above_what_they_accept() {
    let ns = TestNamespace::new();
    let t0 = now_ms();
    let mut room = Room::new(&ns, t0).await;
    assert_eq!(room.step(t0).await, (0, SETTING));

    // A second without pushback, the backends accepting 20 a second: the setting's 500.
    for tick in 1..=10 {
        room.buy(2).await;
        let (_, rate) = room.step(t0 + tick * 100).await;
        assert_eq!(rate, SETTING, "no pushback: the setting");
    }
    let (before, _) = room.step(t0 + 1_000).await;
    assert!(
        (495..=500).contains(&before),
        "{before} admitted in a second"
    );
    assert_eq!(
        room.accepted().await,
        Some(20.0),
        "measured over the window"
    );

    // Two seconds of pushback, the backends still accepting 20 a second: at most 25.
    for tick in 11..=30 {
        let now = t0 + tick * 100;
        room.buy(2).await;
        room.push_back(now).await;
        let (_, rate) = room.step(now).await;
        assert_eq!(rate, 25, "ceil(1.25 * 20) at {tick}");
    }
    let (held, _) = room.step(t0 + 3_000).await;
    let advanced = held - before;
    assert!(
        (48..=51).contains(&advanced),
        "{advanced} admitted in 2 s of pushback, 25 a second expected"
    );

    // The last pushback at 3 s: still held until 5 s, the setting again from then on.
    for tick in 31..=49 {
        room.buy(2).await;
        let (_, rate) = room.step(t0 + tick * 100).await;
        assert_eq!(
            rate, 25,
            "held for {PUSHBACK_HOLD:?} after the last pushback"
        );
    }
    let (released, rate) = room.step(t0 + 5_000).await;
    assert_eq!(rate, SETTING, "2 s after the last pushback");
    for tick in 51..=60 {
        let (_, rate) = room.step(t0 + tick * 100).await;
        assert_eq!(rate, SETTING);
    }
    let (after, _) = room.step(t0 + 6_000).await;
    assert!(
        (495..=500).contains(&(after - released)),
        "{} admitted in the second after the hold",
        after - released
    );
    ns.cleanup().await;
}

#[tokio::test]
async fn while_pushback_is_recent_and_nothing_was_accepted_the_room_admits_one_a_second() {
    let ns = TestNamespace::new();
    let t0 = now_ms();
    let mut room = Room::new(&ns, t0).await;
    room.step(t0).await;
    let (before, _) = room.step(t0 + 1_000).await;
    assert_eq!(room.accepted().await, Some(0.0));
    room.push_back(t0 + 1_000).await;
    for tick in 11..=29 {
        let (_, rate) = room.step(t0 + tick * 100).await;
        assert_eq!(rate, 1, "never stalled, at {tick}");
    }
    let (after, _) = room.step(t0 + 2_900).await;
    assert!((1..=2).contains(&(after - before)), "{}", after - before);
    // Exactly the hold after the only pushback: the setting again.
    assert_eq!(room.step(t0 + 3_000).await.1, SETTING);
    ns.cleanup().await;
}

#[tokio::test]
async fn a_rate_measured_before_the_start_does_not_hold_the_first_second() {
    let ns = TestNamespace::new();
    let t0 = now_ms();
    // The sale starts at t0 + 2 s (`Room::new` starts it a minute before its argument).
    let mut room = Room::new(&ns, t0 + 62_000).await;
    for tick in 0..20 {
        assert_eq!(
            room.step(t0 + tick * 100).await,
            (0, SETTING),
            "before the start"
        );
    }
    // Pushback in the sale's first moments: no window has closed within the sale, so
    // nothing says what the backends accept, and the setting holds.
    room.push_back(t0 + 2_000).await;
    let (_, rate) = room.step(t0 + 2_100).await;
    assert_eq!(rate, SETTING, "no rate measured yet within the sale");
    assert_eq!(room.accepted().await, None);
}

#[tokio::test]
async fn a_raffle_closed_without_a_seed_admits_nobody_until_one_is_written() {
    let ns = TestNamespace::new();
    let t0 = now_ms();
    let mut room = Room::new(&ns, t0).await;
    room.set("mode", "raffle").await;
    for tick in 0..=5 {
        let (cursor, _) = room.step(t0 + tick * 100).await;
        assert_eq!(cursor, 0, "no seed, no order to admit in");
    }
    room.set("seed", "5eed").await;
    let (cursor, _) = room.step(t0 + 600).await;
    assert!(cursor > 0, "admitted once the seed is there: {cursor}");
}

#[tokio::test]
async fn a_purchase_with_a_pass_the_backends_cannot_take_is_recorded_as_pushback() {
    let mut platform = spawn_platform().await;
    let product = platform
        .create_queued_product(5, Duration::from_millis(200))
        .await;
    let user = 301;
    let joined: serde_json::Value = platform
        .post(&format!("/api/rooms/{product}/join"), &user_token(user))
        .await
        .json()
        .await
        .expect("join");
    let ticket = joined["ticket"].as_str().expect("ticket").to_string();
    let path = eventually("admitted", Duration::from_secs(10), || async {
        let answer: serde_json::Value = platform
            .get(
                &format!("/api/rooms/{product}/tickets/{ticket}"),
                &user_token(user),
            )
            .await
            .json()
            .await
            .ok()?;
        answer["purchase_path"].as_str().map(str::to_string)
    })
    .await;
    // A gateway whose seckill-api replica is gone: the pass is good, nothing takes it.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let cut_off = platform
        .add_gateway_with(|settings| settings.seckill_api_urls = vec![closed])
        .await;
    let room = platform.ns.keys().room(product);
    let pushback = || async {
        let mut redis = platform.ns.redis().await;
        redis::cmd("HGET")
            .arg(&room)
            .arg("pushback_ms")
            .query_async::<Option<i64>>(&mut redis)
            .await
            .expect("hget")
    };
    assert_eq!(pushback().await, None, "no pushback before any");

    let sent = now_ms();
    let answer = platform
        .client
        .post(format!("{cut_off}{path}"))
        .bearer_auth(user_token(user))
        .send()
        .await
        .expect("purchase");
    assert!(
        [502, 503, 504].contains(&answer.status().as_u16()),
        "{}",
        answer.status()
    );
    let at = eventually("the pushback recorded", Duration::from_secs(5), || async {
        pushback().await
    })
    .await;
    assert!(at >= sent, "recorded at {at}, sent at {sent}");
    platform.shutdown().await;
}
