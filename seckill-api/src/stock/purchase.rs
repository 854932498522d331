//! The purchase: one step on the buyer's home bucket, the whole hot path; a dry home bucket
//! sweeps the others (see `seckill_store::ledger`'s "The purchase").

use std::time::Instant;

use uuid::Uuid;

use seckill_messaging::OrderMessage;
use seckill_store::home_bucket;
use seckill_store::ledger::{HomeAnswer, LedgerError, Reservation};

use super::engine::{StockEngine, record_lua};
use crate::catalog::Product;
use crate::error::ApiError;

/// How one purchase attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A unit was reserved and the order intent is in the outbox of `bucket`.
    Accepted {
        /// The bucket whose outbox holds the order intent.
        bucket: u16,
        /// The intent as written, unless the script's answer was lost (it ran, but which
        /// entry it wrote is unknown: the relay publishes it).
        intent: Option<Intent>,
    },
    /// No units left.
    SoldOut {
        /// The product's sold-out flag is up in Redis, under this generation, so a replica
        /// may remember it for a moment. `None` when a unit went back on sale during the
        /// sweep (the flag refused).
        flag: Option<u64>,
    },
    /// This user already holds a unit.
    AlreadyPurchased,
    /// Outside the sale window.
    NotActive,
}

/// An order intent the purchase wrote to an outbox stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The stream entry's id.
    pub entry_id: String,
    /// The order message body.
    pub payload: String,
}

/// One purchase to decide.
#[derive(Debug)]
pub struct PurchaseRequest<'a> {
    /// The product, as the catalog knows it.
    pub product: &'a Product,
    /// The buyer.
    pub user_id: i64,
    /// The purchase id.
    pub request_id: Uuid,
    /// The order message to put in the outbox (its bucket is set where the unit is taken).
    pub message: &'a OrderMessage,
    /// The HTTP request id, kept with the intent for tracing.
    pub http_request_id: &'a str,
    /// The purchase's W3C `traceparent`, kept with the intent ('' for none).
    pub traceparent: &'a str,
    /// Its `tracestate` ('' for none).
    pub tracestate: &'a str,
}

/// What the home bucket said.
enum Home {
    Accepted(Option<Intent>),
    Dry,
    AlreadyPurchased,
    NotActive,
    NotLoaded,
    Abandoned(Reservation),
}

impl StockEngine {
    /// Decides one purchase, loading the product's stock first if Redis does not have it.
    pub async fn purchase(&self, req: &PurchaseRequest<'_>) -> Result<Decision, ApiError> {
        let home = home_bucket(req.user_id, req.product.buckets());
        for _ in 0..4 {
            match self.try_home(req, home).await? {
                Home::Accepted(intent) => {
                    return Ok(Decision::Accepted {
                        bucket: home,
                        intent,
                    });
                }
                Home::AlreadyPurchased => return Ok(Decision::AlreadyPurchased),
                Home::NotActive => return Ok(Decision::NotActive),
                Home::Dry => return self.sweep(req, home).await,
                Home::NotLoaded => self.ensure_loaded(req.product).await?,
                Home::Abandoned(reservation) => {
                    if self.resolve_abandoned(req, home, &reservation).await? {
                        return Ok(Decision::AlreadyPurchased);
                    }
                }
            }
        }
        Err(ApiError::Unavailable("stock did not load".into()))
    }

    async fn try_home(&self, req: &PurchaseRequest<'_>, home: u16) -> Result<Home, ApiError> {
        let id = req.product.id;
        let started = Instant::now();
        let stale = self.timings.sweep_fence + self.timings.skew_margin;
        let payload = payload(req, home)?;
        let request_id = req.request_id.to_string();
        let purchase = seckill_store::ledger::Purchase {
            user_id: req.user_id,
            request_id: &request_id,
            payload: &payload,
            http_request_id: req.http_request_id,
            traceparent: req.traceparent,
            tracestate: req.tracestate,
        };
        let mut conn = self.writer().await?;
        let answered = self
            .ledger
            .purchase(&mut conn, id, home, &purchase, stale)
            .await;
        if matches!(answered, Ok(HomeAnswer::Accepted(_))) {
            self.await_copies(&mut conn, id, home).await;
        }
        // Give the connection back before a load or a check, which need connections of
        // their own: holding one while waiting for another starves the pool in a burst.
        drop(conn);
        let answer = match answered {
            Ok(answer) => answer,
            Err(LedgerError::Redis(e)) => {
                // A timeout or a dropped connection loses the answer, not necessarily the
                // effect: if the script ran, this purchase holds a unit and must get 202.
                if self
                    .bought_at_home(id, home, req.user_id, &request_id)
                    .await
                {
                    tracing::warn!(error = %e, "purchase script answer lost, but it ran");
                    return Ok(Home::Accepted(None));
                }
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        record_lua("purchase", started);
        Ok(match answer {
            HomeAnswer::Accepted(entry_id) => Home::Accepted(Some(Intent { entry_id, payload })),
            HomeAnswer::Dry => Home::Dry,
            HomeAnswer::AlreadyHeld => Home::AlreadyPurchased,
            HomeAnswer::NotActive => Home::NotActive,
            HomeAnswer::NotLoaded => Home::NotLoaded,
            HomeAnswer::Abandoned(reservation) => Home::Abandoned(reservation),
        })
    }

    /// Whether the buyer's marker says this purchase bought at home (false when Redis
    /// cannot tell).
    async fn bought_at_home(
        &self,
        product_id: i64,
        home: u16,
        user_id: i64,
        request_id: &str,
    ) -> bool {
        let Ok(mut conn) = self.redis.get().await else {
            return false;
        };
        self.ledger
            .bought_at_home(&mut conn, product_id, home, user_id, request_id)
            .await
            .unwrap_or(false)
    }
}

/// The order message body for a unit taken from `bucket`.
pub(super) fn payload(req: &PurchaseRequest<'_>, bucket: u16) -> Result<String, ApiError> {
    let message = OrderMessage {
        bucket: Some(bucket),
        ..req.message.clone()
    };
    Ok(serde_json::to_string(&message).map_err(anyhow::Error::from)?)
}
