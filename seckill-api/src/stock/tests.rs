//! The share arithmetic, and loads meeting compensations (real Redis and Postgres).

use std::time::Duration;

use seckill_store::Redis;
use seckill_testkit::TestNamespace;
use uuid::Uuid;

use super::snapshot::Snapshot;
use super::*;
use crate::catalog::Product;

#[test]
fn shares_add_up_and_never_grow_when_remaining_shrinks() {
    for buckets in [1u16, 2, 3, 7, 16, 64] {
        for remaining in 0..300i64 {
            let total: i64 = (0..buckets).map(|b| share(remaining, buckets, b)).sum();
            assert_eq!(total, remaining, "{remaining} over {buckets}");
            if remaining > 0 {
                for b in 0..buckets {
                    assert!(share(remaining - 1, buckets, b) <= share(remaining, buckets, b));
                }
            }
        }
    }
}

/// One unit on sale in one bucket, sold to `BUYER` (its order written): the engine, the
/// product and the order's id.
async fn one_unit_sold(ns: &TestNamespace) -> (StockEngine, Product, i64) {
    let db =
        seckill_store::postgres::connect_and_migrate(&ns.database_url, 4, Duration::from_secs(10))
            .await
            .expect("database");
    let redis = Redis::new(&ns.redis_url, ns.redis_cluster, 2).expect("redis");
    let now = chrono::Utc::now();
    let product = Product {
        id: 0,
        name: "one unit".into(),
        price_cents: 100,
        stock_total: 1,
        stock_buckets: 1,
        start_at: now - chrono::Duration::minutes(1),
        end_at: now + chrono::Duration::hours(1),
        waiting_room: crate::catalog::WaitingRoom::Open,
    };
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO products (name, price_cents, stock_total, stock_remaining, start_at, end_at) \
         VALUES ($1, $2, 1, 0, $3, $4) RETURNING id",
    )
    .bind(&product.name)
    .bind(product.price_cents)
    .bind(product.start_at)
    .bind(product.end_at)
    .fetch_one(&db)
    .await
    .expect("product");
    let order: i64 = sqlx::query_scalar(
        "INSERT INTO orders (request_id, user_id, product_id, price_cents, accepted_at, bucket) \
         VALUES ($1, $2, $3, 100, now(), 0) RETURNING id",
    )
    .bind(Uuid::now_v7())
    .bind(BUYER)
    .bind(id)
    .fetch_one(&db)
    .await
    .expect("order");
    let timings = Timings {
        lock_ttl: Duration::from_secs(2),
        load_wait: Duration::from_secs(2),
        sweep_fence: Duration::from_secs(2),
        skew_margin: Duration::from_secs(1),
    };
    let engine = StockEngine::new(redis, db, ns.keys(), timings);
    (engine, Product { id, ..product }, order)
}

const BUYER: i64 = 7;

/// Cancels the order in Postgres and relays its compensation to Redis, as order-service does.
async fn cancel_and_compensate(engine: &StockEngine, order: i64) {
    let mut tx = engine.db.begin().await.expect("begin");
    let cancelled =
        order_service::compensation::cancel_orders(&mut tx, &[order], None, "cancelled")
            .await
            .expect("cancel");
    tx.commit().await.expect("commit");
    assert_eq!(cancelled, [order]);
    relay_compensations(engine).await;
}

/// Runs order-service's compensation relay once; exactly one compensation was due.
async fn relay_compensations(engine: &StockEngine) {
    let compensator = order_service::compensation::Compensator {
        db: engine.db.clone(),
        redis: engine.redis.clone(),
        keys: engine.ledger.keys().clone(),
        poll: Duration::from_millis(50),
        batch: 10,
    };
    assert_eq!(compensator.relay_due().await.expect("relay"), 1);
}

#[tokio::test]
async fn a_unit_given_back_before_a_stale_load_writes_its_bucket_is_not_lost() {
    let ns = TestNamespace::new();
    let (engine, product, order) = one_unit_sold(&ns).await;
    // The load reads Postgres while the order is live...
    let snapshot = Snapshot::read(&engine.db, &product)
        .await
        .expect("snapshot");
    // ...the order is cancelled and compensated while the bucket is not loaded yet...
    cancel_and_compensate(&engine, order).await;
    // ...and only then does the load write the bucket, from what it read before.
    assert_eq!(engine.fill(&product, &snapshot).await.expect("fill"), 1);
    assert_eq!(
        engine.remaining(&product).await.expect("remaining"),
        Some(1)
    );
    engine.db.close().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_buyer_released_before_a_stale_load_writes_their_bucket_may_buy_again() {
    let ns = TestNamespace::new();
    let (engine, product, order) = one_unit_sold(&ns).await;
    // The load reads Postgres while the order is live (its buyer holds a unit)...
    let snapshot = Snapshot::read(&engine.db, &product)
        .await
        .expect("snapshot");
    // ...the order is cancelled and its buyer released while the bucket is not loaded...
    cancel_and_compensate(&engine, order).await;
    // ...and only then does the load write the bucket, from what it read before.
    assert_eq!(engine.fill(&product, &snapshot).await.expect("fill"), 1);
    let message = seckill_messaging::OrderMessage {
        request_id: Uuid::now_v7(),
        user_id: BUYER,
        product_id: product.id,
        price_cents: product.price_cents,
        created_at: chrono::Utc::now(),
        bucket: None,
    };
    let again = PurchaseRequest {
        product: &product,
        user_id: BUYER,
        request_id: message.request_id,
        message: &message,
        http_request_id: "",
        traceparent: "",
        tracestate: "",
    };
    let decision = engine.purchase(&again).await.expect("purchase");
    assert!(
        matches!(decision, Decision::Accepted { .. }),
        "the released buyer was answered {decision:?}"
    );
    engine.db.close().await;
    ns.cleanup().await;
}

#[tokio::test]
async fn a_unit_a_load_already_counted_is_not_given_back_again() {
    let ns = TestNamespace::new();
    let (engine, product, order) = one_unit_sold(&ns).await;
    let mut tx = engine.db.begin().await.expect("begin");
    order_service::compensation::cancel_orders(&mut tx, &[order], None, "cancelled")
        .await
        .expect("cancel");
    tx.commit().await.expect("commit");
    // The load sees the cancellation and counts its unit; the compensation comes later.
    engine.load(&product).await.expect("load");
    assert_eq!(
        engine.remaining(&product).await.expect("remaining"),
        Some(1)
    );
    relay_compensations(&engine).await;
    assert_eq!(
        engine.remaining(&product).await.expect("remaining"),
        Some(1)
    );
    engine.db.close().await;
    ns.cleanup().await;
}
