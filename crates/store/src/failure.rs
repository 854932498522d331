//! A failed call to Postgres or Redis, sorted the way every service answers it.
//!
//! What a retry would meet decides ([`postgres::is_transient`],
//! [`redis_handle::is_unavailable`]): a store that cannot serve right now is
//! [`StoreFailure::Down`] — an HTTP handler answers `503 unavailable` with `Retry-After` —
//! and anything else (a query Postgres rejects, a row that does not decode, a script's error
//! reply) is [`StoreFailure::Bug`], `500 internal`. Each service's error type takes it
//! (`From<StoreFailure>`), keeping the cause typed for its one log line.

use std::sync::Arc;

use crate::{postgres, redis_handle};

/// A store call's failure: an outage a retry may get past, or a bug it would meet again.
#[derive(Debug)]
pub enum StoreFailure {
    /// The store cannot serve right now.
    Down {
        /// `postgres` or `redis`.
        dependency: &'static str,
        /// What its client reported.
        source: anyhow::Error,
    },
    /// Anything else: the cause, with the store named as its context.
    Bug(anyhow::Error),
}

impl StoreFailure {
    /// `cause`, a failure of `dependency`: [`Self::Down`] when a retry `may_succeed`, else
    /// [`Self::Bug`].
    pub fn of(
        dependency: &'static str,
        may_succeed: bool,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        if may_succeed {
            Self::Down {
                dependency,
                source: anyhow::Error::new(cause),
            }
        } else {
            Self::Bug(anyhow::Error::new(cause).context(dependency))
        }
    }
}

impl From<sqlx::Error> for StoreFailure {
    fn from(e: sqlx::Error) -> Self {
        Self::of("postgres", postgres::is_transient(&e), e)
    }
}

/// A shared load's waiters all get the same error (seckill-api's catalog cache).
impl From<Arc<sqlx::Error>> for StoreFailure {
    fn from(e: Arc<sqlx::Error>) -> Self {
        Self::of("postgres", postgres::is_transient(&e), e)
    }
}

impl From<redis::RedisError> for StoreFailure {
    fn from(e: redis::RedisError) -> Self {
        Self::of("redis", redis_handle::is_unavailable(&e), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_with_no_connection_is_down_and_a_decoding_error_a_bug() {
        assert!(matches!(
            StoreFailure::from(sqlx::Error::PoolTimedOut),
            StoreFailure::Down {
                dependency: "postgres",
                ..
            }
        ));
        let bug = StoreFailure::from(sqlx::Error::RowNotFound);
        let StoreFailure::Bug(cause) = bug else {
            panic!("a missing row is not an outage: {bug:?}");
        };
        assert_eq!(format!("{cause}"), "postgres");
        assert!(
            format!("{cause:#}").contains("no rows returned"),
            "{cause:#}"
        );
    }
}
