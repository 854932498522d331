//! The attacker with broker access, and the operator who tidies up after them.
//!
//! [`publish`] puts order messages into the sale's exchange as someone who can reach the
//! broker but does not hold the signing key would: unsigned ones and ones signed with
//! another key for buyers of their choosing (the buyers who come after the fault, so a
//! forgery that sold in a buyer's name or locked them out shows in the verdict), forgeries
//! under the request ids of genuine orders, and replays of genuine signed messages. None may
//! write an order, hold a unit, return one, or touch a buyer.
//!
//! [`operate`] then does what an operator would with what got parked: redrives it all (the
//! forgeries are refused again), then ignores it all (nothing may go back on sale).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::Utc;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use reqwest::header::AUTHORIZATION;
use reqwest::{Client, StatusCode};
use serde::Deserialize;
use serde_json::json;
use uuid::Uuid;

use seckill_auth::TokenMinter;
use seckill_messaging::{
    ConfirmedPublisher, HEADER_ATTEMPT, HEADER_REQUEST_ID, OrderMessage, OrderSigner, Topology,
};

use super::stack::Wiring;

/// Forgeries of each kind.
const EACH: usize = 4;
/// The operator's user id on the admin token.
const OPERATOR_ID: i64 = 1;
/// Longest wait for a redriven forgery to be parked again.
const REPARK_PATIENCE: Duration = Duration::from_secs(60);

/// What [`publish`] put into the broker.
#[derive(Debug, Default, Clone)]
pub struct Forgeries {
    /// Request ids no genuine purchase ever had: none may ever become an order.
    pub fresh: Vec<Uuid>,
    /// Forgeries and replays under the request ids of genuine orders.
    pub under_genuine_ids: usize,
}

/// Publishes the forgeries into the sale's exchange, naming buyers from `victims`; the
/// replays and the forgeries under genuine ids take the product's first orders (none if
/// none is written yet).
pub async fn publish(
    wiring: &Wiring,
    product_id: i64,
    victims: &[i64],
) -> anyhow::Result<Forgeries> {
    let connection =
        seckill_messaging::connect(&wiring.amqp_url, "chaos-forger", Duration::from_secs(10))
            .await
            .context("connecting to the broker as the forger")?;
    let publisher = ConfirmedPublisher::open(&connection, Duration::from_secs(10))
        .await
        .context("opening the forger's channel")?;
    let topology = Topology::new(&wiring.namespace);
    let genuine = genuine_orders(&wiring.database_url, product_id).await?;
    let forger = OrderSigner::new("not-the-signing-key");
    let owner = OrderSigner::new(&wiring.order_signing_key);

    let mut forgeries = Forgeries::default();
    let mut victims = victims.iter().copied().cycle();
    let send = async |message: &OrderMessage, signer: Option<&OrderSigner>| {
        let body = serde_json::to_vec(message)?;
        let mut headers = FieldTable::default();
        headers.insert(
            HEADER_REQUEST_ID.into(),
            AMQPValue::LongString(format!("forged-{}", message.request_id).into()),
        );
        headers.insert(HEADER_ATTEMPT.into(), AMQPValue::LongInt(0));
        if let Some(signer) = signer {
            headers.insert(
                seckill_messaging::HEADER_SIGNATURE.into(),
                AMQPValue::LongString(signer.sign(&body).into()),
            );
        }
        let properties = BasicProperties::default()
            .with_message_id(message.request_id.to_string().into())
            .with_content_type("application/json".into())
            .with_headers(headers);
        publisher
            .publish(&topology.exchange, &topology.routing_key, &body, properties)
            .await
            .with_context(|| format!("publishing forgery {}", message.request_id))
    };
    for signer in [None, Some(&forger)] {
        for _ in 0..EACH {
            let message = order(
                Uuid::new_v4(),
                victims.next().unwrap_or(0),
                product_id,
                None,
            );
            send(&message, signer).await?;
            forgeries.fresh.push(message.request_id);
        }
    }
    for &(request_id, user_id, bucket) in genuine.iter().take(EACH) {
        // Someone else's purchase under a genuine id, then the genuine body replayed.
        let stolen = order(request_id, victims.next().unwrap_or(0), product_id, bucket);
        send(&stolen, Some(&forger)).await?;
        send(
            &order(request_id, user_id, product_id, bucket),
            Some(&owner),
        )
        .await?;
        forgeries.under_genuine_ids += 2;
    }
    connection.close(200, "forged".into()).await.ok();
    Ok(forgeries)
}

fn order(request_id: Uuid, user_id: i64, product_id: i64, bucket: Option<u16>) -> OrderMessage {
    OrderMessage {
        request_id,
        user_id,
        product_id,
        price_cents: 1,
        created_at: Utc::now(),
        bucket,
    }
}

/// The product's first few orders: request id, buyer, bucket.
async fn genuine_orders(
    database_url: &str,
    product_id: i64,
) -> anyhow::Result<Vec<(Uuid, i64, Option<u16>)>> {
    let db = sqlx::PgPool::connect(database_url)
        .await
        .context("connecting to the sale's database")?;
    let rows = sqlx::query_as::<_, (Uuid, i64, Option<i16>)>(
        "SELECT request_id, user_id, bucket FROM orders WHERE product_id = $1 ORDER BY id LIMIT $2",
    )
    .bind(product_id)
    .bind(EACH as i64)
    .fetch_all(&db)
    .await
    .context("reading genuine orders")?;
    db.close().await;
    Ok(rows
        .into_iter()
        .map(|(id, user, bucket)| (id, user, bucket.and_then(|b| u16::try_from(b).ok())))
        .collect())
}

/// A parking-lot entry as `GET /admin/dlq` lists it; other fields are ignored.
#[derive(Debug, Deserialize)]
struct Parked {
    event_id: String,
    error_code: String,
}

/// What the operator did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Tidied {
    /// Entries parked when the operator looked.
    pub parked: usize,
    /// Of those, refused for their signature.
    pub refused_for_signature: usize,
    /// Entries ignored at the end.
    pub ignored: usize,
}

/// Redrives every parked entry of the product, waits until none is left `redriven` (each
/// refused again and parked, or written), then ignores every one still parked.
pub async fn operate(
    client: &Client,
    gateway_url: &str,
    minter: &TokenMinter,
    product_id: i64,
) -> anyhow::Result<Tidied> {
    let base = gateway_url.trim_end_matches('/');
    let admin = format!("Bearer {}", minter.mint(OPERATOR_ID, &["admin"], 3600));
    let list = async |status: &str| -> anyhow::Result<Vec<Parked>> {
        let url = format!("{base}/admin/dlq?product_id={product_id}&status={status}&limit=10000");
        let answer = client
            .get(&url)
            .header(AUTHORIZATION, &admin)
            .send()
            .await?;
        if answer.status() != StatusCode::OK {
            bail!("GET {url} answered {}", answer.status());
        }
        Ok(answer.json().await?)
    };
    let act = async |action: &str| -> anyhow::Result<()> {
        let url = format!("{base}/admin/dlq/{action}");
        let answer = client
            .post(&url)
            .header(AUTHORIZATION, &admin)
            .json(&json!({ "product_id": product_id }))
            .send()
            .await?;
        if answer.status() != StatusCode::OK {
            bail!("POST {url} answered {}", answer.status());
        }
        Ok(())
    };
    let parked = list("pending").await?;
    let mut tidied = Tidied {
        parked: parked.len(),
        refused_for_signature: parked
            .iter()
            .filter(|p| matches!(p.error_code.as_str(), "unsigned" | "bad_signature"))
            .count(),
        ignored: 0,
    };
    act("redrive").await?;
    let since = Instant::now();
    while !list("redriven").await?.is_empty() {
        if since.elapsed() > REPARK_PATIENCE {
            bail!("redriven entries still in flight after {REPARK_PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut still = list("pending").await?;
    still.extend(list("quarantined").await?);
    act("ignore").await?;
    tidied.ignored = still.len();
    if let Some(unnamed) = still.iter().find(|p| p.event_id.is_empty()) {
        bail!("a parked entry without an event id: {unnamed:?}");
    }
    Ok(tidied)
}
