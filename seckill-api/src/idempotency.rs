//! `Idempotency-Key` on purchases: the same key answers the same response.
//!
//! The first request with a key claims it (`SET NX` of a "pending" record naming the purchase
//! it runs), runs, and stores its answer for a day. A retry with the key gets that answer
//! back; a retry that overtakes the first gets 409 `request_in_progress`; the same key for
//! another product gets 422 `idempotency_key_reused`.
//!
//! A request that could not finish its record (a transient failure, a crash, an answer that
//! could not be stored) leaves it pending with the purchase it ran. Once the record's lease
//! has passed (at once after a transient failure), a retry takes it over: if that purchase
//! holds the buyer's marker it was accepted, and the retry answers `202` with its request id
//! instead of `409`; otherwise the retry runs a new purchase. Every write of the record
//! after the claim is a compare-and-set on the exact record the request wrote, so a request
//! whose lease passed can never overwrite (or delete) the claim of the one that took over.

use std::time::Duration;

use axum::http::StatusCode;
use redis::Script;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use seckill_store::RedisKeys;

use crate::error::ApiError;

/// How long a claim is its request's alone: longer than any request's deadline.
const LEASE: Duration = Duration::from_secs(30);
/// How long records (answers, and claims left unfinished) are kept.
const RECORD_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest accepted key.
const MAX_KEY_LEN: usize = 128;

/// What is stored under a key.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    /// A request is running (or ran, and left no answer) purchase `request_id`; it owns the
    /// key until `lease_until_ms` (unix ms).
    Pending {
        product_id: i64,
        request_id: Uuid,
        lease_until_ms: i64,
    },
    Done {
        product_id: i64,
        status: u16,
        body: String,
    },
}

impl Record {
    fn pending(product_id: i64, request_id: Uuid, lease: Duration) -> Self {
        Self::Pending {
            product_id,
            request_id,
            lease_until_ms: chrono::Utc::now().timestamp_millis() + lease.as_millis() as i64,
        }
    }

    fn encode(&self) -> Result<String, ApiError> {
        Ok(serde_json::to_string(self).map_err(anyhow::Error::from)?)
    }
}

/// A request's hold on a key: the purchase it runs, and the record it wrote (what every
/// later write of the record compares against).
#[derive(Debug)]
pub struct Ticket {
    /// The purchase to run under the key.
    pub request_id: Uuid,
    product_id: i64,
    record: String,
}

/// What a request with a key should do.
#[derive(Debug)]
pub enum Claim {
    /// First use: run the purchase `ticket.request_id`, then [`Idempotency::complete`] or
    /// [`Idempotency::release`].
    Fresh(Ticket),
    /// An earlier request under this key ran purchase `earlier` and left no answer: if that
    /// purchase holds the buyer's marker, it was accepted; else run `ticket.request_id`.
    /// Either way, then complete or release the ticket.
    TakeOver {
        /// This request's hold on the key.
        ticket: Ticket,
        /// The purchase the earlier request ran.
        earlier: Uuid,
    },
    /// Answered before: send this again.
    Replay {
        /// The first answer's status.
        status: StatusCode,
        /// The first answer's JSON body.
        body: String,
    },
}

/// Idempotency records in Redis.
#[derive(Clone)]
pub struct Idempotency {
    redis: seckill_store::Redis,
    keys: RedisKeys,
    swap: std::sync::Arc<Script>,
}

impl std::fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency").finish_non_exhaustive()
    }
}

impl Idempotency {
    /// Records under `keys`' namespace.
    pub fn new(redis: seckill_store::Redis, keys: RedisKeys) -> Self {
        Self {
            redis,
            keys,
            swap: std::sync::Arc::new(Script::new(include_str!("idempotency_swap.lua"))),
        }
    }

    /// Checks the header value: 1–128 visible ASCII characters.
    pub fn validate(key: &str) -> Result<(), ApiError> {
        let ok = !key.is_empty()
            && key.len() <= MAX_KEY_LEN
            && key.bytes().all(|b| b.is_ascii_graphic());
        if ok {
            Ok(())
        } else {
            Err(ApiError::InvalidRequest(
                "Idempotency-Key must be 1-128 visible ASCII characters".into(),
            ))
        }
    }

    /// Claims `key` for a purchase of `product_id`, or tells how to answer without running it.
    pub async fn claim(&self, user_id: i64, key: &str, product_id: i64) -> Result<Claim, ApiError> {
        let redis_key = self.keys.idempotency(user_id, key);
        let ticket = self.ticket(product_id)?;
        let mut conn = self.redis.get().await?;
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&redis_key)
            .arg(&ticket.record)
            .arg("NX")
            .arg("PX")
            .arg(RECORD_TTL.as_millis() as u64)
            .query_async(&mut conn)
            .await?;
        if claimed.is_some() {
            return Ok(Claim::Fresh(ticket));
        }
        let stored: Option<String> = redis::cmd("GET")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await?;
        drop(conn);
        let Some(stored) = stored else {
            // Expired between SET and GET; let the caller retry.
            return Err(ApiError::RequestInProgress);
        };
        match serde_json::from_str::<Record>(&stored) {
            Ok(
                Record::Pending {
                    product_id: first, ..
                }
                | Record::Done {
                    product_id: first, ..
                },
            ) if first != product_id => Err(ApiError::IdempotencyKeyReused),
            Ok(Record::Done { status, body, .. }) => Ok(Claim::Replay {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
                body,
            }),
            Ok(Record::Pending {
                request_id,
                lease_until_ms,
                ..
            }) if lease_until_ms <= chrono::Utc::now().timestamp_millis() => {
                if self.swap(&redis_key, &stored, &ticket.record).await? {
                    Ok(Claim::TakeOver {
                        ticket,
                        earlier: request_id,
                    })
                } else {
                    Err(ApiError::RequestInProgress)
                }
            }
            Ok(Record::Pending { .. }) => Err(ApiError::RequestInProgress),
            Err(e) => Err(ApiError::Internal(
                anyhow::Error::new(e).context("unreadable idempotency record"),
            )),
        }
    }

    /// Stores the answer to replay for the key, if the ticket still holds it.
    pub async fn complete(
        &self,
        user_id: i64,
        key: &str,
        ticket: &Ticket,
        status: StatusCode,
        body: &str,
    ) -> Result<(), ApiError> {
        let record = Record::Done {
            product_id: ticket.product_id,
            status: status.as_u16(),
            body: body.to_string(),
        }
        .encode()?;
        self.swap(
            &self.keys.idempotency(user_id, key),
            &ticket.record,
            &record,
        )
        .await?;
        Ok(())
    }

    /// Gives up the ticket's lease after a transient failure, naming the purchase that may
    /// have run (the ticket's own, or an earlier one still undecided), so a retry takes the
    /// key over at once and finds that purchase if it was accepted.
    pub async fn release(
        &self,
        user_id: i64,
        key: &str,
        ticket: &Ticket,
        may_have_run: Uuid,
    ) -> Result<(), ApiError> {
        let released = Record::pending(ticket.product_id, may_have_run, Duration::ZERO).encode()?;
        self.swap(
            &self.keys.idempotency(user_id, key),
            &ticket.record,
            &released,
        )
        .await?;
        Ok(())
    }

    fn ticket(&self, product_id: i64) -> Result<Ticket, ApiError> {
        let request_id = Uuid::now_v7();
        Ok(Ticket {
            request_id,
            product_id,
            record: Record::pending(product_id, request_id, LEASE).encode()?,
        })
    }

    /// Replaces the record at `key` by `new` if it is still exactly `expected`.
    async fn swap(&self, key: &str, expected: &str, new: &str) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        let swapped: i64 = self
            .swap
            .key(key)
            .arg(expected)
            .arg(new)
            .arg(RECORD_TTL.as_millis() as u64)
            .invoke_async(&mut conn)
            .await?;
        Ok(swapped == 1)
    }
}
