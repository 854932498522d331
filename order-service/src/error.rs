//! The one error type of order-service's HTTP handlers, mapped to the JSON error contract
//! (`{"code", "message"}`, DESIGN.md §2).
//!
//! A failed call to Postgres or Redis is sorted by what a retry would meet, as seckill-api
//! sorts it (`seckill_store::StoreFailure`, which both backends share):
//! - a dependency that cannot be reached right now, or a statement that lost a race (a lock
//!   not granted in time, a deadlock) — and a redrive the broker refused or failed — is
//!   `503 unavailable` with `Retry-After`: a retry may well succeed;
//! - anything else — a query Postgres rejects, a row that does not decode, a handler's task
//!   that panicked — is a bug or a broken invariant, `500 internal`, which a retry would meet
//!   again.
//!
//! Either way the cause stays typed in the error (its `source`) and is logged once, with its
//! chain, when the error is answered; the client sees only the code and a fixed message.

use axum::http::header::RETRY_AFTER;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use seckill_http::error_response;
use seckill_store::StoreFailure;

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
    /// 503 `unavailable` (+`Retry-After`): the broker refused or failed a redrive's publish;
    /// `done` entries were redriven (and audited) before it.
    #[error("redrive stopped after {done} entries: {reason}")]
    RedriveStopped {
        /// Entries redriven before the failure.
        done: usize,
        /// What went wrong.
        reason: String,
    },
    /// 503 `unavailable` (+`Retry-After`): a dependency cannot be reached right now (see the
    /// module docs); retry soon.
    #[error("{dependency} unavailable")]
    DependencyDown {
        /// `postgres` or `redis`.
        dependency: &'static str,
        /// What its client reported.
        #[source]
        source: anyhow::Error,
    },
    /// 500 `internal`: a bug, a broken invariant or an unexpected dependency answer; logged,
    /// never shown.
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

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        StoreFailure::from(e).into()
    }
}

/// A handler's task panicked or was cancelled: a bug.
impl From<tokio::task::JoinError> for ApiError {
    fn from(e: tokio::task::JoinError) -> Self {
        Self::Internal(anyhow::Error::new(e).context("handler task"))
    }
}

impl From<ChangeError> for ApiError {
    fn from(e: ChangeError) -> Self {
        match e {
            ChangeError::NotFound => Self::OrderNotFound,
            ChangeError::Conflict { code, message } => Self::Conflict { code, message },
            ChangeError::Database(e) => e.into(),
        }
    }
}

impl From<ParkingError> for ApiError {
    fn from(e: ParkingError) -> Self {
        match e {
            ParkingError::Unbounded | ParkingError::Invalid(_) => {
                Self::InvalidRequest(e.to_string())
            }
            ParkingError::Database(e) => e.into(),
            ParkingError::Publish { done, reason } => Self::RedriveStopped { done, reason },
        }
    }
}

impl ApiError {
    /// Status, stable code and client-facing message. Causes of 5xx stay in the logs.
    fn parts(&self) -> (StatusCode, &'static str, &str) {
        match self {
            Self::InvalidRequest(message) => (StatusCode::BAD_REQUEST, "invalid_request", message),
            Self::OrderNotFound => (StatusCode::NOT_FOUND, "order_not_found", "no such order"),
            Self::Conflict { code, message } => (StatusCode::CONFLICT, code, message),
            Self::RedriveStopped { .. } | Self::DependencyDown { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "temporarily unavailable, retry shortly",
            ),
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
        match &self {
            Self::RedriveStopped { .. } => tracing::warn!(error = %self, "answering 503"),
            Self::DependencyDown { dependency, source } => {
                tracing::warn!(dependency, error = format!("{source:#}"), "answering 503")
            }
            Self::Internal(cause) => tracing::error!(error = ?cause, "internal error"),
            _ => {}
        }
        let (status, code, message) = self.parts();
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
    async fn a_database_that_cannot_be_reached_answers_a_generic_503_without_its_cause() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "secret cause");
        let (status, retry_after, body) = answer(sqlx::Error::Io(refused).into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(retry_after, Some(HeaderValue::from_static("1")));
        assert!(body.contains("\"unavailable\""), "{body}");
        assert!(
            !body.contains("secret") && !body.contains("postgres"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn a_database_answer_that_is_wrong_answers_a_generic_500_without_retry_after() {
        let (status, retry_after, body) =
            answer(sqlx::Error::ColumnNotFound("secret_column".into()).into()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry_after, None);
        assert!(body.contains("\"internal\""), "{body}");
        assert!(
            !body.contains("secret") && !body.contains("postgres"),
            "{body}"
        );
    }

    #[tokio::test]
    async fn an_error_reply_from_redis_answers_500_and_a_redis_that_cannot_be_reached_503() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let (status, _, _) = answer(redis::RedisError::from(refused).into()).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        let wrong = redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "secret"));
        let (status, retry_after, body) = answer(wrong.into()).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(retry_after, None);
        assert!(!body.contains("secret"), "{body}");
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
