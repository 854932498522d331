//! Postgres connection set-up — create the configured database, connect with retry, migrate —
//! and what a failed statement means: Postgres [unavailable](is_unavailable), a race a retry
//! may win ([`is_transient`]), or a bug a retry would meet again.

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use backon::{ExponentialBuilder, Retryable};
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// Connects to `url`, creating its database first when missing, retrying with backoff for
/// about `patience` while Postgres is still coming up, then applies the migrations.
///
/// Migrations take Postgres' advisory lock, so replicas starting together are safe.
pub async fn connect_and_migrate(
    url: &str,
    max_connections: u32,
    patience: Duration,
) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(url).context("parse database url")?;
    let attempt = || async {
        if !sqlx::Postgres::database_exists(url).await? {
            // Two replicas may race here; the loser's "already exists" is fine.
            if let Err(e) = sqlx::Postgres::create_database(url).await
                && !sqlx::Postgres::database_exists(url).await?
            {
                return Err(e);
            }
        }
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(3))
            .connect_with(options.clone())
            .await
    };
    let pool = attempt
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(3))
                .with_total_delay(Some(patience))
                .without_max_times()
                .with_jitter(),
        )
        .notify(|e, wait| tracing::warn!(error = %e, ?wait, "postgres not ready, retrying"))
        .await
        .context("connect to postgres")?;
    migrator().run(&pool).await.context("run migrations")?;
    Ok(pool)
}

/// The embedded schema migrations.
pub fn migrator() -> sqlx::migrate::Migrator {
    sqlx::migrate!("./migrations")
}

/// Drops the database named in `url` (tests clean up after themselves).
pub async fn drop_database(url: &str) -> anyhow::Result<()> {
    sqlx::Postgres::force_drop_database(url)
        .await
        .context("drop database")
}

/// Whether `e` says Postgres cannot serve right now, rather than that the statement or its
/// answer is wrong: it cannot be reached (refused, reset, timed out, TLS failed), the pool
/// has no connection to give, or the server is shutting down or starting, out of resources,
/// failing its own I/O, or a standby that takes no writes (after a failover). Nothing about
/// the statement is at fault: the same one may succeed once the server is back.
pub fn is_unavailable(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        _ => sqlstate(e).is_some_and(|code| {
            // 08: connection exception; 53: insufficient resources (too many connections,
            // disk full, out of memory); 57P: the server shutting down or starting
            // (admin_shutdown, crash_shutdown, cannot_connect_now, …); 58030: its own I/O
            // error; 25006: a read-only transaction (a standby).
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57P")
                || matches!(&*code, "58030" | "25006")
        }),
    }
}

/// Whether a retry of the same statement may well succeed: Postgres is
/// [unavailable](is_unavailable), or the statement lost a race or ran out of time — a
/// statement timeout (57014), a lock not granted in time (55P03), a serialization failure
/// (40001), a deadlock (40P01). Anything else — a query Postgres rejects, a constraint
/// broken, a row that does not decode — a retry would meet again.
pub fn is_transient(e: &sqlx::Error) -> bool {
    is_unavailable(e)
        || sqlstate(e).is_some_and(|code| matches!(&*code, "57014" | "55P03" | "40001" | "40P01"))
}

/// The SQLSTATE Postgres answered with, if `e` is its answer.
fn sqlstate(e: &sqlx::Error) -> Option<Cow<'_, str>> {
    match e {
        sqlx::Error::Database(db) => db.code(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    //! The classification of the errors sqlx gives, those Postgres answered built with the
    //! SQLSTATE it would send.

    use std::io::ErrorKind;

    use super::*;

    /// An error Postgres answered with SQLSTATE `.0`.
    #[derive(Debug)]
    struct Answered(&'static str);

    impl std::fmt::Display for Answered {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "SQLSTATE {}", self.0)
        }
    }

    impl std::error::Error for Answered {}

    impl sqlx::error::DatabaseError for Answered {
        fn message(&self) -> &str {
            "answered"
        }

        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }

        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }

        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }

        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn answered(code: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Answered(code)))
    }

    fn io(kind: ErrorKind) -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(kind))
    }

    #[test]
    fn a_server_that_cannot_be_reached_or_cannot_serve_is_unavailable() {
        let unavailable = [
            io(ErrorKind::ConnectionRefused),
            io(ErrorKind::ConnectionReset),
            io(ErrorKind::TimedOut),
            io(ErrorKind::UnexpectedEof),
            sqlx::Error::Tls("handshake failed".into()),
            sqlx::Error::PoolTimedOut,
            sqlx::Error::PoolClosed,
            sqlx::Error::WorkerCrashed,
            // connection_failure, sqlclient_unable_to_establish_sqlconnection,
            // connection_does_not_exist
            answered("08006"),
            answered("08001"),
            answered("08003"),
            // too_many_connections, disk_full, out_of_memory
            answered("53300"),
            answered("53100"),
            answered("53200"),
            // admin_shutdown, crash_shutdown, cannot_connect_now
            answered("57P01"),
            answered("57P02"),
            answered("57P03"),
            // io_error, read_only_sql_transaction
            answered("58030"),
            answered("25006"),
        ];
        for e in unavailable {
            assert!(is_unavailable(&e), "{e}");
            assert!(is_transient(&e), "{e}");
        }
    }

    #[test]
    fn a_statement_that_lost_a_race_is_transient_but_postgres_is_not_unavailable() {
        // query_canceled (a statement timeout), lock_not_available, serialization_failure,
        // deadlock_detected
        for code in ["57014", "55P03", "40001", "40P01"] {
            let e = answered(code);
            assert!(is_transient(&e), "{e}");
            assert!(!is_unavailable(&e), "{e}");
        }
    }

    #[test]
    fn a_statement_or_answer_that_is_wrong_is_neither() {
        let wrong = [
            // undefined_column, syntax_error, insufficient_privilege, unique_violation,
            // foreign_key_violation, invalid_text_representation, division_by_zero
            answered("42703"),
            answered("42601"),
            answered("42501"),
            answered("23505"),
            answered("23503"),
            answered("22P02"),
            answered("22012"),
            sqlx::Error::RowNotFound,
            sqlx::Error::ColumnNotFound("price".into()),
            sqlx::Error::Decode("not a number".into()),
            sqlx::Error::Protocol("unexpected message".into()),
        ];
        for e in wrong {
            assert!(!is_transient(&e), "{e}");
            assert!(!is_unavailable(&e), "{e}");
        }
    }
}
