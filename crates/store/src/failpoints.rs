//! The error this crate's failpoints return (`seckill_http::failpoint!`,
//! `docs/failpoints.md`): what the step's next Redis call gives when Redis has gone away.

/// A Redis call whose connection was reset.
pub(crate) fn redis_lost() -> redis::RedisError {
    seckill_http::failpoint::connection_reset().into()
}
