//! The lookup order, against a real Postgres and Redis (each test its own database and key
//! prefix), and the validation rules.

use std::sync::Arc;
use std::time::Duration;

use chrono::{Duration as ChronoDuration, Utc};
use seckill_store::Redis;
use seckill_testkit::TestNamespace;
use sqlx::postgres::PgPoolOptions;

use super::*;
use crate::bloom::{BloomSizing, ProductBloom};
use crate::null_cache::NullCache;

/// Nothing listens on port 1: every connection attempt fails at once.
const CLOSED: &str = "127.0.0.1:1";

fn bloom() -> Arc<ProductBloom> {
    Arc::new(
        ProductBloom::new(BloomSizing {
            expected: 1_000,
            fp_rate: 0.001,
        })
        .expect("bloom"),
    )
}

fn catalog(db: PgPool, redis: Redis, ns: &TestNamespace) -> Catalog {
    let missing = NullCache::new(redis, ns.keys(), Duration::from_secs(30));
    Catalog::new(db, bloom(), missing, Duration::from_secs(30))
}

async fn migrated(ns: &TestNamespace) -> PgPool {
    seckill_store::postgres::connect_and_migrate(&ns.database_url, 2, Duration::from_secs(10))
        .await
        .expect("test database")
}

fn real_redis(ns: &TestNamespace) -> Redis {
    Redis::new(&ns.redis_url, ns.redis_cluster, 2).expect("redis")
}

async fn insert_row(db: &PgPool, id: i64) {
    let now = Utc::now();
    sqlx::query(
        "INSERT INTO products (id, name, price_cents, stock_total, stock_remaining, start_at, \
         end_at) VALUES ($1, 'row', 100, 5, 5, $2, $3)",
    )
    .bind(id)
    .bind(now)
    .bind(now + ChronoDuration::hours(1))
    .execute(db)
    .await
    .expect("insert product row");
}

async fn drop_namespace(ns: TestNamespace, catalog: Catalog) {
    catalog.db().close().await;
    let _ = seckill_store::postgres::drop_database(&ns.database_url).await;
}

#[tokio::test]
async fn an_id_the_bloom_never_saw_is_none_without_touching_redis_or_postgres() {
    let ns = TestNamespace::new();
    // Both stores unreachable: any I/O would be an error, not `None`.
    let db = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(200))
        .connect_lazy(&format!("postgres://postgres:postgres@{CLOSED}/none"))
        .expect("lazy pool");
    let redis = Redis::new(&format!("redis://{CLOSED}"), false, 1).expect("redis handle");
    let catalog = catalog(db, redis, &ns);

    assert_eq!(catalog.get(4_242).await.expect("no I/O, no error"), None);
    // The same catalog does reach its stores for an id the filter knows.
    catalog.bloom().insert(4_242);
    assert!(catalog.get(4_242).await.is_err());
}

#[tokio::test]
async fn a_bloom_false_positive_is_remembered_in_redis_and_then_answered_without_postgres() {
    let ns = TestNamespace::new();
    let db = migrated(&ns).await;
    let catalog = catalog(db.clone(), real_redis(&ns), &ns);
    let ghost = 777_001;
    // What a false positive looks like: the filter says maybe, Postgres has no such row.
    catalog.bloom().insert(ghost);

    assert_eq!(catalog.get(ghost).await.expect("lookup"), None);
    let mut redis = ns.redis().await;
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg(ns.keys().missing_product(ghost))
        .query_async(&mut redis)
        .await
        .expect("pttl");
    assert!(
        (1..=36_000).contains(&ttl_ms),
        "null entry must expire within 30 s ±20 %, has {ttl_ms} ms"
    );

    // Now the row exists behind the catalog's back (no listener runs in this test), so a
    // lookup that reached Postgres would find it: `None` proves the null cache answered.
    insert_row(&db, ghost).await;
    catalog.cache.invalidate(&ghost).await;
    assert_eq!(catalog.get(ghost).await.expect("lookup"), None);

    // A change notification (what `reload` handles) clears the entry: the product shows.
    let reloaded = catalog.reload(ghost).await.expect("reload");
    assert_eq!(reloaded.map(|p| p.id), Some(ghost));
    let exists: bool = redis::cmd("EXISTS")
        .arg(ns.keys().missing_product(ghost))
        .query_async(&mut redis)
        .await
        .expect("exists");
    assert!(!exists, "reload must clear the null entry");
    assert_eq!(
        catalog.get(ghost).await.expect("lookup").map(|p| p.id),
        Some(ghost)
    );
    drop_namespace(ns, catalog).await;
}

#[tokio::test]
async fn a_redis_outage_under_the_null_cache_falls_through_to_postgres() {
    let ns = TestNamespace::new();
    let db = migrated(&ns).await;
    let down = Redis::new(&format!("redis://{CLOSED}"), false, 1).expect("redis handle");
    let catalog = catalog(db.clone(), down, &ns);
    insert_row(&db, 31).await;
    catalog.bloom().insert(31);
    catalog.bloom().insert(32);

    assert_eq!(
        catalog.get(31).await.expect("found").map(|p| p.id),
        Some(31)
    );
    assert_eq!(catalog.get(32).await.expect("not found, no error"), None);
    drop_namespace(ns, catalog).await;
}

#[tokio::test]
async fn an_update_is_checked_against_the_stored_window_and_replaces_the_cached_copy() {
    let ns = TestNamespace::new();
    let db = migrated(&ns).await;
    let catalog = catalog(db.clone(), real_redis(&ns), &ns);
    insert_row(&db, 5).await;
    catalog.bloom().insert(5);
    let before = catalog.get(5).await.expect("lookup").expect("product");

    // Only a start after the stored end: refused, nothing stored.
    let late_start = ProductChanges {
        start_at: Some(before.end_at + ChronoDuration::minutes(1)),
        ..ProductChanges::default()
    };
    assert!(matches!(
        catalog.update(5, &late_start).await.expect("update"),
        Edit::Rejected(_)
    ));
    let renamed = ProductChanges {
        name: Some("  renamed ".into()),
        ..ProductChanges::default()
    };
    assert_eq!(
        catalog.update(404, &renamed).await.expect("update"),
        Edit::NotFound
    );
    let Edit::Applied(after) = catalog.update(5, &renamed).await.expect("update") else {
        panic!("rename refused");
    };
    assert_eq!(after.name, "renamed");
    assert_eq!(after.start_at, before.start_at);
    assert_eq!(catalog.get(5).await.expect("lookup"), Some(after));
    drop_namespace(ns, catalog).await;
}

#[test]
fn changes_must_name_something_valid() {
    let now = Utc::now();
    assert!(ProductChanges::default().validate().is_err());
    let bad = [
        ProductChanges {
            name: Some("   ".into()),
            ..ProductChanges::default()
        },
        ProductChanges {
            price_cents: Some(-1),
            ..ProductChanges::default()
        },
        ProductChanges {
            start_at: Some(now),
            end_at: Some(now),
            ..ProductChanges::default()
        },
    ];
    for changes in bad {
        assert!(changes.validate().is_err(), "{changes:?}");
    }
    let window = ProductChanges {
        end_at: Some(now),
        ..ProductChanges::default()
    };
    assert!(window.validate().is_ok());
    let unknown = serde_json::from_str::<ProductChanges>(r#"{"stock": 5}"#);
    assert!(unknown.is_err(), "stock is not editable");
}
