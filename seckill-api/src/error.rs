//! The one error type of seckill-api's handlers, mapped to the JSON error contract.
//!
//! A failed call to Postgres or Redis is sorted by what a retry would meet
//! (`seckill_store::StoreFailure`, which both backends share):
//! - a dependency that cannot be reached right now — a connection refused, reset or timed
//!   out, a pool with no connection to give, a Redis Cluster without a master for the slot, a
//!   Redis still loading its data, a transaction that lost a race — is `503 unavailable`
//!   with `Retry-After`: a retry may well succeed;
//! - anything else — a query Postgres rejects, a row that does not decode, a script's error
//!   reply — is a bug or a broken invariant, `500 internal`, which a retry would meet again.
//!
//! Either way the cause stays typed in the error (its `source`) and is logged once, with its
//! chain, when the error is answered; the client sees only the code and a fixed message.

use axum::http::StatusCode;
use axum::http::header::RETRY_AFTER;
use axum::response::{IntoResponse, Response};

use seckill_http::error_response;
use seckill_store::StoreFailure;

/// A product's sold-out flag, as it stood when a purchase was refused: the generation under
/// which it went up. Any unit put back on sale bumps the generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoldOutFlag {
    /// The product.
    pub product_id: i64,
    /// Its generation when the flag went up.
    pub generation: u64,
}

/// Everything a handler can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: the request is malformed.
    #[error("{0}")]
    InvalidRequest(String),
    /// 404: no such product.
    #[error("product not found")]
    ProductNotFound,
    /// 409: this user already holds a unit of this product.
    #[error("already purchased")]
    AlreadyPurchased,
    /// 409: the first request with this `Idempotency-Key` has not finished yet.
    #[error("request in progress")]
    RequestInProgress,
    /// 410: nothing left; with the flag that says so, when one does (its header tells
    /// the gateway).
    #[error("sold out")]
    SoldOut(Option<SoldOutFlag>),
    /// 422: outside the product's sale window.
    #[error("the sale is not active")]
    ActivityNotActive,
    /// 422: the `Idempotency-Key` was first used for another product.
    #[error("idempotency key reused")]
    IdempotencyKeyReused,
    /// 428: the product has a waiting room, and the purchase did not come through the pass
    /// it hands out (the gateway's admission).
    #[error("admission required")]
    AdmissionRequired {
        /// The product, whose room the message names.
        product_id: i64,
    },
    /// 503: Redis lost this product's ledger; selling resumes once everything in flight has
    /// landed and the ledger is rebuilt from Postgres (see `crate::stock::fence`).
    #[error("ledger being rebuilt: {0}")]
    LedgerRebuilding(String),
    /// 503: a stock load is still in progress, or a purchase could not be decided in time;
    /// retry soon.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// 503: a dependency cannot be reached right now (see the module docs); retry soon.
    #[error("{dependency} unavailable")]
    DependencyDown {
        /// `postgres` or `redis`.
        dependency: &'static str,
        /// What its client reported.
        #[source]
        source: anyhow::Error,
    },
    /// 500: a bug, a broken invariant or an unexpected dependency answer; logged, never
    /// shown.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<StoreFailure> for ApiError {
    fn from(failure: StoreFailure) -> Self {
        match failure {
            StoreFailure::Down { dependency, source } => {
                Self::DependencyDown { dependency, source }
            }
            StoreFailure::Bug(cause) => Self::Internal(cause),
        }
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        StoreFailure::from(e).into()
    }
}

/// The catalog's cache hands every waiter of one load the same error.
impl From<std::sync::Arc<sqlx::Error>> for ApiError {
    fn from(e: std::sync::Arc<sqlx::Error>) -> Self {
        StoreFailure::from(e).into()
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        StoreFailure::from(e).into()
    }
}

/// A purchase that waits for copies of its write runs on a dedicated connection
/// (`seckill_store::dedicated`): none free in time is a busy replica, not a Redis down.
impl From<seckill_store::CheckoutError> for ApiError {
    fn from(e: seckill_store::CheckoutError) -> Self {
        match e {
            seckill_store::CheckoutError::Busy => Self::Unavailable(e.to_string()),
            seckill_store::CheckoutError::Redis(e) => e.into(),
        }
    }
}

impl From<seckill_store::ledger::LedgerError> for ApiError {
    fn from(e: seckill_store::ledger::LedgerError) -> Self {
        match e {
            seckill_store::ledger::LedgerError::Redis(e) => e.into(),
            unknown => Self::Internal(anyhow::Error::new(unknown)),
        }
    }
}

impl ApiError {
    /// Status, stable code and client-facing message. Causes of 5xx stay in the logs.
    pub fn parts(&self) -> (StatusCode, &'static str, String) {
        // The one message that names something: the room to join.
        let join;
        let (status, code, message) = match self {
            Self::InvalidRequest(message) => {
                (StatusCode::BAD_REQUEST, "invalid_request", message.as_str())
            }
            Self::ProductNotFound => (
                StatusCode::NOT_FOUND,
                "product_not_found",
                "no such product",
            ),
            Self::AlreadyPurchased => (
                StatusCode::CONFLICT,
                "already_purchased",
                "you already bought this product",
            ),
            Self::RequestInProgress => (
                StatusCode::CONFLICT,
                "request_in_progress",
                "a request with this Idempotency-Key is still being processed",
            ),
            Self::SoldOut(_) => (StatusCode::GONE, "sold_out", "sold out"),
            Self::ActivityNotActive => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "activity_not_active",
                "the sale is not open now",
            ),
            Self::IdempotencyKeyReused => (
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was used for another product",
            ),
            Self::AdmissionRequired { product_id } => {
                join = format!(
                    "this sale has a waiting room: join it at /api/rooms/{product_id}/join"
                );
                (
                    StatusCode::PRECONDITION_REQUIRED,
                    "admission_required",
                    join.as_str(),
                )
            }
            Self::LedgerRebuilding(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ledger_rebuilding",
                "sales of this product are paused while its stock is recounted, retry shortly",
            ),
            Self::Unavailable(_) | Self::DependencyDown { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "temporarily unavailable, retry shortly",
            ),
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            ),
        };
        (status, code, message.to_string())
    }

    /// Whether a retry may answer differently (so an idempotent replay must not pin it).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unavailable(_)
                | Self::DependencyDown { .. }
                | Self::LedgerRebuilding(_)
                | Self::Internal(_)
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Unavailable(cause) | Self::LedgerRebuilding(cause) => {
                tracing::warn!(%cause, "answering 503")
            }
            Self::DependencyDown { dependency, source } => {
                tracing::warn!(dependency, error = format!("{source:#}"), "answering 503")
            }
            Self::Internal(cause) => tracing::error!(error = ?cause, "internal error"),
            _ => {}
        }
        let (status, code, message) = self.parts();
        let mut response = error_response(status, code, message);
        if let Self::SoldOut(Some(flag)) = &self
            && let Ok(value) = axum::http::HeaderValue::from_str(&format!(
                "{} {}",
                flag.product_id, flag.generation
            ))
        {
            response
                .headers_mut()
                .insert(seckill_http::SOLD_OUT_HEADER, value);
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    //! The classification, on errors the real servers give: what a retry may cure is a
    //! `503`, what it would meet again is a `500`.

    use std::time::Duration;

    use sqlx::postgres::PgPoolOptions;

    use super::*;

    /// The local Postgres server's `postgres` database (nothing is created in it).
    fn postgres_url(port: Option<u16>) -> String {
        let server = std::env::var("SECKILL_TEST_POSTGRES")
            .unwrap_or_else(|_| "postgres://postgres:postgres@127.0.0.1:5432".into());
        match port {
            Some(port) => format!("postgres://postgres:postgres@127.0.0.1:{port}/postgres"),
            None => format!("{server}/postgres"),
        }
    }

    fn redis_url() -> String {
        std::env::var("SECKILL_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
    }

    fn status(e: impl Into<ApiError>) -> StatusCode {
        e.into().parts().0
    }

    #[tokio::test]
    async fn a_query_postgres_rejects_is_an_internal_error() {
        let db = PgPoolOptions::new()
            .max_connections(1)
            .connect(&postgres_url(None))
            .await
            .expect("connect to postgres");
        let e = sqlx::query("SELEC 1")
            .execute(&db)
            .await
            .expect_err("a syntax error");
        assert_eq!(status(e), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn a_postgres_nobody_listens_on_is_unavailable() {
        let port = seckill_testkit::free_port();
        let e = PgPoolOptions::new()
            .acquire_timeout(Duration::from_secs(5))
            .connect(&postgres_url(Some(port)))
            .await
            .expect_err("nothing listens there");
        assert_eq!(status(e), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn a_pool_with_no_connection_to_give_is_unavailable() {
        let db = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_millis(200))
            .connect(&postgres_url(None))
            .await
            .expect("connect to postgres");
        let _held = db.acquire().await.expect("the one connection");
        let e = db.acquire().await.expect_err("no second connection");
        assert_eq!(status(e), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn an_error_reply_of_a_script_is_an_internal_error() {
        let redis = seckill_store::Redis::new(&redis_url(), false, 1).expect("redis url");
        let mut conn = redis.get().await.expect("connect to redis");
        let e = redis::cmd("EVAL")
            .arg("return redis.error_reply('ERR broken invariant')")
            .arg(0)
            .query_async::<()>(&mut conn)
            .await
            .expect_err("the script's error");
        assert_eq!(status(e), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[tokio::test]
    async fn a_redis_nobody_listens_on_is_unavailable() {
        let port = seckill_testkit::free_port();
        let redis = seckill_store::Redis::new(&format!("redis://127.0.0.1:{port}"), false, 1)
            .expect("redis url");
        let e = match redis.get().await {
            Err(e) => e,
            Ok(mut conn) => redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .expect_err("nothing listens there"),
        };
        assert_eq!(status(e), StatusCode::SERVICE_UNAVAILABLE);
    }
}
