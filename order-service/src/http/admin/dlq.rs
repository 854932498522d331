//! Operator routes of the parking lot (`/admin/dlq…`, role `admin`, reached through the
//! gateway). Each action takes a [`Selection`] body; `"dry_run": true` reports what it would
//! do. The operator recorded in the audit trail is `admin:<user id>`.
//!
//! ```text
//! GET  /admin/dlq?status=&product_id=&from=&to=&limit=
//! POST /admin/dlq/redrive          {"ids": […]} | {"product_id": 7} | {"from": …, "to": …}
//! POST /admin/dlq/{id}/ignore      (?dry_run=true)
//! POST /admin/dlq/ignore           (a selection)
//! POST /admin/dlq/clear            (a selection; quarantined entries)
//! GET  /admin/dlq/audit?limit=
//! ```

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::PathRejection;
use chrono::{DateTime, Utc};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use seckill_auth::AdminIdentity;
use seckill_http::{ErrorBody, JsonBody, QueryParams};

use crate::error::ApiError;
use crate::http::AppState;
use crate::parking::{self, AuditEntry, Entry, Report, Selection, Status};

/// The parking-lot routes, each with its OpenAPI description.
pub(super) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(redrive))
        .routes(routes!(ignore))
        .routes(routes!(clear))
        .routes(routes!(audit))
        .routes(routes!(ignore_one))
}

/// Filters of the listing.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only entries in this status.
    #[param(inline)]
    status: Option<Status>,
    /// Only entries of this product.
    product_id: Option<i64>,
    /// First dead-lettered at or after this instant.
    from: Option<DateTime<Utc>>,
    /// First dead-lettered before this instant.
    to: Option<DateTime<Utc>>,
    /// Most entries (100 unless given; kept within 1-10000).
    limit: Option<i64>,
}

/// `GET /admin/dlq`: entries, oldest first (100 unless a limit is given).
#[utoipa::path(
    get,
    path = "/admin/dlq",
    operation_id = "list_dead_letters",
    tag = "admin",
    summary = "Dead letters in the parking lot, oldest first",
    params(ListQuery),
    responses(
        (status = 200, description = "The entries.", body = Vec<Entry>),
        (status = 400, description = "`invalid_request`: an unknown or malformed parameter.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
async fn list(
    State(state): State<AppState>,
    _admin: AdminIdentity,
    QueryParams(query): QueryParams<ListQuery>,
) -> Result<Json<Vec<Entry>>, ApiError> {
    let selection = Selection {
        product_id: query.product_id,
        from: query.from,
        to: query.to,
        limit: Some(query.limit.unwrap_or(100)),
        ..Selection::default()
    };
    Ok(Json(
        parking::list(&state.db, &selection, query.status).await?,
    ))
}

/// The query of the audit listing.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Most records (100 unless given; kept within 1-10000).
    limit: Option<i64>,
}

/// `GET /admin/dlq/audit`: the newest audit records (100 unless a limit is given).
#[utoipa::path(
    get,
    path = "/admin/dlq/audit",
    operation_id = "dead_letter_audit",
    tag = "admin",
    summary = "The operators' actions on the parking lot, newest first",
    params(AuditQuery),
    responses(
        (status = 200, description = "The audit records.", body = Vec<AuditEntry>),
        (status = 400, description = "`invalid_request`: an unknown or malformed parameter.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
async fn audit(
    State(state): State<AppState>,
    _admin: AdminIdentity,
    QueryParams(query): QueryParams<AuditQuery>,
) -> Result<Json<Vec<AuditEntry>>, ApiError> {
    Ok(Json(
        parking::audit_log(&state.db, query.limit.unwrap_or(100)).await?,
    ))
}

/// `POST /admin/dlq/redrive`: sends the selected pending entries back to the orders queue.
#[utoipa::path(
    post,
    path = "/admin/dlq/redrive",
    operation_id = "redrive_dead_letters",
    tag = "admin",
    summary = "Send the selected pending dead letters back to the orders queue",
    description = "`\"dry_run\": true` reports what would be done and changes nothing. A broker failure part-way answers `503` after the entries already redriven.",
    request_body = Selection,
    responses(
        (status = 200, description = "What was done (or would be).", body = Report),
        (status = 400, description = "`invalid_request`: malformed JSON, or a selection that \
            names nothing (no ids, product_id or from/to) or is malformed.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
async fn redrive(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(selection): JsonBody<Selection>,
) -> Result<Json<Report>, ApiError> {
    // A large redrive is paced and can outlive the caller (the gateway's upstream timeout):
    // run it in its own task, so a dropped request never cuts it between a publish and the
    // commit that records it, and its audit row is always written.
    let operator = operator(&admin);
    let run = tokio::spawn(async move {
        state
            .redriver
            .redrive(&state.db, &selection, &operator)
            .await
    });
    Ok(Json(run.await??))
}

/// `POST /admin/dlq/ignore`: gives the selected entries up; their units go back on sale.
#[utoipa::path(
    post,
    path = "/admin/dlq/ignore",
    operation_id = "ignore_dead_letters",
    tag = "admin",
    summary = "Give the selected dead letters up; their units go back on sale",
    description = "`\"dry_run\": true` reports what would be done and changes nothing.",
    request_body = Selection,
    responses(
        (status = 200, description = "What was done (or would be).", body = Report),
        (status = 400, description = "`invalid_request`: malformed JSON, or a selection that \
            names nothing (no ids, product_id or from/to) or is malformed.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
async fn ignore(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(selection): JsonBody<Selection>,
) -> Result<Json<Report>, ApiError> {
    Ok(Json(
        parking::ignore(&state.db, &selection, &operator(&admin)).await?,
    ))
}

/// `POST /admin/dlq/clear`: releases the selected quarantined entries.
#[utoipa::path(
    post,
    path = "/admin/dlq/clear",
    operation_id = "clear_dead_letters",
    tag = "admin",
    summary = "Release the selected quarantined dead letters",
    description = "`\"dry_run\": true` reports what would be done and changes nothing.",
    request_body = Selection,
    responses(
        (status = 200, description = "What was done (or would be).", body = Report),
        (status = 400, description = "`invalid_request`: malformed JSON, or a selection that \
            names nothing (no ids, product_id or from/to) or is malformed.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
async fn clear(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(selection): JsonBody<Selection>,
) -> Result<Json<Report>, ApiError> {
    Ok(Json(
        parking::clear(&state.db, &selection, &operator(&admin)).await?,
    ))
}

/// The query of a single-entry action.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DryRun {
    /// Only report what would be done.
    #[serde(default)]
    dry_run: bool,
}

/// `POST /admin/dlq/{event_id}/ignore`: gives one entry up.
#[utoipa::path(
    post,
    path = "/admin/dlq/{event_id}/ignore",
    operation_id = "ignore_dead_letter",
    tag = "admin",
    summary = "Give one dead letter up; its unit goes back on sale",
    params(
        ("event_id" = String, Path, description = "The entry's event id (letters, digits, `-`; at most 128)."),
        DryRun,
    ),
    responses(
        (status = 200, description = "What was done (or would be).", body = Report),
        (status = 400, description = "`invalid_request`: a malformed event id or parameter.", body = ErrorBody),
        (status = 500, description = "`internal`: a bug or a broken invariant (its cause is logged, never shown).", body = ErrorBody),
        (status = 503, description = "`unavailable` (with `Retry-After`).", body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
    security(("bearer" = ["admin"])),
)]
async fn ignore_one(
    State(state): State<AppState>,
    admin: AdminIdentity,
    event_id: Result<axum::extract::Path<String>, PathRejection>,
    QueryParams(query): QueryParams<DryRun>,
) -> Result<Json<Report>, ApiError> {
    let Ok(axum::extract::Path(event_id)) = event_id else {
        return Err(ApiError::InvalidRequest("bad event id".into()));
    };
    let selection = Selection {
        ids: vec![event_id],
        dry_run: query.dry_run,
        ..Selection::default()
    };
    Ok(Json(
        parking::ignore(&state.db, &selection, &operator(&admin)).await?,
    ))
}

/// Who acts, as the audit trail records it.
fn operator(admin: &AdminIdentity) -> String {
    format!("admin:{}", admin.0.user_id)
}
