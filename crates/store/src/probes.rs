//! `/readyz` probes for the stores every service uses.

use std::sync::Arc;

use seckill_http::ops::Probe;

/// Passes when Postgres answers `SELECT 1`.
pub fn postgres(db: sqlx::PgPool) -> Probe {
    Arc::new(move || {
        let db = db.clone();
        Box::pin(async move {
            sqlx::query("SELECT 1")
                .execute(&db)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}

/// Passes when Redis answers `PING`.
pub fn redis(redis: crate::Redis) -> Probe {
    Arc::new(move || {
        let redis = redis.clone();
        Box::pin(async move {
            let mut conn = redis.get().await.map_err(|e| e.to_string())?;
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    })
}
