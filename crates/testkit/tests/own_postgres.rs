//! A private PostgreSQL server can be stopped and restarted, and keeps what was committed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use seckill_testkit::OwnPostgres;
use sqlx::{Connection, PgConnection};

const NOTE: &str = "still here after a restart";

async fn connect(postgres: &OwnPostgres) -> sqlx::Result<PgConnection> {
    PgConnection::connect(&postgres.url("postgres")).await
}

#[tokio::test]
async fn a_committed_row_survives_stop_and_restart() {
    let clock = Instant::now();
    let postgres = OwnPostgres::start().await;
    let started = clock.elapsed();
    assert_ne!(postgres.port(), 5432, "never the shared server's port");

    let mut connection = connect(&postgres).await.expect("connect");
    sqlx::query("CREATE TABLE survivor (id int PRIMARY KEY, note text NOT NULL)")
        .execute(&mut connection)
        .await
        .expect("create table");
    sqlx::query("INSERT INTO survivor (id, note) VALUES (1, $1)")
        .bind(NOTE)
        .execute(&mut connection)
        .await
        .expect("insert");
    // Left open on purpose: the stop must cope with live sessions.
    let mut open_session = connection;

    let clock = Instant::now();
    postgres.stop().await;
    let stopped = clock.elapsed();
    let refused = tokio::time::timeout(Duration::from_secs(10), connect(&postgres))
        .await
        .expect("a connect to a stopped server fails at once");
    assert!(refused.is_err(), "connected to a stopped server");
    let dead = sqlx::query("SELECT 1").execute(&mut open_session).await;
    assert!(dead.is_err(), "a session survived the stop");
    drop(open_session);

    let clock = Instant::now();
    postgres.restart().await;
    let restarted = clock.elapsed();

    let mut connection = connect(&postgres).await.expect("connect after restart");
    let notes: Vec<(i32, String)> = sqlx::query_as("SELECT id, note FROM survivor")
        .fetch_all(&mut connection)
        .await
        .expect("select after restart");
    assert_eq!(notes, vec![(1, NOTE.to_string())]);
    let _ = connection.close().await;

    eprintln!("own postgres: start {started:.2?}, stop {stopped:.2?}, restart {restarted:.2?}");
}

#[tokio::test]
async fn drop_shuts_the_server_down_and_deletes_its_dir() {
    let postgres = OwnPostgres::start().await;
    let port = postgres.port();
    let url = postgres.url("postgres");
    drop(postgres);
    let refused = tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(&url))
        .await
        .expect("a connect to a dropped server fails at once");
    assert!(refused.is_err(), "the server outlived its OwnPostgres");
    // The dir is under /dev/shm or the temp dir; the other test's may be there too.
    let leftovers: Vec<_> = [PathBuf::from("/dev/shm"), std::env::temp_dir()]
        .into_iter()
        .filter_map(|base| std::fs::read_dir(base).ok())
        .flatten()
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            name.to_string_lossy()
                .starts_with(&format!("seckill-postgres-{}-", std::process::id()))
                && std::fs::read_to_string(entry.path().join("postgres.log"))
                    .is_ok_and(|log| log.contains(&format!("port {port}")))
        })
        .map(|entry| entry.path())
        .collect();
    assert!(leftovers.is_empty(), "dir left behind: {leftovers:?}");
}
