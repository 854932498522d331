//! A purchase end to end: gateway → seckill-api → outbox → RabbitMQ → order-service → Postgres.

use std::time::Duration;

use serde_json::Value;

use seckill_testkit::eventually;

use crate::helpers::{
    admin_token, assert_error, final_result, spawn_platform, spawn_platform_with, user_token,
};

#[tokio::test]
async fn a_purchase_through_the_gateway_becomes_an_order_the_buyer_can_see() {
    let platform = spawn_platform().await;
    let product = platform.create_product(3, -60).await;
    let buyer = user_token(1001);

    let response = platform.buy(product, &buyer).await;
    assert_eq!(response.status(), 202);
    assert!(response.headers().contains_key("x-request-id"));
    let accepted: Value = response.json().await.expect("json");
    assert_eq!(accepted["status"], "queued");

    let result = eventually(
        "the order's final result",
        Duration::from_secs(30),
        || async {
            let body: Value = platform
                .get(&format!("/api/seckill/{product}/result"), &buyer)
                .await
                .json()
                .await
                .ok()?;
            (body["status"] == "success").then_some(body)
        },
    )
    .await;
    let order_id = result["order_id"].as_i64().expect("order id");

    let order: Value = platform
        .get(&format!("/api/orders/{order_id}"), &buyer)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(order["user_id"], 1001);
    assert_eq!(order["product_id"], product);
    assert_eq!(order["request_id"], accepted["request_id"]);
    platform.shutdown().await;
}

#[tokio::test]
async fn every_unhappy_path_answers_its_contract_status_through_the_gateway() {
    let platform = spawn_platform().await;
    let product = platform.create_product(1, -60).await;
    let not_yet = platform.create_product(5, 3600).await;
    let first = user_token(1);
    let second = user_token(2);

    assert_error(platform.buy("abc", &first).await, 400, "invalid_request").await;
    assert_error(
        platform.buy(987_654, &first).await,
        404,
        "product_not_found",
    )
    .await;
    assert_error(
        platform.buy(not_yet, &first).await,
        422,
        "activity_not_active",
    )
    .await;
    assert_eq!(platform.buy(product, &first).await.status(), 202);
    assert_error(
        platform.buy(product, &first).await,
        409,
        "already_purchased",
    )
    .await;
    assert_error(platform.buy(product, &second).await, 410, "sold_out").await;
    assert_error(
        platform.get("/api/orders/abc", &first).await,
        400,
        "invalid_request",
    )
    .await;
    assert_error(platform.get("/nowhere", &first).await, 404, "not_found").await;
    platform.shutdown().await;
}

#[tokio::test]
async fn a_burst_of_buyers_gets_exactly_the_stock_as_orders() {
    let platform = spawn_platform().await;
    let stock = 25;
    let users = 120;
    let product = platform.create_product(stock, -60).await;
    let tokens: Vec<String> = (1..=users).map(user_token).collect();
    let responses =
        futures_util::future::join_all(tokens.iter().map(|t| platform.buy(product, t))).await;
    let accepted = responses.iter().filter(|r| r.status() == 202).count();
    let sold_out = responses.iter().filter(|r| r.status() == 410).count();
    assert_eq!(accepted, stock as usize);
    assert_eq!(sold_out, users as usize - stock as usize);

    let db = platform.ns.db().await;
    let (orders, buyers): (i64, i64) =
        eventually("orders written", Duration::from_secs(30), || {
            let db = db.clone();
            async move {
                let row: (i64, i64) = sqlx::query_as(
                    "SELECT count(*), count(DISTINCT user_id) FROM orders WHERE product_id = $1",
                )
                .bind(product)
                .fetch_one(&db)
                .await
                .ok()?;
                (row.0 >= i64::from(stock)).then_some(row)
            }
        })
        .await;
    assert_eq!(orders, i64::from(stock));
    assert_eq!(buyers, i64::from(stock));
    let remaining: i32 = sqlx::query_scalar("SELECT stock_remaining FROM products WHERE id = $1")
        .bind(product)
        .fetch_one(&db)
        .await
        .expect("stock");
    assert_eq!(remaining, 0);

    // Once quiet, the reconciliation endpoint accounts for every unit.
    let report: Value = eventually("nothing in flight", Duration::from_secs(30), || async {
        let body: Value = platform
            .get(&format!("/admin/products/{product}/stock"), &admin_token())
            .await
            .json()
            .await
            .ok()?;
        (body["in_flight"] == 0).then_some(body)
    })
    .await;
    assert_eq!(report["orders"], stock);
    assert_eq!(report["redis_remaining"], 0);
    assert_eq!(report["drift"], 0);
    db.close().await;
    platform.shutdown().await;
}

#[tokio::test]
async fn order_service_admin_routes_are_reachable_by_admins_only() {
    let platform = spawn_platform().await;
    let response = platform.get("/admin/orders/breaker", &admin_token()).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["state"], "closed");
    assert_eq!(body["mode"], "auto");
    let response = platform.get("/admin/orders/breaker", &user_token(7)).await;
    assert_error(response, 403, "forbidden").await;
    let response = platform.get("/admin/dlq", &admin_token()).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body, serde_json::json!([]));
    let response = platform.get("/admin/dlq", &user_token(7)).await;
    assert_error(response, 403, "forbidden").await;
    platform.shutdown().await;
}

#[tokio::test]
async fn an_unpaid_order_expires_and_its_unit_is_sold_to_another_buyer() {
    let platform = spawn_platform_with(|s| {
        s.payment_window = Duration::from_secs(2);
        s.compensation_poll = Duration::from_millis(100);
    })
    .await;
    let product = platform.create_product(1, -60).await;
    let (first, second) = (user_token(31), user_token(32));

    assert_eq!(platform.buy(product, &first).await.status(), 202);
    let result = final_result(&platform, product, &first).await;
    assert_eq!(result["status"], "success");
    let order_id = result["order_id"].as_i64().expect("order id");
    assert_error(platform.buy(product, &second).await, 410, "sold_out").await;

    // Unpaid past the window: cancelled, and the first buyer's result says why.
    let order: Value = eventually("the order expires", Duration::from_secs(15), || async {
        let order: Value = platform
            .get(&format!("/api/orders/{order_id}"), &first)
            .await
            .json()
            .await
            .ok()?;
        (order["status"] == "cancelled").then_some(order)
    })
    .await;
    assert_eq!(order["cancel_reason"], "payment_expired");
    // The buyer's result follows once the compensation has returned the unit: a round of
    // its own after the cancel, so it may still say `success` for a moment.
    let result = eventually(
        "the result says the payment expired",
        Duration::from_secs(15),
        || async {
            let result = final_result(&platform, product, &first).await;
            (result["status"] != "success").then_some(result)
        },
    )
    .await;
    assert_eq!(result["status"], "failed");
    assert_eq!(result["reason"], "payment_expired");
    assert_error(
        platform
            .post(&format!("/api/orders/{order_id}/pay"), &first)
            .await,
        409,
        "order_cancelled",
    )
    .await;

    // The unit is on sale again: the second buyer gets it (once the in-memory sold-out
    // flag, which lives half a second, has gone).
    eventually(
        "the unit is on sale again",
        Duration::from_secs(10),
        || async { (platform.buy(product, &second).await.status() == 202).then_some(()) },
    )
    .await;
    let result = final_result(&platform, product, &second).await;
    assert_eq!(result["status"], "success");
    let paid = platform
        .post(&format!("/api/orders/{}/pay", result["order_id"]), &second)
        .await;
    assert_eq!(paid.status(), 200);
    // And nobody else: one unit, one live order.
    assert_error(
        platform.buy(product, &user_token(33)).await,
        410,
        "sold_out",
    )
    .await;
    platform.shutdown().await;
}

#[tokio::test]
async fn a_cancelled_order_frees_its_buyer_to_buy_again() {
    let platform = spawn_platform().await;
    let product = platform.create_product(1, -60).await;
    let buyer = user_token(41);
    assert_eq!(platform.buy(product, &buyer).await.status(), 202);
    let result = final_result(&platform, product, &buyer).await;
    let order_id = result["order_id"].as_i64().expect("order id");
    let cancelled = platform
        .post(&format!("/api/orders/{order_id}/cancel"), &buyer)
        .await;
    assert_eq!(cancelled.status(), 200);
    // The unit goes back through the compensation outbox, a moment after the answer.
    eventually(
        "the result shows the cancellation",
        Duration::from_secs(10),
        || async {
            (final_result(&platform, product, &buyer).await["reason"] == "cancelled").then_some(())
        },
    )
    .await;
    eventually("buying again", Duration::from_secs(10), || async {
        (platform.buy(product, &buyer).await.status() == 202).then_some(())
    })
    .await;
    let result = final_result(&platform, product, &buyer).await;
    assert_eq!(result["status"], "success");
    assert_ne!(result["order_id"], order_id);
    platform.shutdown().await;
}
