//! `Idempotency-Key` on purchases: the same key answers the same response.
//!
//! The first request with a key claims it (`SET NX` of a short-lived "pending" record), runs,
//! and stores its answer for a day. A retry with the key gets that answer back; a retry that
//! overtakes the first gets 409 `request_in_progress`; the same key for another product gets
//! 422 `idempotency_key_reused`. Transient failures (503/500) release the key so a retry runs
//! again instead of replaying an outage.

use std::time::Duration;

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use seckill_store::RedisKeys;

use crate::error::ApiError;

/// How long a claimed key may stay pending: longer than any request's deadline.
const PENDING_TTL: Duration = Duration::from_secs(30);
/// How long answers are kept for replay.
const ANSWER_TTL: Duration = Duration::from_secs(24 * 3600);
/// Longest accepted key.
const MAX_KEY_LEN: usize = 128;

/// What is stored under a key.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum Record {
    Pending {
        product_id: i64,
    },
    Done {
        product_id: i64,
        status: u16,
        body: String,
    },
}

/// What a request with a key should do.
#[derive(Debug)]
pub enum Claim {
    /// First use: run the purchase, then [`Idempotency::complete`] or [`Idempotency::release`].
    Fresh,
    /// Answered before: send this again.
    Replay {
        /// The first answer's status.
        status: StatusCode,
        /// The first answer's JSON body.
        body: String,
    },
}

/// Idempotency records in Redis.
#[derive(Clone, Debug)]
pub struct Idempotency {
    redis: seckill_store::Redis,
    keys: RedisKeys,
}

impl Idempotency {
    /// Records under `keys`' namespace.
    pub fn new(redis: seckill_store::Redis, keys: RedisKeys) -> Self {
        Self { redis, keys }
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

    /// Claims `key` for this purchase, or tells how to answer without running it.
    pub async fn claim(&self, user_id: i64, key: &str, product_id: i64) -> Result<Claim, ApiError> {
        let redis_key = self.keys.idempotency(user_id, key);
        let pending =
            serde_json::to_string(&Record::Pending { product_id }).map_err(anyhow::Error::from)?;
        let mut conn = self.redis.get().await?;
        let claimed: Option<String> = redis::cmd("SET")
            .arg(&redis_key)
            .arg(&pending)
            .arg("NX")
            .arg("PX")
            .arg(PENDING_TTL.as_millis() as u64)
            .query_async(&mut conn)
            .await?;
        if claimed.is_some() {
            return Ok(Claim::Fresh);
        }
        let stored: Option<String> = redis::cmd("GET")
            .arg(&redis_key)
            .query_async(&mut conn)
            .await?;
        let record = stored
            .as_deref()
            .and_then(|s| serde_json::from_str::<Record>(s).ok());
        match record {
            // Expired between SET and GET: the first request gave up; let the caller retry.
            None => Err(ApiError::RequestInProgress),
            Some(Record::Pending { product_id: first })
            | Some(Record::Done {
                product_id: first, ..
            }) if first != product_id => Err(ApiError::IdempotencyKeyReused),
            Some(Record::Pending { .. }) => Err(ApiError::RequestInProgress),
            Some(Record::Done { status, body, .. }) => Ok(Claim::Replay {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
                body,
            }),
        }
    }

    /// Stores the answer to replay for the key.
    pub async fn complete(
        &self,
        user_id: i64,
        key: &str,
        product_id: i64,
        status: StatusCode,
        body: &str,
    ) -> Result<(), ApiError> {
        let record = serde_json::to_string(&Record::Done {
            product_id,
            status: status.as_u16(),
            body: body.to_string(),
        })
        .map_err(anyhow::Error::from)?;
        let mut conn = self.redis.get().await?;
        redis::cmd("SET")
            .arg(self.keys.idempotency(user_id, key))
            .arg(record)
            .arg("PX")
            .arg(ANSWER_TTL.as_millis() as u64)
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }

    /// Forgets a claim whose request failed transiently, so a retry runs again.
    pub async fn release(&self, user_id: i64, key: &str) -> Result<(), ApiError> {
        let mut conn = self.redis.get().await?;
        redis::cmd("DEL")
            .arg(self.keys.idempotency(user_id, key))
            .query_async::<()>(&mut conn)
            .await?;
        Ok(())
    }
}
