//! The errors this crate's failpoints return (`seckill_http::failpoint!`,
//! `docs/failpoints.md`): what the step's next call gives when its store has gone away.

use std::io::{Error, ErrorKind};

/// A Redis call whose connection was reset, as the caller's error type.
pub(crate) fn redis_lost<E: From<redis::RedisError>>() -> E {
    redis::RedisError::from(reset()).into()
}

/// A Postgres call whose connection was reset, as the caller's error type.
pub(crate) fn postgres_lost<E: From<sqlx::Error>>() -> E {
    sqlx::Error::Io(reset()).into()
}

fn reset() -> Error {
    Error::new(ErrorKind::ConnectionReset, "connection reset (failpoint)")
}
