//! Abandoned reservations: a replica died between reserving a buyer's marker and closing the
//! reservation; the buyer's next purchase resolves it (see `seckill_store::ledger`'s
//! "Abandoned reservations").

use seckill_store::ledger::{Reservation, ReservationEnd};

use super::engine::StockEngine;
use super::purchase::PurchaseRequest;
use crate::error::ApiError;

impl StockEngine {
    /// A reservation past the fence: did its sweep take a unit? Closes the reservation
    /// accordingly; returns whether the user holds a unit.
    pub(super) async fn resolve_abandoned(
        &self,
        req: &PurchaseRequest<'_>,
        home: u16,
        reservation: &Reservation,
    ) -> Result<bool, ApiError> {
        let id = req.product.id;
        metrics::counter!("seckill_abandoned_reservations_total").increment(1);
        for bucket in 0..req.product.buckets() {
            let mut conn = self.redis.get().await?;
            let taken = self
                .ledger
                .taken_under(&mut conn, id, bucket, req.user_id, reservation)
                .await?;
            drop(conn);
            if let Some(request_id) = taken {
                let end = ReservationEnd::Took {
                    bucket,
                    request_id: &request_id,
                };
                self.close(id, home, req.user_id, reservation, end).await?;
                tracing::info!(
                    user_id = req.user_id,
                    bucket,
                    "abandoned reservation held a unit"
                );
                return Ok(true);
            }
        }
        self.close(id, home, req.user_id, reservation, ReservationEnd::Empty)
            .await?;
        tracing::info!(user_id = req.user_id, "abandoned reservation released");
        Ok(false)
    }
}
