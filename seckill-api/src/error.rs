//! The one error type of seckill-api's handlers, mapped to the JSON error contract.

use axum::http::StatusCode;
use axum::http::header::RETRY_AFTER;
use axum::response::{IntoResponse, Response};

use seckill_http::error_response;

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
    /// 410: nothing left.
    #[error("sold out")]
    SoldOut,
    /// 422: outside the product's sale window.
    #[error("the sale is not active")]
    ActivityNotActive,
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

impl From<deadpool_redis::PoolError> for ApiError {
    fn from(e: deadpool_redis::PoolError) -> Self {
        Self::Unavailable(format!("redis pool: {e}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::InvalidRequest(message) => {
                error_response(StatusCode::BAD_REQUEST, "invalid_request", message)
            }
            Self::ProductNotFound => error_response(
                StatusCode::NOT_FOUND,
                "product_not_found",
                "no such product",
            ),
            Self::AlreadyPurchased => error_response(
                StatusCode::CONFLICT,
                "already_purchased",
                "you already bought this product",
            ),
            Self::SoldOut => error_response(StatusCode::GONE, "sold_out", "sold out"),
            Self::ActivityNotActive => error_response(
                StatusCode::UNPROCESSABLE_ENTITY,
                "activity_not_active",
                "the sale is not open now",
            ),
            Self::Unavailable(cause) => {
                tracing::warn!(%cause, "answering 503");
                let mut response = error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "temporarily unavailable, retry shortly",
                );
                response
                    .headers_mut()
                    .insert(RETRY_AFTER, axum::http::HeaderValue::from_static("1"));
                response
            }
            Self::Internal(cause) => {
                tracing::error!(error = ?cause, "internal error");
                error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error",
                )
            }
        }
    }
}
