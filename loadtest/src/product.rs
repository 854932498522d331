//! Putting a product on sale through the admin API.

use anyhow::Context;
use chrono::{SecondsFormat, Utc};
use reqwest::{Client, StatusCode, header::AUTHORIZATION};
use serde::Deserialize;
use serde_json::json;

use seckill_auth::TokenMinter;

/// The admin user the load tester acts as.
const ADMIN_USER_ID: i64 = 1;

/// The part of the 201 body the load tester needs.
#[derive(Deserialize)]
struct Created {
    id: i64,
}

/// Creates a product whose sale opened 5 s ago and closes in an hour, so the burst meets an
/// active window without waiting for it; returns its id.
pub async fn create(
    client: &Client,
    gateway_url: &str,
    minter: &TokenMinter,
    stock: i32,
    price_cents: i64,
) -> anyhow::Result<i64> {
    let opened = chrono::Duration::seconds(-5);
    create_queued(
        client,
        gateway_url,
        minter,
        stock,
        price_cents,
        opened,
        "open",
    )
    .await
}

/// Creates a product whose sale starts `start_in` from now (negative: already open) and
/// closes an hour after, with its waiting room in `mode` (`open`, `fifo`); returns its id.
pub async fn create_queued(
    client: &Client,
    gateway_url: &str,
    minter: &TokenMinter,
    stock: i32,
    price_cents: i64,
    start_in: chrono::Duration,
    mode: &str,
) -> anyhow::Result<i64> {
    let now = Utc::now();
    let token = minter.mint(ADMIN_USER_ID, &["admin"], 3600);
    let start = now + start_in;
    let mut body = json!({
        "name": format!("loadtest {}", now.to_rfc3339_opts(SecondsFormat::Millis, true)),
        "price_cents": price_cents,
        "stock": stock,
        "start_at": start.to_rfc3339_opts(SecondsFormat::Millis, true),
        "end_at": (start + chrono::Duration::hours(1)).to_rfc3339_opts(SecondsFormat::Millis, true),
    });
    if mode != "open" {
        body["waiting_room"] = json!(mode);
    }
    let url = format!("{}/admin/products", gateway_url.trim_end_matches('/'));
    let response = client
        .post(&url)
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .json(&body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .with_context(|| format!("reading the answer of POST {url}"))?;
    if status != StatusCode::CREATED {
        anyhow::bail!("POST {url} answered {status}: {text}");
    }
    let created: Created = serde_json::from_str(&text)
        .with_context(|| format!("POST {url} answered 201 without an id: {text}"))?;
    Ok(created.id)
}
