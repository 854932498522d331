//! Noting purchases in transit (`seckill_store::transit`) before their copies are out of the
//! ledger fence's sight (`crate::stock::fence`): the handlers' publisher notes a batch still
//! unconfirmed when its first handler stops waiting, the relay each round before it
//! publishes it.

use sqlx::PgPool;

/// Notes purchases in transit (`seckill_store::transit`), counting the outcome in
/// [`crate::metrics::TRANSIT_NOTES`]; false if the note could not be written.
pub async fn note(db: &PgPool, purchases: &[(uuid::Uuid, i64)]) -> bool {
    match seckill_store::transit::note(db, purchases).await {
        Ok(()) => {
            metrics::counter!(crate::metrics::TRANSIT_NOTES, "outcome" => "noted")
                .increment(purchases.len() as u64);
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, count = purchases.len(), "could not note purchases in transit");
            metrics::counter!(crate::metrics::TRANSIT_NOTES, "outcome" => "failed")
                .increment(purchases.len() as u64);
            false
        }
    }
}
