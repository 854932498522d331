//! The errors this crate's failpoints return (`seckill_http::failpoint!`,
//! `docs/failpoints.md`): what the step's next call gives when its store has gone away.

/// A Postgres call whose connection was reset, as the caller's error type.
pub(crate) fn postgres_lost<E: From<sqlx::Error>>() -> E {
    sqlx::Error::Io(seckill_http::failpoint::connection_reset()).into()
}

/// An AMQP call whose channel went away.
pub(crate) fn channel_lost() -> anyhow::Error {
    anyhow::anyhow!("the channel closed (failpoint)")
}
