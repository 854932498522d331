//! The errors this crate's failpoints return (`seckill_http::failpoint!`,
//! `docs/failpoints.md`): what the step's next call gives when its store has gone away.

use seckill_http::failpoint::connection_reset as reset;

/// A Redis call whose connection was reset, as the caller's error type.
pub(crate) fn redis_lost<E: From<redis::RedisError>>() -> E {
    redis::RedisError::from(reset()).into()
}

/// A Postgres call whose connection was reset, as the caller's error type.
pub(crate) fn postgres_lost<E: From<sqlx::Error>>() -> E {
    sqlx::Error::Io(reset()).into()
}
