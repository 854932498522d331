//! The sweep of a buyer whose home bucket is dry: reserve the buyer's marker, take a unit from
//! whichever bucket has one, close the reservation (see `seckill_store::ledger`'s "The
//! purchase" for why no buyer hears `sold_out` while a bucket holds stock).

use std::time::Instant;

use seckill_store::ledger::{LedgerError, Purchase, Reservation, ReservationEnd, TakeAnswer};
use seckill_store::reopened;

use super::engine::{StockEngine, record_lua};
use super::purchase::{Decision, Intent, PurchaseRequest, payload};
use super::window::expire_at_ms;
use crate::catalog::Product;
use crate::error::ApiError;
#[cfg(feature = "failpoints")]
use crate::failpoints::redis_lost;

/// What one sweep step found in a bucket ([`TakeAnswer`], except that the outbox entry of a
/// unit taken is unknown when a lost answer was recovered from the takers hash).
enum Took {
    Unit(Option<String>),
    Dry,
    NotActive,
    NotLoaded,
    PastFence,
}

impl StockEngine {
    /// The home bucket is dry: look for a unit in every bucket.
    pub(super) async fn sweep(
        &self,
        req: &PurchaseRequest<'_>,
        home: u16,
    ) -> Result<Decision, ApiError> {
        let product = req.product;
        let id = product.id;
        let mut conn = self.redis.get().await?;
        let (sold_out, generation) = self.ledger.sale_state(&mut conn, id).await?;
        if sold_out {
            metrics::counter!("seckill_sold_out_flag_hits_total", "flag" => "redis").increment(1);
            return Ok(Decision::SoldOut {
                flag: Some(reopened::generation(&generation)),
            });
        }
        metrics::counter!("seckill_bucket_sweeps_total").increment(1);
        let started = Instant::now();
        let request_id = req.request_id.to_string();
        let reserved = self
            .ledger
            .reserve(&mut conn, id, home, req.user_id, &request_id)
            .await?;
        drop(conn);
        record_lua("reserve", started);
        seckill_http::failpoint!("sweep::after_reserve", Err(redis_lost()));
        let Some(reservation) = reserved else {
            return Ok(Decision::AlreadyPurchased);
        };
        let buckets = product.buckets();
        let start = rand::random_range(0..buckets);
        // A bucket that cannot be loaded now (Redis lost it: see [`super::fence`]) is passed
        // over, so the others still sell; but then "every bucket was dry" proves nothing.
        let mut unknown: Option<ApiError> = None;
        for step in 0..buckets {
            let bucket = (start + step) % buckets;
            let payload = payload(req, bucket)?;
            let purchase = Purchase {
                user_id: req.user_id,
                request_id: &request_id,
                payload: &payload,
                http_request_id: req.http_request_id,
                traceparent: req.traceparent,
                tracestate: req.tracestate,
            };
            let mut took = self.take(id, bucket, &purchase, &reservation).await;
            if matches!(took, Ok(Took::NotLoaded)) {
                // A load that died half-way left this bucket out: finish it, then retry.
                if let Err(e) = self.ensure_loaded(product).await {
                    unknown = Some(e);
                    continue;
                }
                took = self.take(id, bucket, &purchase, &reservation).await;
            }
            match took {
                Ok(Took::Unit(entry_id)) => {
                    metrics::counter!("seckill_bucket_takes_total").increment(1);
                    seckill_http::failpoint!("sweep::after_take", Err(redis_lost()));
                    let end = ReservationEnd::Took {
                        bucket,
                        request_id: &request_id,
                    };
                    if let Err(e) = self.close(id, home, req.user_id, &reservation, end).await {
                        // The unit and its outbox entry stand; the reservation is resolved
                        // later from the takers hash.
                        tracing::warn!(error = %e, "could not close a sweep's reservation");
                    }
                    let intent = entry_id.map(|entry_id| Intent { entry_id, payload });
                    return Ok(Decision::Accepted { bucket, intent });
                }
                Ok(Took::Dry) => {}
                Ok(Took::NotActive) => {
                    self.close(id, home, req.user_id, &reservation, ReservationEnd::Empty)
                        .await?;
                    return Ok(Decision::NotActive);
                }
                Ok(Took::PastFence) => {
                    self.close(id, home, req.user_id, &reservation, ReservationEnd::Empty)
                        .await?;
                    return Err(ApiError::Unavailable("purchase took too long".into()));
                }
                Ok(Took::NotLoaded) => {
                    return Err(ApiError::Internal(anyhow::anyhow!(
                        "take script returned -3"
                    )));
                }
                // The take may or may not have run: keep the reservation, which a later
                // purchase resolves once it is past the fence.
                Err(e) => return Err(e),
            }
        }
        self.close(id, home, req.user_id, &reservation, ReservationEnd::Empty)
            .await?;
        if let Some(e) = unknown {
            return Err(e);
        }
        let flagged = self.raise_sold_out(product, &generation).await?;
        Ok(Decision::SoldOut {
            flag: flagged.then(|| reopened::generation(&generation)),
        })
    }

    /// One sweep step on `bucket`.
    async fn take(
        &self,
        product_id: i64,
        bucket: u16,
        purchase: &Purchase<'_>,
        reservation: &Reservation,
    ) -> Result<Took, ApiError> {
        let started = Instant::now();
        let mut conn = self.writer().await?;
        let answered = self
            .ledger
            .take(
                &mut conn,
                product_id,
                bucket,
                purchase,
                reservation,
                self.timings.sweep_fence,
            )
            .await;
        if matches!(answered, Ok(TakeAnswer::Taken(_))) {
            self.await_copies(&mut conn, product_id, bucket).await;
        }
        drop(conn);
        match answered {
            Ok(answer) => {
                record_lua("take", started);
                Ok(match answer {
                    TakeAnswer::Taken(entry_id) => Took::Unit(Some(entry_id)),
                    TakeAnswer::Dry => Took::Dry,
                    TakeAnswer::NotActive => Took::NotActive,
                    TakeAnswer::NotLoaded => Took::NotLoaded,
                    TakeAnswer::PastFence => Took::PastFence,
                })
            }
            Err(LedgerError::Redis(e)) => {
                if self
                    .taken_under(product_id, bucket, purchase.user_id, reservation)
                    .await
                    .as_deref()
                    == Some(purchase.request_id)
                {
                    tracing::warn!(error = %e, "take script answer lost, but it ran");
                    return Ok(Took::Unit(None));
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The purchase `bucket` gave a unit to under `reservation` (`None` also when Redis
    /// cannot tell).
    async fn taken_under(
        &self,
        product_id: i64,
        bucket: u16,
        user_id: i64,
        reservation: &Reservation,
    ) -> Option<String> {
        let mut conn = self.redis.get().await.ok()?;
        self.ledger
            .taken_under(&mut conn, product_id, bucket, user_id, reservation)
            .await
            .unwrap_or(None)
    }

    /// Closes the buyer's reservation in `home`; false when it was no longer there.
    pub(super) async fn close(
        &self,
        product_id: i64,
        home: u16,
        user_id: i64,
        reservation: &Reservation,
        end: ReservationEnd<'_>,
    ) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        Ok(self
            .ledger
            .close_reservation(&mut conn, product_id, home, user_id, reservation, end)
            .await?)
    }

    /// Raises the sold-out flag unless a unit went back on sale since `generation` was read;
    /// whether it is up.
    async fn raise_sold_out(&self, product: &Product, generation: &str) -> Result<bool, ApiError> {
        let mut conn = self.redis.get().await?;
        let raised = self
            .ledger
            .raise_sold_out(&mut conn, product.id, generation, expire_at_ms(product))
            .await?;
        if raised {
            tracing::info!(product_id = product.id, "product sold out");
            metrics::counter!("seckill_sold_out_flags_raised_total").increment(1);
        }
        Ok(raised)
    }
}
