//! The one error type of order-service's HTTP handlers, mapped to the JSON error contract
//! (`{"code", "message"}`, DESIGN.md §2). A 5xx answer is generic: its cause is logged here,
//! once, and never sent to the client.

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use seckill_http::error_response;

use crate::orders::ChangeError;
use crate::parking::ParkingError;

/// Everything a handler can answer besides success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid_request`: the request is malformed or its selection names nothing.
    #[error("{0}")]
    InvalidRequest(String),
    /// 404 `order_not_found`: no such order for this user (another user's order is "not
    /// found" too).
    #[error("order not found")]
    OrderNotFound,
    /// 409 `code`: the order's state refuses the change (paid, cancelled, window passed).
    #[error("{message}")]
    Conflict {
        /// snake_case, stable.
        code: &'static str,
        /// For a human.
        message: &'static str,
    },
    /// 503 `unavailable` (+`Retry-After`): Postgres failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// 503 `unavailable` (+`Retry-After`): Redis failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// 503 `unavailable` (+`Retry-After`): the broker refused or failed a redrive's publish;
    /// `done` entries were redriven (and audited) before it.
    #[error("redrive stopped after {done} entries: {reason}")]
    RedriveStopped {
        /// Entries redriven before the failure.
        done: usize,
        /// What went wrong.
        reason: String,
    },
    /// 500 `internal`: a handler's task panicked or was cancelled (a bug).
    #[error("task failed: {0}")]
    Internal(#[from] tokio::task::JoinError),
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::NotFound => Self::OrderNotFound,
            ChangeError::Conflict { code, message } => Self::Conflict { code, message },
            ChangeError::Database(e) => Self::Database(e),
        }
    }
}

impl From<ParkingError> for ApiError {
    fn from(e: ParkingError) -> Self {
        match e {
            ParkingError::Unbounded | ParkingError::Invalid(_) => {
                Self::InvalidRequest(e.to_string())
            }
            ParkingError::Database(e) => Self::Database(e),
            ParkingError::Publish { done, reason } => Self::RedriveStopped { done, reason },
        }
    }
}

impl ApiError {
    /// Status, stable code and client-facing message. Causes of 5xx stay in the logs.
    fn parts(&self) -> (StatusCode, &'static str, &str) {
        const UNAVAILABLE: &str = "temporarily unavailable, retry shortly";
        match self {
            Self::InvalidRequest(message) => (StatusCode::BAD_REQUEST, "invalid_request", message),
            Self::OrderNotFound => (StatusCode::NOT_FOUND, "order_not_found", "no such order"),
            Self::Conflict { code, message } => (StatusCode::CONFLICT, code, message),
            Self::Database(_) | Self::Redis(_) | Self::RedriveStopped { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "unavailable", UNAVAILABLE)
            }
            Self::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            ),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, message) = self.parts();
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "answering 500");
        } else if status.is_server_error() {
            tracing::warn!(error = %self, "answering 503");
        }
        let mut response = error_response(status, code, message);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answer(error: ApiError) -> (StatusCode, Option<HeaderValue>, String) {
        let response = error.into_response();
        let status = response.status();
        let retry_after = response.headers().get(RETRY_AFTER).cloned();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("body");
        (
            status,
            retry_after,
            String::from_utf8(body.to_vec()).expect("utf-8"),
        )
    }

    #[tokio::test]
    async fn a_database_failure_answers_a_generic_503_without_its_cause() {
        let (status, retry_after, body) =
            answer(sqlx::Error::Protocol("secret cause".into()).into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after, Some(HeaderValue::from_static("1")));
        assert!(body.contains("\"unavailable\""), "{body}");
        assert!(
            !body.contains("secret") && !body.contains("database"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_stopped_redrive_answers_a_generic_503_without_its_reason() {
        let stopped = ParkingError::Publish {
            done: 3,
            reason: "secret cause".into(),
        };
        let (status, _, body) = answer(stopped.into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.contains("secret"), "{body}");
    }

    #[tokio::test]
    async fn a_selection_naming_nothing_is_a_400_that_says_why() {
        let (status, retry_after, body) = answer(ParkingError::Unbounded.into()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(retry_after, None);
        assert!(body.contains("\"invalid_request\""), "{body}");
        assert!(
            body.contains(&ParkingError::Unbounded.to_string()),
            "{body}"
        );
    }
}
