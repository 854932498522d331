//! The waiting room (`docs/DESIGN.md` §9): a queue in front of a product's sale, for the
//! products that ask for one.
//!
//! - [`ticket`] — what the gateway signs: a buyer's place (ticket) and admission (pass);
//! - [`view`] — one room as a gateway knows it, and a poll's answer from it;
//! - [`pow`] — the optional proof-of-work on joining, its difficulty from the join rate;
//! - [`api`] — the room's routes in the API contract;
//! - here — the rooms a gateway follows: joining (`join.lua`), the admission step every
//!   tick (`advance.lua`, with the units left read from the stock buckets), and what the
//!   request path asks: [`Rooms::respond`] for the room's own routes, [`Rooms::purchase`]
//!   for a purchase.
//!
//! A gateway learns a room when a buyer joins or polls it, presents a pass for it, or when
//! seckill-api refuses a purchase of it `428` (the product's mode is in Postgres; the room's
//! set-up in Redis is seckill-api's copy). The tick refreshes every room on seen in the last
//! [`FORGET_AFTER`]; a product found without a room is asked again, when asked about, after
//! [`RECHECK_OFF`], and forgotten after [`OFF_KEPT`] unasked. While no room is on, a
//! purchase costs one atomic load here.
//! A purchase of a product this gateway knows nothing about is forwarded as it is: seckill-api
//! refuses it if its room is on.

pub mod api;
pub mod draw;
pub mod pow;
pub mod ticket;
pub mod view;

use std::collections::{HashMap, VecDeque};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{Method, StatusCode};
use bytes::Bytes;
use redis::{RedisError, Script, Value};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use seckill_http1::{Response, with_date};
use seckill_store::{Redis, RedisKeys};

use crate::error;
pub use pow::PowSettings;
pub use ticket::{Challenge, Holder, Pass, RoomKey, Ticket};
pub use view::{Answer, Pacing, RoomView, State};

/// A room nobody joined, polled or bought from for this long is no longer refreshed.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);
/// A product found without a room is asked again after this long, when asked about.
pub const RECHECK_OFF: Duration = Duration::from_secs(1);
/// A room whose last refresh is older than this is not answered from (503).
pub const STALE_AFTER: Duration = Duration::from_secs(3);
/// A product found without a room is forgotten once nobody asked about it for this long.
pub const OFF_KEPT: Duration = Duration::from_secs(5);
/// For this long after the backends last pushed back (a purchase with a pass answered `502`,
/// `503` or `504`), a room admits no faster than a quarter above the rate they accepted.
pub const PUSHBACK_HOLD: Duration = Duration::from_secs(2);

/// The room settings.
#[derive(Debug, Clone, Copy)]
pub struct RoomSettings {
    /// How often each followed room takes its admission step (`room_tick_ms`).
    pub tick: Duration,
    /// Admission and poll pacing.
    pub pacing: Pacing,
    /// Admitted buyers beyond the units left, for those who do not buy, in percent of the
    /// units left (at least one) (`room_margin_percent`).
    pub margin_percent: u32,
    /// After this long an admitted buyer who has not bought counts among those who may not
    /// (`room_no_show_ms`): only then does the margin admit others in their stead.
    pub no_show: Duration,
    /// The proof-of-work on joining (`room_pow_*`).
    pub pow: PowSettings,
}

/// What the gateway knows of one product's room.
#[derive(Debug)]
struct Slot {
    /// The room, when it is on; `None`: no room (mode `open`, or no set-up).
    view: Option<std::sync::Arc<RoomView>>,
    /// The product's stock and buckets, read once (fixed at creation).
    stock: Option<(i64, u16)>,
    /// When the view was last refreshed.
    refreshed: Instant,
    /// When a buyer last asked about the room (ms since the gateway's start).
    seen: AtomicU64,
    /// Learnt from a `428`, to be refreshed on the next tick.
    pending: bool,
    /// The join rate and the proof-of-work's difficulty it sets.
    pow: pow::Difficulty,
}

/// The rooms this gateway follows.
pub struct Rooms {
    key: RoomKey,
    redis: Redis,
    keys: RedisKeys,
    settings: RoomSettings,
    slots: RwLock<HashMap<i64, Slot>>,
    /// Slots whose room is on: none, and a purchase does not look.
    on: AtomicUsize,
    started: Instant,
    join: Script,
    advance: Script,
    /// The draw of each raffle this gateway drew, or is drawing: one per product, for its
    /// seed and entries; callers that need it meanwhile wait for the one under way.
    draws: std::sync::Mutex<HashMap<i64, Drawing>>,
    pushback: Script,
}

/// A raffle's draw, once made; made once however many refreshes want it at once.
type Drawing = (
    String,
    u64,
    std::sync::Arc<tokio::sync::OnceCell<Option<std::sync::Arc<draw::Draw>>>>,
);

impl std::fmt::Debug for Rooms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rooms")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A request to the room's own routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomRequest<'a> {
    /// `POST /api/rooms/{product_id}/join`.
    Join { product_id: i64 },
    /// `GET /api/rooms/{product_id}/tickets/{ticket}`.
    Poll { product_id: i64, ticket: &'a str },
    /// `GET /api/rooms/{product_id}/draw`.
    Draw { product_id: i64 },
    /// `GET /api/rooms/{product_id}/challenge`.
    Challenge { product_id: i64 },
}

/// The room's own routes live under this prefix.
pub const PREFIX: &str = "/api/rooms/";

/// Whether `path` is under the room's routes (answered by the gateway, `404` if none).
pub fn is_room_path(path: &str) -> bool {
    path.starts_with(PREFIX)
}

/// The room request `method` and `path` make, if any.
pub fn room_request<'a>(method: &Method, path: &'a str) -> Option<RoomRequest<'a>> {
    let rest = path.strip_prefix(PREFIX)?;
    let (product, rest) = rest.split_once('/')?;
    let product_id = product_id(product)?;
    if rest == "join" && method == Method::POST {
        return Some(RoomRequest::Join { product_id });
    }
    if rest == "draw" && method == Method::GET {
        return Some(RoomRequest::Draw { product_id });
    }
    if rest == "challenge" && method == Method::GET {
        return Some(RoomRequest::Challenge { product_id });
    }
    let ticket = rest.strip_prefix("tickets/")?;
    (method == Method::GET && !ticket.is_empty() && !ticket.contains('/'))
        .then_some(RoomRequest::Poll { product_id, ticket })
}

/// A product id as paths write it: 1–18 digits, no leading zero.
pub fn product_id(text: &str) -> Option<i64> {
    let plain = !text.is_empty()
        && text.len() <= 18
        && !text.starts_with('0')
        && text.bytes().all(|b| b.is_ascii_digit());
    plain.then(|| text.parse().ok()).flatten()
}

/// A purchase's path: `/api/seckill/{product_id}`, or with a pass
/// `/api/seckill/{product_id}/{pass}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurchasePath<'a> {
    /// The product, as written.
    pub product: &'a str,
    /// The product's id, when it is written plainly ([`product_id`]); any other spelling
    /// is left to the replica.
    pub id: Option<i64>,
    /// The pass segment, if any.
    pub pass: Option<&'a str>,
}

impl<'a> PurchasePath<'a> {
    /// The purchase `method` and `path` make, if they make one.
    pub fn parse(method: &Method, path: &'a str) -> Option<Self> {
        if method != Method::POST {
            return None;
        }
        let rest = path.strip_prefix("/api/seckill/")?;
        let (product, pass) = match rest.split_once('/') {
            Some((product, pass)) => (product, Some(pass)),
            None => (rest, None),
        };
        // `/api/seckill/{id}/result` is the result's route (GET), never a pass.
        let usable = !product.is_empty()
            && pass.is_none_or(|p| !p.is_empty() && !p.contains('/') && p != "result");
        usable.then(|| Self {
            product,
            id: product_id(product),
            pass,
        })
    }
}

/// What becomes of a purchase: refused here, or forwarded to a target.
#[derive(Debug)]
pub enum Admission {
    /// Answered here (`428`, `403`, `404`, `503`).
    Refused(Response),
    /// Forwarded, with the admitted rank when it came with a pass.
    Forward {
        /// The target written to seckill-api in place of the client's: its path without the
        /// client's query, or with the gateway's `admitted`; `None`: the client's as it is
        /// (a path alone).
        target: Option<String>,
        /// The product and rank of a pass, recorded as bought on a `202`.
        admitted: Option<(i64, u64)>,
    },
}

/// The time now, unix ms.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Rooms {
    /// Rooms signed with `key`, kept in `redis` under `namespace`.
    pub fn new(key: RoomKey, redis: Redis, namespace: &str, settings: RoomSettings) -> Self {
        Self {
            key,
            redis,
            keys: RedisKeys::new(namespace),
            settings,
            slots: RwLock::new(HashMap::new()),
            on: AtomicUsize::new(0),
            started: Instant::now(),
            join: Script::new(include_str!("join.lua")),
            advance: Script::new(include_str!("advance.lua")),
            draws: std::sync::Mutex::new(HashMap::new()),
            // Only into a room that exists: a hash Redis dropped (or a sale long over) is
            // not made again with this one field and no expiry.
            pushback: Script::new(
                "if redis.call('EXISTS', KEYS[1]) == 1 then \
                 return redis.call('HSET', KEYS[1], 'pushback_ms', ARGV[1]) end return 0",
            ),
        }
    }

    fn since_start(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The room of `product_id` as last refreshed, if this gateway knows it is on.
    fn known(&self, product_id: i64) -> Option<std::sync::Arc<RoomView>> {
        if self.on.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        let slot = slots.get(&product_id)?;
        slot.seen.store(self.since_start(), Ordering::Relaxed);
        slot.view.clone()
    }

    /// The room of `product_id`, refreshed from Redis first when this gateway does not know
    /// it (or only knew it off a while ago); `Ok(None)`: no room on.
    async fn room(&self, product_id: i64) -> Result<Option<std::sync::Arc<RoomView>>, RedisError> {
        {
            let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = slots.get(&product_id) {
                slot.seen.store(self.since_start(), Ordering::Relaxed);
                let fresh = match slot.view {
                    Some(_) => slot.refreshed.elapsed() < STALE_AFTER,
                    None => slot.refreshed.elapsed() < RECHECK_OFF,
                };
                if fresh {
                    return Ok(slot.view.clone());
                }
            }
        }
        self.refresh(product_id).await
    }

    /// [`Self::room`], or the answer when there is none on (`404 no_waiting_room`) or Redis
    /// did not answer (`503`).
    async fn room_on(&self, product_id: i64) -> Result<std::sync::Arc<RoomView>, Response> {
        match self.room(product_id).await {
            Ok(Some(room)) => Ok(room),
            Ok(None) => Err(no_room()),
            Err(e) => Err(redis_failed(&e)),
        }
    }

    /// Learns that `product_id` has a room on (seckill-api refused a purchase of it `428`):
    /// followed from the next tick.
    pub fn learn(&self, product_id: i64) {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let slot = slots.entry(product_id).or_insert_with(|| Slot {
            view: None,
            stock: None,
            refreshed: Instant::now(),
            seen: AtomicU64::new(self.since_start()),
            pending: false,
            pow: pow::Difficulty::default(),
        });
        slot.pending = true;
    }

    /// Runs the admission step of `product_id`'s room and keeps what it returns.
    async fn refresh(
        &self,
        product_id: i64,
    ) -> Result<Option<std::sync::Arc<RoomView>>, RedisError> {
        let mut conn = self.redis.get().await?;
        let known = {
            let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
            slots.get(&product_id).map(|s| {
                (
                    s.stock,
                    s.view.as_ref().and_then(|v| v.admits.back().map(|a| a.1)),
                )
            })
        };
        let (stock, last_admit) = known.unwrap_or((None, None));
        let stock = match stock {
            Some(stock) => Some(stock),
            None => self.read_stock(&mut conn, product_id).await?,
        };
        let view = match stock {
            None => None,
            Some((stock, buckets)) => {
                // Counted before the buckets are read: the script takes the purchases
                // recorded since off the units left, so a unit sold between the reads and
                // the script counts neither as left nor as an admitted buyer's to come.
                let bought: i64 = redis::cmd("ZCARD")
                    .arg(self.keys.room_bought(product_id))
                    .query_async(&mut conn)
                    .await?;
                let remaining = self
                    .remaining(&mut conn, product_id, stock, buckets)
                    .await?;
                let now = now_ms();
                let ttl = self.settings.pacing.pass_ttl_ms;
                let since = last_admit.unwrap_or(now - ttl - 10_000);
                let no_show = i64::try_from(self.settings.no_show.as_millis()).unwrap_or(i64::MAX);
                let reply: Vec<Value> = self
                    .advance
                    .key(self.keys.room(product_id))
                    .key(self.keys.room_admits(product_id))
                    .key(self.keys.room_bought(product_id))
                    .arg(now)
                    .arg(self.settings.pacing.admit_per_sec)
                    .arg(self.settings.margin_percent)
                    .arg(self.settings.pacing.pass_ttl_ms)
                    .arg(no_show)
                    .arg(remaining)
                    .arg(since)
                    .arg(bought)
                    .arg(u64::try_from(PUSHBACK_HOLD.as_millis()).unwrap_or(u64::MAX))
                    .invoke_async(&mut conn)
                    .await?;
                // Not `known`: the tick's own step is no buyer's interest in the room.
                let previous = self
                    .slots
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&product_id)
                    .and_then(|slot| slot.view.clone());
                match parse_advance(&reply, previous.as_deref(), now - ttl - 10_000) {
                    Some(mut view) => {
                        view.draw = self.drawn(product_id, &reply, previous.as_deref()).await;
                        Some(std::sync::Arc::new(view))
                    }
                    None => None,
                }
            }
        };
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let seen = self.since_start();
        let slot = slots.entry(product_id).or_insert_with(|| Slot {
            view: None,
            stock: None,
            refreshed: Instant::now(),
            seen: AtomicU64::new(seen),
            pending: false,
            pow: pow::Difficulty::default(),
        });
        match (slot.view.is_some(), view.is_some()) {
            (false, true) => {
                self.on.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.on.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
        slot.pending = false;
        slot.view = view.clone();
        slot.stock = if view.is_some() { stock } else { None };
        slot.refreshed = Instant::now();
        if let Some(view) = &view {
            let product = product_id.to_string();
            metrics::gauge!(crate::metrics::ROOM_JOINED, "product" => product.clone())
                .set(view.joined as f64);
            metrics::gauge!(crate::metrics::ROOM_ADMITTED, "product" => product.clone())
                .set(view.cursor as f64);
            metrics::gauge!(crate::metrics::ROOM_OUTSTANDING, "product" => product.clone())
                .set(view.outstanding as f64);
            metrics::gauge!(crate::metrics::ROOM_ADMIT_RATE, "product" => product.clone())
                .set(view.admit_per_sec as f64);
            if self.settings.pow.is_on() {
                let rate = slot.pow.record(Instant::now(), view.line, view.joined);
                slot.pow.bits = self.settings.pow.bits(rate);
                metrics::gauge!(crate::metrics::ROOM_POW_BITS, "product" => product)
                    .set(f64::from(slot.pow.bits));
            }
        }
        Ok(view)
    }

    /// The room's stock and bucket count, if its room is on.
    async fn read_stock(
        &self,
        conn: &mut seckill_store::RedisConn,
        product_id: i64,
    ) -> Result<Option<(i64, u16)>, RedisError> {
        let (mode, stock, buckets): (Option<String>, Option<i64>, Option<u16>) =
            redis::cmd("HMGET")
                .arg(self.keys.room(product_id))
                .arg("mode")
                .arg("stock")
                .arg("buckets")
                .query_async(conn)
                .await?;
        Ok(match (mode.as_deref(), stock, buckets) {
            (Some("fifo" | "raffle"), Some(stock), Some(buckets)) if buckets > 0 => {
                Some((stock, buckets))
            }
            _ => None,
        })
    }

    /// Units of the product still on sale: each loaded bucket's `remaining`; a bucket not
    /// loaded yet counts its share of the stock (none once the product was loaded whole).
    async fn remaining(
        &self,
        conn: &mut seckill_store::RedisConn,
        product_id: i64,
        stock: i64,
        buckets: u16,
    ) -> Result<i64, RedisError> {
        let loaded: Option<String> = redis::cmd("HGET")
            .arg(self.keys.product_state(product_id))
            .arg("loaded")
            .query_async(conn)
            .await?;
        let share = (stock + i64::from(buckets) - 1) / i64::from(buckets);
        let reads = (0..buckets).map(|bucket| {
            let key = self.keys.stock(product_id, bucket);
            async move {
                // A clone of a multiplexed connection: the reads go out together.
                let mut conn = self.redis.get().await?;
                redis::cmd("HGET")
                    .arg(key)
                    .arg("remaining")
                    .query_async::<Option<i64>>(&mut conn)
                    .await
            }
        });
        let mut total = 0;
        for remaining in futures_util::future::try_join_all(reads).await? {
            total += match remaining {
                Some(units) => units.max(0),
                None if loaded.is_some() => 0,
                None => share,
            };
        }
        Ok(total.min(stock.max(0)).max(0))
    }

    /// The draw of a raffle whose entry closed, from the step's `reply`: `previous`'s when it
    /// is of the same seed and entries, else the one this gateway made or is making for
    /// them (off the runtime's threads: one SHA-256 per entry), made once however many
    /// refreshes ask at once; `None` for `fifo` and before the close.
    async fn drawn(
        &self,
        product_id: i64,
        reply: &[Value],
        previous: Option<&RoomView>,
    ) -> Option<std::sync::Arc<draw::Draw>> {
        let entries = match reply.get(9) {
            Some(Value::Int(n)) => u64::try_from(*n).ok()?,
            _ => return None,
        };
        let seed = match reply.get(10) {
            Some(Value::BulkString(bytes)) => std::str::from_utf8(bytes).ok()?.to_owned(),
            _ => return None,
        };
        if seed.is_empty() {
            return None;
        }
        if let Some(draw) = previous.and_then(|p| p.draw.as_ref())
            && draw.entries == entries
            && draw.seed == seed
        {
            return Some(draw.clone());
        }
        let cell = {
            let mut draws = self.draws.lock().unwrap_or_else(|e| e.into_inner());
            let slot = draws
                .entry(product_id)
                .or_insert_with(|| (seed.clone(), entries, Default::default()));
            if slot.0 != seed || slot.1 != entries {
                *slot = (seed.clone(), entries, Default::default());
            }
            slot.2.clone()
        };
        cell.get_or_init(|| async move {
            let started = Instant::now();
            let draw = tokio::task::spawn_blocking(move || draw::Draw::new(&seed, entries))
                .await
                .ok()??;
            tracing::info!(
                entries,
                took_ms = started.elapsed().as_millis() as u64,
                "waiting room: raffle drawn"
            );
            Some(std::sync::Arc::new(draw))
        })
        .await
        .clone()
    }

    /// Takes the admission step of every room followed, every tick, until `cancel`.
    pub async fn run(self: std::sync::Arc<Self>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.settings.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = self.since_start();
            let due: Vec<i64> = {
                let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
                slots.retain(|_, slot| {
                    let kept = if slot.view.is_some() {
                        FORGET_AFTER
                    } else {
                        OFF_KEPT
                    };
                    let unseen = now.saturating_sub(slot.seen.load(Ordering::Relaxed));
                    let keep = slot.pending || u128::from(unseen) < kept.as_millis();
                    if !keep && slot.view.is_some() {
                        self.on.fetch_sub(1, Ordering::Relaxed);
                    }
                    keep
                });
                self.draws
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|id, _| slots.contains_key(id));
                slots
                    .iter()
                    .filter(|(_, slot)| slot.view.is_some() || slot.pending)
                    .map(|(&id, _)| id)
                    .collect()
            };
            for product_id in due {
                if let Err(e) = self.refresh(product_id).await {
                    metrics::counter!(crate::metrics::ROOM_ERRORS).increment(1);
                    tracing::warn!(product_id, error = %e, "waiting room step failed");
                }
            }
        }
    }

    /// Answers a request to the room's own routes for `user_id`; `body`: the request's
    /// (a join's proof-of-work, when any).
    pub async fn respond(&self, request: RoomRequest<'_>, user_id: i64, body: &[u8]) -> Response {
        match request {
            RoomRequest::Join { product_id } => self.join(product_id, user_id, body).await,
            RoomRequest::Poll { product_id, ticket } => {
                self.poll(product_id, user_id, ticket).await
            }
            RoomRequest::Draw { product_id } => self.draw(product_id).await,
            RoomRequest::Challenge { product_id } => self.challenge(product_id, user_id).await,
        }
    }

    async fn join(&self, product_id: i64, user_id: i64, body: &[u8]) -> Response {
        // Before any Redis work of the join's own: a join without its proof costs no more
        // than a poll.
        if self.settings.pow.is_on()
            && let Some(refused) = self.check_proof(product_id, user_id, body).await
        {
            return refused;
        }
        let joined = async {
            let mut conn = self.redis.get().await?;
            let reply: Vec<i64> = self
                .join
                .key(self.keys.room(product_id))
                .key(self.keys.room_tickets(product_id))
                .arg(user_id)
                .arg(now_ms())
                .invoke_async(&mut conn)
                .await?;
            Ok::<_, RedisError>(reply)
        }
        .await;
        let reply = match joined {
            Ok(reply) => reply,
            Err(e) => return redis_failed(&e),
        };
        match reply.as_slice() {
            [1, place, joined_ms, start_ms, _end_ms, line] => {
                let ticket = Ticket {
                    place: u64::try_from(*place).unwrap_or(0),
                    joined_ms: *joined_ms,
                };
                let holder = Holder {
                    product_id,
                    user_id,
                    sale: *start_ms,
                    line: u64::try_from(*line).unwrap_or(0),
                };
                let room = match self.room_on(product_id).await {
                    Ok(room) => room,
                    Err(refused) => return refused,
                };
                metrics::counter!(crate::metrics::ROOM_JOINS).increment(1);
                let text = self.key.ticket(holder, ticket);
                self.answer(holder, &room, ticket.place, Some(text))
            }
            [-1, ..] => error::response(StatusCode::GONE, "closed", "the sale has ended"),
            _ => no_room(),
        }
    }

    /// The room's current proof-of-work difficulty, as of its last step.
    fn pow_bits(&self, product_id: i64) -> u32 {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots
            .get(&product_id)
            .map_or(self.settings.pow.bits(0), |slot| slot.pow.bits)
    }

    /// A fresh challenge for `holder` at the room's current difficulty.
    fn issue_challenge(&self, holder: Holder, now: i64) -> api::ChallengeAnswer {
        let challenge = Challenge {
            issued_ms: now,
            bits: self.pow_bits(holder.product_id),
        };
        api::ChallengeAnswer {
            challenge: self.key.challenge(holder, challenge),
            bits: challenge.bits,
            expires_at_ms: now.saturating_add(pow::CHALLENGE_TTL_MS),
        }
    }

    /// `GET /api/rooms/{product_id}/challenge`: a challenge for the caller (bits 0 while
    /// no proof is asked).
    async fn challenge(&self, product_id: i64, user_id: i64) -> Response {
        let room = match self.room_on(product_id).await {
            Ok(room) => room,
            Err(refused) => return refused,
        };
        let holder = room.holder(product_id, user_id);
        let mut response = json(StatusCode::OK, &self.issue_challenge(holder, now_ms()));
        response.push_header(b"cache-control", b"no-store");
        response
    }

    /// The refusal of a join whose proof-of-work is missing or does not hold, if it is
    /// one: the room's difficulty is above 0 and `body` carries no challenge of the
    /// caller's, unexpired, at least `room_pow_min_bits`, that its nonce solves. A challenge
    /// is held to its own bits: one solved within its lifetime passes even if the
    /// difficulty rose since.
    async fn check_proof(&self, product_id: i64, user_id: i64, body: &[u8]) -> Option<Response> {
        let proof = match api::JoinProof::parse(body) {
            Ok(proof) => proof,
            Err(message) => {
                return Some(error::response(
                    StatusCode::BAD_REQUEST,
                    "invalid_request",
                    message,
                ));
            }
        };
        let room = match self.room_on(product_id).await {
            Ok(room) => room,
            Err(refused) => return Some(refused),
        };
        let now = now_ms();
        // An ended sale is said so by the join itself.
        if now >= room.end_ms || self.pow_bits(product_id) == 0 {
            return None;
        }
        let holder = room.holder(product_id, user_id);
        let failure = match proof {
            None => pow::Failure::Missing,
            Some(proof) => match self.key.check_challenge(holder, &proof.challenge) {
                Some(c) if c.bits < self.settings.pow.min_bits => pow::Failure::Invalid,
                Some(c) if now >= c.issued_ms.saturating_add(pow::CHALLENGE_TTL_MS) => {
                    pow::Failure::Expired
                }
                Some(c) if pow::solves(&proof.challenge, &proof.nonce, c.bits) => return None,
                _ => pow::Failure::Invalid,
            },
        };
        metrics::counter!(crate::metrics::ROOM_POW_FAILURES, "reason" => failure.label())
            .increment(1);
        let (status, code, message) = failure.refusal();
        let fresh = self.issue_challenge(holder, now);
        let body = api::PowRefusal {
            code,
            message,
            challenge: fresh.challenge,
            bits: fresh.bits,
            expires_at_ms: fresh.expires_at_ms,
        };
        let mut response = json(status, &body);
        response.push_header(b"cache-control", b"no-store");
        Some(response)
    }

    async fn poll(&self, product_id: i64, user_id: i64, ticket: &str) -> Response {
        let room = match self.room_on(product_id).await {
            Ok(room) => room,
            Err(refused) => return refused,
        };
        let holder = room.holder(product_id, user_id);
        let Some(ticket) = self.key.check_ticket(holder, ticket) else {
            return error::response(
                StatusCode::FORBIDDEN,
                "invalid_ticket",
                "this ticket is not yours for this sale",
            );
        };
        self.answer(holder, &room, ticket.place, None)
    }

    /// A raffle's draw as published: the seed's commitment from the room's creation on; the
    /// seed, the entries and the ticket list (the user of each entry, by place) once entry
    /// closed and this gateway drew. A drawn raffle's answer never changes: it is made once
    /// (one read of the ticket list, however many ask at once) and kept with the draw.
    async fn draw(&self, product_id: i64) -> Response {
        let room = match self.room_on(product_id).await {
            Ok(room) => room,
            Err(refused) => return refused,
        };
        if !room.raffle {
            return error::response(
                StatusCode::NOT_FOUND,
                "no_draw",
                "this sale's waiting room admits in order of arrival: it has no draw",
            );
        }
        let body = match &room.draw {
            Some(drawn) => {
                let made = drawn
                    .published
                    .get_or_try_init(|| self.publish(product_id, room.start_ms, drawn))
                    .await;
                match made {
                    Ok(body) => body.clone(),
                    Err(e) => return redis_failed(&e),
                }
            }
            None => {
                let seed = async {
                    let mut conn = self.redis.get().await?;
                    redis::cmd("HGET")
                        .arg(self.keys.room(product_id))
                        .arg("seed")
                        .query_async::<Option<String>>(&mut conn)
                        .await
                }
                .await;
                let seed = match seed {
                    Ok(Some(seed)) => seed,
                    // Set up by a seckill-api that wrote no seed: nothing committed to yet.
                    Ok(None) => {
                        return error::unavailable(
                            "this raffle's seed is not set up yet, retry shortly",
                        );
                    }
                    Err(e) => return redis_failed(&e),
                };
                let before = api::DrawAnswer {
                    commitment: draw::commitment(&seed),
                    closes_at_ms: room.start_ms,
                    entries: None,
                    seed: None,
                    tickets: None,
                };
                Bytes::from(serde_json::to_vec(&before).unwrap_or_default())
            }
        };
        let mut response = json(StatusCode::OK, &());
        response.body = body;
        response.push_header(b"cache-control", b"no-store");
        response
    }

    /// The published answer of `drawn`: its commitment from its own seed, and the user of
    /// each entry, by place (`0` for a place whose ticket is gone, never seen).
    async fn publish(
        &self,
        product_id: i64,
        closes_at_ms: i64,
        drawn: &draw::Draw,
    ) -> Result<Bytes, RedisError> {
        let mut conn = self.redis.get().await?;
        let all: HashMap<i64, String> = redis::cmd("HGETALL")
            .arg(self.keys.room_tickets(product_id))
            .query_async(&mut conn)
            .await?;
        let mut users = vec![0i64; usize::try_from(drawn.entries).unwrap_or(0)];
        for (user, held) in all {
            let place = held
                .split_once(':')
                .and_then(|(place, _)| place.parse::<usize>().ok());
            if let Some(slot) = place.and_then(|p| users.get_mut(p)) {
                *slot = user;
            }
        }
        let body = api::DrawAnswer {
            commitment: draw::commitment(&drawn.seed),
            closes_at_ms,
            entries: Some(drawn.entries),
            seed: Some(drawn.seed.clone()),
            tickets: Some(&users),
        };
        Ok(Bytes::from(serde_json::to_vec(&body).unwrap_or_default()))
    }

    /// The JSON answer for the holder of `place`.
    fn answer(
        &self,
        holder: Holder,
        room: &RoomView,
        place: u64,
        ticket: Option<String>,
    ) -> Response {
        let answer = room.answer(place, now_ms(), self.settings.pacing);
        metrics::counter!(crate::metrics::ROOM_POLLS, "state" => answer.state.label()).increment(1);
        let pass_text = answer.pass.map(|pass| self.key.pass(holder, pass));
        let body = api::RoomAnswer {
            ticket,
            state: answer.state,
            place: answer.place,
            rank: answer.rank,
            ahead: answer.ahead,
            wait_ms: answer.wait_ms,
            poll_after_ms: answer.poll_after_ms,
            starts_at_ms: room.start_ms,
            purchase_path: pass_text
                .as_ref()
                .map(|pass| format!("/api/seckill/{}/{pass}", holder.product_id)),
            pass_expires_at_ms: answer.pass.map(|p| p.expires_ms),
        };
        let mut response = json(StatusCode::OK, &body);
        if answer.poll_after_ms > 0 {
            let seconds = answer.poll_after_ms.div_ceil(1000);
            response.push_header(
                b"retry-after",
                itoa::Buffer::new().format(seconds).as_bytes(),
            );
        }
        response.push_header(b"cache-control", b"no-store");
        response
    }

    /// What becomes of `user_id`'s purchase of `path`'s product.
    /// `query`: whether the client's target has one (dropped: only the gateway may say
    /// `admitted`).
    pub async fn purchase(&self, path: PurchasePath<'_>, user_id: i64, query: bool) -> Admission {
        let plain = |product: &str| Admission::Forward {
            target: query.then(|| format!("/api/seckill/{product}")),
            admitted: None,
        };
        let Some(pass) = path.pass else {
            let on = path
                .id
                .and_then(|id| self.known(id))
                .is_some_and(|room| now_ms() < room.end_ms);
            if on {
                metrics::counter!(crate::metrics::ROOM_REFUSED, "reason" => "no_pass").increment(1);
                return Admission::Refused(admission_required(path.product));
            }
            return plain(path.product);
        };
        let Some(product_id) = path.id else {
            return Admission::Refused(error::response(
                StatusCode::NOT_FOUND,
                "not_found",
                "no such route",
            ));
        };
        let room = match self.room(product_id).await {
            Ok(Some(room)) => room,
            Ok(None) => return refused_pass("invalid_pass", "this sale has no waiting room"),
            Err(e) => return Admission::Refused(redis_failed(&e)),
        };
        let holder = room.holder(product_id, user_id);
        let Some(pass) = self.key.check_pass(holder, pass) else {
            return refused_pass("invalid_pass", "this pass is not yours for this sale");
        };
        if now_ms() >= pass.expires_ms {
            return refused_pass("pass_expired", "this pass has expired: its turn has passed");
        }
        Admission::Forward {
            target: Some(format!("/api/seckill/{product_id}?admitted={}", pass.rank)),
            admitted: Some((product_id, pass.rank)),
        }
    }

    /// Notes that `user_id`, admitted at `rank`, bought (a `202`), so the admission stops
    /// counting it among those who may still buy.
    pub async fn bought(&self, product_id: i64, rank: u64, user_id: i64) {
        let recorded = async {
            let mut conn = self.redis.get().await?;
            redis::cmd("ZADD")
                .arg(self.keys.room_bought(product_id))
                .arg("NX")
                .arg(rank)
                .arg(user_id)
                .query_async::<i64>(&mut conn)
                .await
        }
        .await;
        match recorded {
            Ok(_) => metrics::counter!(crate::metrics::ROOM_BOUGHT).increment(1),
            Err(e) => {
                metrics::counter!(crate::metrics::ROOM_ERRORS).increment(1);
                tracing::warn!(product_id, rank, error = %e, "could not record a purchase with a pass");
            }
        }
    }

    /// Notes that the backends could not take a purchase with a pass of `product_id` (a
    /// `502`, `503` or `504`): for [`PUSHBACK_HOLD`] its room admits no faster than they
    /// accept.
    pub async fn pushed_back(&self, product_id: i64) {
        metrics::counter!(crate::metrics::ROOM_PUSHBACK).increment(1);
        let recorded = async {
            let mut conn = self.redis.get().await?;
            self.pushback
                .key(self.keys.room(product_id))
                .arg(now_ms())
                .invoke_async::<i64>(&mut conn)
                .await
        }
        .await;
        if let Err(e) = recorded {
            metrics::counter!(crate::metrics::ROOM_ERRORS).increment(1);
            tracing::warn!(product_id, error = %e, "could not record the backends' pushback");
        }
    }
}

/// Whether a purchase's answer says the backends could not take it: seckill-api's own
/// `503`, or the proxy's `502`, `503` (no replica) or `504`.
pub fn is_pushback(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The view `advance.lua` returned, the admissions it returned appended to those of
/// `previous` newer than `keep_after` (unix ms); `None` when the room is not on.
fn parse_advance(
    reply: &[Value],
    previous: Option<&RoomView>,
    keep_after: i64,
) -> Option<RoomView> {
    let mode = match reply.first()? {
        Value::BulkString(bytes) => bytes.as_slice(),
        Value::SimpleString(text) => text.as_bytes(),
        _ => return None,
    };
    let raffle = match mode {
        b"fifo" => false,
        b"raffle" => true,
        _ => return None,
    };
    let number = |at: usize| match reply.get(at) {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    };
    let unsigned = |at: usize| number(at).and_then(|n| u64::try_from(n).ok());
    let line = unsigned(8)?;
    // A line started again (its room lost with Redis) shares nothing with the one before.
    let previous = previous.filter(|p| p.line == line);
    // Kept from before: the admissions of `previous` newer than `keep_after`; the floor
    // is then the cursor after the newest one dropped. With none kept, the script's floor
    // (the cursor as of the newest admission `previous` had) is right.
    let mut admits: VecDeque<(u64, i64)> = previous
        .map(|p| {
            p.admits
                .iter()
                .copied()
                .filter(|&(_, at)| at > keep_after)
                .collect()
        })
        .unwrap_or_default();
    let floor = match previous {
        Some(p) if !admits.is_empty() => p
            .admits
            .iter()
            .rev()
            .find(|&&(_, at)| at <= keep_after)
            .map_or(p.floor, |&(cursor, _)| cursor),
        _ => unsigned(6)?,
    };
    let admit_per_sec = unsigned(11)?;
    let mut at = 12;
    while let (Some(cursor), Some(ms)) = (unsigned(at), number(at + 1)) {
        if admits.back().is_none_or(|&(last, _)| cursor > last) {
            admits.push_back((cursor, ms));
        }
        at += 2;
    }
    Some(RoomView {
        start_ms: number(1)?,
        line,
        raffle,
        draw: None,
        end_ms: number(2)?,
        joined: unsigned(3)?,
        cursor: unsigned(4)?,
        sold_out: number(5)? == 1,
        floor,
        outstanding: unsigned(7)?,
        admit_per_sec,
        admits,
    })
}

fn json(status: StatusCode, body: &impl Serialize) -> Response {
    let mut response = Response::new(status);
    response.push_header(b"content-type", b"application/json");
    with_date(|date| response.push_header(b"date", date));
    response.body = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    response
}

fn no_room() -> Response {
    error::response(
        StatusCode::NOT_FOUND,
        "no_waiting_room",
        "this product has no waiting room",
    )
}

fn admission_required(product: &str) -> Response {
    let message = format!("this sale has a waiting room: join it at /api/rooms/{product}/join");
    error::response(
        StatusCode::PRECONDITION_REQUIRED,
        "admission_required",
        &message,
    )
}

fn refused_pass(code: &'static str, message: &str) -> Admission {
    metrics::counter!(crate::metrics::ROOM_REFUSED, "reason" => code).increment(1);
    Admission::Refused(error::response(StatusCode::FORBIDDEN, code, message))
}

fn redis_failed(e: &RedisError) -> Response {
    metrics::counter!(crate::metrics::ROOM_ERRORS).increment(1);
    tracing::warn!(error = %e, "waiting room: Redis did not answer");
    error::unavailable("the waiting room cannot answer right now, retry shortly")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_product_ids_are_read_from_a_path() {
        assert_eq!(product_id("42"), Some(42));
        for id in [
            "",
            "042",
            "+42",
            "-42",
            "4 2",
            "9999999999999999999",
            "42/result",
        ] {
            assert_eq!(product_id(id), None, "{id}");
        }
    }

    #[test]
    fn the_room_routes_are_a_join_a_challenge_and_a_poll() {
        assert_eq!(
            room_request(&Method::POST, "/api/rooms/7/join"),
            Some(RoomRequest::Join { product_id: 7 })
        );
        assert_eq!(
            room_request(&Method::GET, "/api/rooms/7/challenge"),
            Some(RoomRequest::Challenge { product_id: 7 })
        );
        assert_eq!(
            room_request(&Method::GET, "/api/rooms/7/tickets/1.2.ab"),
            Some(RoomRequest::Poll {
                product_id: 7,
                ticket: "1.2.ab"
            })
        );
        for (method, path) in [
            (Method::POST, "/api/rooms/7/challenge"),
            (Method::GET, "/api/rooms/7/join"),
            (Method::GET, "/api/rooms/07/challenge"),
            (Method::GET, "/api/rooms/7/challenge/x"),
        ] {
            assert_eq!(room_request(&method, path), None, "{method} {path}");
        }
    }

    #[test]
    fn a_purchase_is_a_post_to_a_product_with_a_pass_or_none() {
        let post = Method::POST;
        assert_eq!(
            PurchasePath::parse(&post, "/api/seckill/7"),
            Some(PurchasePath {
                product: "7",
                id: Some(7),
                pass: None
            })
        );
        assert_eq!(
            PurchasePath::parse(&post, "/api/seckill/7/1.2.ab"),
            Some(PurchasePath {
                product: "7",
                id: Some(7),
                pass: Some("1.2.ab")
            })
        );
        for path in [
            "/api/seckill/",
            "/api/seckill/7/",
            "/api/seckill/7/result",
            "/api/seckill/7/a/b",
            "/api/products/7",
        ] {
            assert_eq!(PurchasePath::parse(&post, path), None, "{path}");
        }
        assert_eq!(PurchasePath::parse(&Method::GET, "/api/seckill/7"), None);
        // Another spelling of an id is still a purchase, left to the replica.
        assert_eq!(
            PurchasePath::parse(&post, "/api/seckill/007").map(|p| p.id),
            Some(None)
        );
    }
}
