//! `POST /api/seckill/{product_id}` and its result.

use axum::Json;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use seckill_auth::Identity;
use seckill_http::{ErrorBody, PathId, QueryParams};
use seckill_messaging::{OrderMessage, TraceHeaders};
use seckill_store::PurchaseResult;
use seckill_telemetry::request_scope::{self, record_str, step_span};
use tracing::Instrument as _;

use super::AppState;
use crate::error::{ApiError, SoldOutFlag};
#[cfg(feature = "failpoints")]
use crate::failpoints::redis_lost;
use crate::idempotency::{Claim, Idempotency, Ticket};
use crate::publisher::OutboxEntry;
use crate::stock::{Decision, Holding, Intent, PurchaseRequest};

/// The client's idempotency key header.
const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
/// Set on a response that replays an earlier answer.
const IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The 202 body.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Accepted {
    /// The purchase's id: the order it becomes carries it.
    request_id: Uuid,
    /// Always `queued`: the order is written asynchronously (see the result route).
    #[schema(pattern = "^queued$", example = "queued")]
    status: &'static str,
}

/// The purchase's query: what the gateway adds, under its identity signature, so a client
/// cannot set it (DESIGN.md §9).
#[derive(Debug, Default, Deserialize)]
pub struct PurchaseQuery {
    /// The buyer's place in the product's waiting room, added by the gateway once it checked
    /// the buyer's pass: a purchase of a product whose room is on needs it.
    admitted: Option<u64>,
}

/// Decides a purchase: waiting room, window, sold-out flag, then the atomic Redis step.
/// With an `Idempotency-Key`, a repeated request gets the first answer back (see
/// `idempotency`).
#[utoipa::path(
    post,
    path = "/api/seckill/{product_id}",
    operation_id = "purchase",
    tag = "purchases",
    summary = "Buy one unit of a product",
    description = "One unit per user and product. `202` means the purchase is decided and \
        durable; its order is written asynchronously (see the result route). With an \
        `Idempotency-Key`, a repeated request gets the first answer back (with \
        `Idempotent-Replayed: true`), whatever its status was. A product with a waiting room \
        (`waiting_room` not `open`) is bought through the pass its room hands out, which the \
        gateway checks: any other purchase of it is refused with `428`.",
    params(
        ("product_id" = i64, Path, description = "The product's id (a positive integer).", minimum = 1),
        ("Idempotency-Key" = Option<String>, Header, description = "1-128 visible ASCII characters; \
            the same key answers the same purchase once more.", min_length = 1, max_length = 128),
    ),
    responses(
        (status = 202, description = "Accepted and queued.", body = Accepted,
            headers(("Idempotent-Replayed" = String, description = "`true` on a replayed answer."))),
        (status = 400, description = "`invalid_request`: the id is not a positive integer, the \
            Idempotency-Key is malformed or the gateway's admission is malformed.", body = ErrorBody),
        (status = 404, description = "`product_not_found`.", body = ErrorBody),
        (status = 409, description = "`already_purchased`: this user holds a unit already; \
            `request_in_progress`: the first request with this Idempotency-Key is not finished.",
            body = ErrorBody),
        (status = 410, description = "`sold_out`.", body = ErrorBody),
        (status = 422, description = "`activity_not_active`: outside the sale window; \
            `idempotency_key_reused`: the key was first used for another product.", body = ErrorBody),
        (status = 428, description = "`admission_required`: the product has a waiting room and \
            the purchase did not come through its pass: join the room at \
            `/api/rooms/{product_id}/join`.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` or `ledger_rebuilding` (with `Retry-After`).",
            body = ErrorBody, headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
pub async fn purchase(
    State(state): State<AppState>,
    identity: Identity,
    PathId(product_id): PathId,
    QueryParams(query): QueryParams<PurchaseQuery>,
    headers: HeaderMap,
) -> Response {
    let span = step_span(
        &[("product_id", product_id), ("user_id", identity.user_id)],
        || {
            tracing::info_span!(
                "purchase",
                product_id,
                user_id = identity.user_id,
                admitted = tracing::field::Empty
            )
        },
    );
    purchase_in(state, identity, product_id, query.admitted, headers)
        .instrument(span)
        .await
}

/// [`purchase`], in its span (or its request's scope).
async fn purchase_in(
    state: AppState,
    identity: Identity,
    product_id: i64,
    admitted: Option<u64>,
    headers: HeaderMap,
) -> Response {
    if let Some(place) = admitted {
        request_scope::record_i64("admitted", i64::try_from(place).unwrap_or(i64::MAX));
    }
    let Some(key) = headers.get(IDEMPOTENCY_KEY) else {
        // The admission is checked with the rest, on the product `decide` reads anyway.
        let request_id = Uuid::now_v7();
        return respond(
            run(
                &state, &identity, product_id, admitted, &headers, request_id,
            )
            .await,
        );
    };
    // Before the Idempotency-Key is claimed: a refusal for want of admission is no answer to
    // pin to the key, the same key may buy once its buyer is admitted.
    if let Err(e) = check_admission(&state, product_id, admitted).await {
        return e.into_response();
    }
    // A value that is not text fails validation like an empty one.
    let key = key.to_str().unwrap_or_default();
    if let Err(e) = Idempotency::validate(key) {
        return e.into_response();
    }
    let user_id = identity.user_id;
    let idem = &state.idempotency;
    let (ticket, earlier) = match idem.claim(user_id, key, product_id).await {
        Err(e) => return e.into_response(),
        Ok(Claim::Replay { status, body }) => {
            metrics::counter!("seckill_idempotent_replays_total").increment(1);
            let headers = [
                (CONTENT_TYPE, HeaderValue::from_static("application/json")),
                (IDEMPOTENT_REPLAYED, HeaderValue::from_static("true")),
            ];
            return (status, headers, body).into_response();
        }
        Ok(Claim::Fresh(ticket)) => (ticket, None),
        Ok(Claim::TakeOver { ticket, earlier }) => (ticket, Some(earlier)),
    };
    // The purchase a retry must look for if this one fails transiently.
    let mut may_have_run = ticket.request_id;
    let outcome = match earlier {
        Some(earlier) => {
            let (outcome, pending) = take_over(
                &state,
                &identity,
                (product_id, admitted),
                &headers,
                &ticket,
                earlier,
            )
            .await;
            may_have_run = pending;
            outcome
        }
        None => {
            run(
                &state,
                &identity,
                product_id,
                admitted,
                &headers,
                ticket.request_id,
            )
            .await
        }
    };
    let stored = match &outcome {
        Err(e) if e.is_transient() => idem.release(user_id, key, &ticket, may_have_run).await,
        _ => {
            let (status, body) = answer_body(&outcome);
            idem.complete(user_id, key, &ticket, status, &body).await
        }
    };
    if let Err(e) = stored {
        // The purchase itself is decided; a retry takes the key over once its lease has
        // passed and finds this purchase by its request id, never buying a second time.
        tracing::warn!(error = %e, "could not store the idempotent answer");
    }
    respond(outcome)
}

/// Refuses a purchase of a product whose waiting room is on unless the gateway admitted its
/// buyer, from the product as the catalog holds it (Moka, else Postgres), so even a gateway
/// that lost its room's state cannot let one through. An unknown product passes: the
/// purchase answers it (`404`) as any other. An admission on a product without a room is
/// no obstacle: it is bought like any other.
async fn check_admission(
    state: &AppState,
    product_id: i64,
    admitted: Option<u64>,
) -> Result<(), ApiError> {
    if admitted.is_some() {
        return Ok(());
    }
    match state.catalog.get(product_id).await? {
        Some(product) if product.waiting_room.is_on() => {
            metrics::counter!(crate::metrics::PURCHASES, "outcome" => "admission_required")
                .increment(1);
            Err(ApiError::AdmissionRequired { product_id })
        }
        _ => Ok(()),
    }
}

/// Answers a key whose earlier request ran purchase `earlier` and left no answer: that
/// purchase if it was accepted (its `202`, not a `409` for it), else a new purchase. Also
/// returns the purchase a later retry must look for, should this answer be transient.
async fn take_over(
    state: &AppState,
    identity: &Identity,
    (product_id, admitted): (i64, Option<u64>),
    headers: &HeaderMap,
    ticket: &Ticket,
    earlier: Uuid,
) -> (Result<Uuid, ApiError>, Uuid) {
    let product = match state.catalog.get(product_id).await {
        Ok(Some(product)) => product,
        Ok(None) => return (Err(ApiError::ProductNotFound), earlier),
        Err(e) => return (Err(e.into()), earlier),
    };
    let user_id = identity.user_id;
    match state.stock.holding(&product, user_id, earlier).await {
        Ok(Holding::Accepted) => {
            metrics::counter!("seckill_idempotent_replays_total").increment(1);
            return (Ok(earlier), earlier);
        }
        Ok(_) => {}
        Err(e) => return (Err(e), earlier),
    }
    match run(
        state,
        identity,
        product_id,
        admitted,
        headers,
        ticket.request_id,
    )
    .await
    {
        // The purchase itself may have resolved the earlier one's sweep (into a unit).
        Err(ApiError::AlreadyPurchased) => {
            match state.stock.holding(&product, user_id, earlier).await {
                Ok(Holding::Accepted) => (Ok(earlier), earlier),
                // Not known yet whether the earlier sweep took a unit: not an answer to keep,
                // and the earlier purchase is still the one to look for.
                Ok(Holding::Reserved) => (
                    Err(ApiError::Unavailable(
                        "an earlier request with this key is still being decided".into(),
                    )),
                    earlier,
                ),
                Ok(Holding::No) => (Err(ApiError::AlreadyPurchased), ticket.request_id),
                Err(e) => (Err(e), earlier),
            }
        }
        other => (other, ticket.request_id),
    }
}

fn accepted_body(request_id: Uuid) -> Accepted {
    Accepted {
        request_id,
        status: "queued",
    }
}

/// The status and JSON body a replay of `outcome` sends.
fn answer_body(outcome: &Result<Uuid, ApiError>) -> (StatusCode, String) {
    let (status, body) = match outcome {
        Ok(request_id) => (
            StatusCode::ACCEPTED,
            serde_json::to_string(&accepted_body(*request_id)),
        ),
        Err(e) => {
            let (status, code, message) = e.parts();
            let body = ErrorBody {
                code: code.to_string(),
                message,
            };
            (status, serde_json::to_string(&body))
        }
    };
    // Serialising these plain structs cannot fail.
    (status, body.unwrap_or_default())
}

fn respond(outcome: Result<Uuid, ApiError>) -> Response {
    match outcome {
        Ok(request_id) => (StatusCode::ACCEPTED, Json(accepted_body(request_id))).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Runs one purchase decision, as purchase `request_id`, and counts its outcome.
async fn run(
    state: &AppState,
    identity: &Identity,
    product_id: i64,
    admitted: Option<u64>,
    headers: &HeaderMap,
    request_id: Uuid,
) -> Result<Uuid, ApiError> {
    let outcome = decide(state, identity, product_id, admitted, headers, request_id).await;
    let label = match &outcome {
        Err(ApiError::AdmissionRequired { .. }) => "admission_required",
        Ok(_) => "accepted",
        Err(ApiError::SoldOut(_)) => "sold_out",
        Err(ApiError::AlreadyPurchased) => "already_purchased",
        Err(ApiError::ActivityNotActive) => "not_active",
        Err(ApiError::ProductNotFound) => "not_found",
        Err(_) => "error",
    };
    metrics::counter!(crate::metrics::PURCHASES, "outcome" => label).increment(1);
    outcome
}

/// Hands an accepted purchase's intent to RabbitMQ before the `202`: published with a
/// confirm, then its outbox entry deleted. If that cannot be done (no publisher, the
/// script's answer was lost, the broker down, slow or refusing), the entry stays for the
/// relay, and the `202` rests on Redis' durability alone (see `crate::publisher`).
async fn deliver(
    state: &AppState,
    product_id: i64,
    bucket: u16,
    request_id: Uuid,
    http_request_id: &str,
    intent: Option<Intent>,
    purchase_trace: Option<&seckill_telemetry::Carried>,
) {
    let stream = state.keys.outbox(product_id, bucket);
    let durable_in = match (&state.publisher, intent) {
        (Some(publisher), Some(intent)) => {
            // The publish is a span of the request, and the message's parent.
            let span = step_span(&[], || tracing::info_span!("outbox.deliver", %request_id));
            let carried = seckill_telemetry::carried(&span).or_else(|| purchase_trace.cloned());
            let traceparent = carried.as_ref().map(|c| c.traceparent.header());
            let trace = TraceHeaders {
                traceparent: traceparent.as_ref().map_or("", |h| h.as_str()),
                tracestate: carried.as_ref().map_or("", |c| c.tracestate.as_str()),
            };
            let entry = OutboxEntry {
                stream: stream.clone(),
                entry_id: intent.entry_id,
            };
            let published = publisher
                .publish(
                    &request_id.to_string(),
                    product_id,
                    http_request_id,
                    intent.payload.as_bytes(),
                    trace,
                    entry,
                )
                .instrument(span)
                .await;
            match published {
                // Confirmed, and its outbox entry deleted with its batch's.
                Ok(()) => "broker",
                Err(e) => {
                    tracing::warn!(error = %e, %request_id, "publish failed; the relay takes over");
                    metrics::counter!(crate::metrics::OUTBOX_CONFIRM_FAILURES,
                        "reason" => e.reason())
                    .increment(1);
                    "outbox"
                }
            }
        }
        _ => "outbox",
    };
    if durable_in == "outbox" {
        state.relay_hints.hint(stream);
    }
    metrics::counter!(crate::metrics::ACCEPTED, "durable_in" => durable_in).increment(1);
}

async fn decide(
    state: &AppState,
    identity: &Identity,
    product_id: i64,
    admitted: Option<u64>,
    headers: &HeaderMap,
    request_id: Uuid,
) -> Result<Uuid, ApiError> {
    let product = state
        .catalog
        .get(product_id)
        .await?
        .ok_or(ApiError::ProductNotFound)?;
    if admitted.is_none() && product.waiting_room.is_on() {
        return Err(ApiError::AdmissionRequired { product_id });
    }
    let now = chrono::Utc::now();
    if !product.is_active(now) {
        return Err(ApiError::ActivityNotActive);
    }
    if state.sold_out.is_sold_out(product_id) {
        metrics::counter!("seckill_sold_out_flag_hits_total", "flag" => "local").increment(1);
        // Not named for the gateway: a flag remembered here may be up to its TTL old, and
        // the gateway's own TTL would add to it. Only answers read from Redis teach it.
        return Err(ApiError::SoldOut(None));
    }
    let message = OrderMessage {
        request_id,
        user_id: identity.user_id,
        product_id,
        price_cents: product.price_cents,
        created_at: now,
        bucket: None,
    };
    let http_request_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The purchase script's span: its context is what the outbox entry carries, so the
    // order's spans join the click's trace whoever publishes it, and when.
    let span = step_span(&[], || tracing::info_span!("stock.purchase", %request_id));
    if request_scope::active() {
        // The purchase's own id, which its span would carry.
        let mut text = Uuid::encode_buffer();
        record_str(
            "purchase_id",
            request_id.hyphenated().encode_lower(&mut text),
        );
    }
    let received = headers
        .get(seckill_telemetry::TRACEPARENT)
        .and_then(|v| seckill_telemetry::TraceParent::parse(v.as_bytes()));
    let tracestate = headers
        .get(seckill_telemetry::TRACESTATE)
        .and_then(|v| v.to_str().ok());
    let carried = seckill_telemetry::carried_or(&span, received.as_ref(), tracestate);
    let traceparent = carried.as_ref().map(|c| c.traceparent.header());
    let decision = state
        .stock
        .purchase(&PurchaseRequest {
            product: &product,
            user_id: identity.user_id,
            request_id,
            message: &message,
            http_request_id,
            traceparent: traceparent.as_ref().map_or("", |h| h.as_str()),
            tracestate: carried.as_ref().map_or("", |c| c.tracestate.as_str()),
        })
        .instrument(span)
        .await?;
    match decision {
        Decision::Accepted { bucket, intent } => {
            seckill_http::failpoint!("purchase::after_script", Err(redis_lost()));
            deliver(
                state,
                product_id,
                bucket,
                request_id,
                http_request_id,
                intent,
                carried.as_ref(),
            )
            .await;
            seckill_http::failpoint!("purchase::after_deliver", Err(redis_lost()));
            Ok(request_id)
        }
        Decision::AlreadyPurchased => Err(ApiError::AlreadyPurchased),
        Decision::NotActive => Err(ApiError::ActivityNotActive),
        Decision::SoldOut { flag } => {
            // Not remembered when a unit came back during the sweep (it is on sale again),
            // nor when a reopen of a later generation was announced since it was read.
            let flag = match flag {
                Some(generation) if state.sold_out.remember(product_id, generation).await => {
                    Some(generation)
                }
                _ => None,
            };
            Err(ApiError::SoldOut(flag.map(|generation| SoldOutFlag {
                product_id,
                generation,
            })))
        }
    }
}

/// The result body: `status` is none, queued, success or failed.
#[derive(Debug, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct ResultBody {
    /// `none` (no purchase), `queued` (accepted, order not written yet), `success` (an
    /// order) or `failed` (given up; `reason` says why).
    #[schema(pattern = "^(none|queued|success|failed)$", example = "success")]
    status: &'static str,
    /// The purchase's id, while `queued`.
    #[serde(skip_serializing_if = "Option::is_none")]
    request_id: Option<String>,
    /// The order, on `success`.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_id: Option<i64>,
    /// Why it failed, on `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// Where the caller's purchase of this product stands.
#[utoipa::path(
    get,
    path = "/api/seckill/{product_id}/result",
    operation_id = "purchase_result",
    tag = "purchases",
    summary = "Where the caller's purchase of a product stands",
    params(("product_id" = i64, Path, description = "The product's id (a positive integer).", minimum = 1)),
    responses(
        (status = 200, description = "The caller's purchase, if any.", body = ResultBody),
        (status = 400, description = "`invalid_request`: the id is not a positive integer.", body = ErrorBody),
        (status = 404, description = "`product_not_found`.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = [])),
)]
pub async fn result(
    State(state): State<AppState>,
    identity: Identity,
    PathId(product_id): PathId,
) -> Result<Json<ResultBody>, ApiError> {
    let span = step_span(
        &[("product_id", product_id), ("user_id", identity.user_id)],
        || tracing::info_span!("result", product_id, user_id = identity.user_id),
    );
    result_in(state, identity, product_id)
        .instrument(span)
        .await
}

/// [`result`], in its span (or its request's scope).
async fn result_in(
    state: AppState,
    identity: Identity,
    product_id: i64,
) -> Result<Json<ResultBody>, ApiError> {
    let product = state
        .catalog
        .get(product_id)
        .await?
        .ok_or(ApiError::ProductNotFound)?;
    let mut conn = state.redis.get().await?;
    let stored: Option<String> = redis::cmd("HGET")
        .arg(
            state
                .keys
                .result_of(product_id, product.buckets(), identity.user_id),
        )
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
