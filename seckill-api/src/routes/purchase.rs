//! `POST /api/seckill/{product_id}` and its result.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use serde::Serialize;
use uuid::Uuid;

use seckill_auth::Identity;
use seckill_http::PathId;
use seckill_messaging::OrderMessage;
use seckill_store::PurchaseResult;

use crate::error::ApiError;
use crate::state::AppState;
use crate::stock::{Decision, PurchaseRequest};

/// The 202 body.
#[derive(Debug, Serialize)]
pub struct Accepted {
    request_id: Uuid,
    status: &'static str,
}

/// Decides a purchase: window, sold-out flag, then the atomic Redis step.
#[tracing::instrument(skip_all, fields(product_id = product_id, user_id = identity.user_id))]
pub async fn purchase(
    State(state): State<AppState>,
    identity: Identity,
    PathId(product_id): PathId,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<Accepted>), ApiError> {
    let outcome = decide(&state, &identity, product_id, &headers).await;
    let label = match &outcome {
        Ok(_) => "accepted",
        Err(ApiError::SoldOut) => "sold_out",
        Err(ApiError::AlreadyPurchased) => "already_purchased",
        Err(ApiError::ActivityNotActive) => "not_active",
        Err(ApiError::ProductNotFound) => "not_found",
        Err(_) => "error",
    };
    metrics::counter!("seckill_purchases_total", "outcome" => label).increment(1);
    let request_id = outcome?;
    state.relay_wakeup.notify_one();
    Ok((
        StatusCode::ACCEPTED,
        Json(Accepted {
            request_id,
            status: "queued",
        }),
    ))
}

async fn decide(
    state: &AppState,
    identity: &Identity,
    product_id: i64,
    headers: &HeaderMap,
) -> Result<Uuid, ApiError> {
    let product = state
        .catalog
        .get(product_id)
        .await?
        .ok_or(ApiError::ProductNotFound)?;
    let now = chrono::Utc::now();
    if !product.is_active(now) {
        return Err(ApiError::ActivityNotActive);
    }
    if state.sold_out.contains_key(&product_id) {
        return Err(ApiError::SoldOut);
    }
    let request_id = Uuid::now_v7();
    let message = OrderMessage {
        request_id,
        user_id: identity.user_id,
        product_id,
        price_cents: product.price_cents,
        created_at: now,
    };
    let payload = serde_json::to_string(&message).map_err(anyhow::Error::from)?;
    let http_request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let decision = state
        .stock
        .purchase(&PurchaseRequest {
            product: &product,
            user_id: identity.user_id,
            request_id,
            payload: &payload,
            http_request_id,
        })
        .await?;
    match decision {
        Decision::Accepted => Ok(request_id),
        Decision::AlreadyPurchased => Err(ApiError::AlreadyPurchased),
        Decision::NotActive => Err(ApiError::ActivityNotActive),
        Decision::SoldOut => {
            state.sold_out.insert(product_id, ()).await;
            Err(ApiError::SoldOut)
        }
    }
}

/// The result body: `status` is none, queued, success or failed.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub struct ResultBody {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// Where the caller's purchase of this product stands.
#[tracing::instrument(skip_all, fields(product_id = product_id, user_id = identity.user_id))]
pub async fn result(
    State(state): State<AppState>,
    identity: Identity,
    PathId(product_id): PathId,
) -> Result<Json<ResultBody>, ApiError> {
    state
        .catalog
        .get(product_id)
        .await?
        .ok_or(ApiError::ProductNotFound)?;
    let mut conn = state.redis.get().await?;
    let stored: Option<String> = redis::cmd("HGET")
        .arg(state.keys.results(product_id))
        .arg(identity.user_id)
        .query_async(&mut conn)
        .await?;
    let body = match stored.as_deref().and_then(PurchaseResult::decode) {
        None => ResultBody {
            status: "none",
            request_id: None,
            order_id: None,
            reason: None,
        },
        Some(PurchaseResult::Queued { request_id }) => ResultBody {
            status: "queued",
            request_id: Some(request_id),
            order_id: None,
            reason: None,
        },
        Some(PurchaseResult::Success { order_id }) => ResultBody {
            status: "success",
            request_id: None,
            order_id: Some(order_id),
            reason: None,
        },
        Some(PurchaseResult::Failed { reason }) => ResultBody {
            status: "failed",
            request_id: None,
            order_id: None,
            reason: Some(reason),
        },
    };
    Ok(Json(body))
}
