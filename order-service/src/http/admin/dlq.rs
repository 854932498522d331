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

use axum::extract::State;
use axum::extract::rejection::PathRejection;
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};

use seckill_auth::AdminIdentity;
use seckill_http::{JsonBody, QueryParams};

use crate::error::ApiError;
use crate::http::AppState;
use crate::parking::{self, AuditEntry, Entry, Report, Selection, Status};

/// The parking-lot routes.
pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/dlq", get(list))
        .route("/admin/dlq/redrive", post(redrive))
        .route("/admin/dlq/ignore", post(ignore))
        .route("/admin/dlq/clear", post(clear))
        .route("/admin/dlq/audit", get(audit))
        .route("/admin/dlq/{event_id}/ignore", post(ignore_one))
}

/// Filters of the listing.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<Status>,
    product_id: Option<i64>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: Option<i64>,
}

/// `GET /admin/dlq`: entries, oldest first (100 unless a limit is given).
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
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    limit: Option<i64>,
}

/// `GET /admin/dlq/audit`: the newest audit records (100 unless a limit is given).
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
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DryRun {
    #[serde(default)]
    dry_run: bool,
}

/// `POST /admin/dlq/{event_id}/ignore`: gives one entry up.
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
