//! The one error type of seckill-api's handlers, mapped to the JSON error contract.

use axum::http::StatusCode;
use axum::http::header::RETRY_AFTER;
use axum::response::{IntoResponse, Response};

use seckill_http::error_response;

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
    /// 503: Redis lost this product's ledger; selling resumes once everything in flight has
    /// landed and the ledger is rebuilt from Postgres (see `crate::stock::fence`).
    #[error("ledger being rebuilt: {0}")]
    LedgerRebuilding(String),
    /// 503: a dependency is unavailable or a stock load is still in progress; retry soon.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    /// 500: a bug or an unexpected dependency answer; logged, never shown.
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        Self::Unavailable(format!("database: {e}"))
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        Self::Unavailable(format!("redis: {e}"))
    }
}

impl From<seckill_store::ledger::LedgerError> for ApiError {
    fn from(e: seckill_store::ledger::LedgerError) -> Self {
        match e {
            seckill_store::ledger::LedgerError::Redis(e) => e.into(),
            unknown => Self::Internal(anyhow::anyhow!("{unknown}")),
        }
    }
}

impl ApiError {
    /// Status, stable code and client-facing message. Causes of 5xx stay in the logs.
    pub fn parts(&self) -> (StatusCode, &'static str, String) {
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
            Self::LedgerRebuilding(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ledger_rebuilding",
                "sales of this product are paused while its stock is recounted, retry shortly",
            ),
            Self::Unavailable(_) => (
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
            Self::Unavailable(_) | Self::LedgerRebuilding(_) | Self::Internal(_)
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            Self::Unavailable(cause) | Self::LedgerRebuilding(cause) => {
                tracing::warn!(%cause, "answering 503")
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
