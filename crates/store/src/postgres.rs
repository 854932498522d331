//! Postgres connection set-up: create the configured database, connect with retry, migrate.

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
