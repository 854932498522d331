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
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};

use seckill_auth::AdminIdentity;
use seckill_http::{JsonBody, QueryParams, error_response};

use crate::http::AppState;
use crate::parking::{self, ParkingError, Selection, Status};

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

async fn list(
    State(state): State<AppState>,
    _admin: AdminIdentity,
    QueryParams(query): QueryParams<ListQuery>,
) -> Response {
    let selection = Selection {
        product_id: query.product_id,
        from: query.from,
        to: query.to,
        limit: Some(query.limit.unwrap_or(100)),
        ..Selection::default()
    };
    match parking::list(&state.db, &selection, query.status).await {
        Ok(entries) => Json(entries).into_response(),
        Err(e) => failed(ParkingError::Database(e)),
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    limit: Option<i64>,
}

async fn audit(
    State(state): State<AppState>,
    _admin: AdminIdentity,
    QueryParams(query): QueryParams<AuditQuery>,
) -> Response {
    match parking::audit_log(&state.db, query.limit.unwrap_or(100)).await {
        Ok(rows) => Json(rows).into_response(),
        Err(e) => failed(ParkingError::Database(e)),
    }
}

async fn redrive(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(selection): JsonBody<Selection>,
) -> Response {
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
    match run.await {
        Ok(outcome) => answer(outcome),
        Err(e) => {
            tracing::error!(error = %e, "redrive task failed");
            error_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
        }
    }
}

async fn ignore(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(selection): JsonBody<Selection>,
) -> Response {
    answer(parking::ignore(&state.db, &selection, &operator(&admin)).await)
}

async fn clear(
    State(state): State<AppState>,
    admin: AdminIdentity,
    JsonBody(selection): JsonBody<Selection>,
) -> Response {
    answer(parking::clear(&state.db, &selection, &operator(&admin)).await)
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DryRun {
    #[serde(default)]
    dry_run: bool,
}

async fn ignore_one(
    State(state): State<AppState>,
    admin: AdminIdentity,
    event_id: Result<axum::extract::Path<String>, axum::extract::rejection::PathRejection>,
    QueryParams(query): QueryParams<DryRun>,
) -> Response {
    let Ok(axum::extract::Path(event_id)) = event_id else {
        return error_response(StatusCode::BAD_REQUEST, "invalid_request", "bad event id");
    };
    let selection = Selection {
        ids: vec![event_id],
        dry_run: query.dry_run,
        ..Selection::default()
    };
    answer(parking::ignore(&state.db, &selection, &operator(&admin)).await)
}

fn operator(admin: &AdminIdentity) -> String {
    format!("admin:{}", admin.0.user_id)
}

fn answer(result: Result<parking::Report, ParkingError>) -> Response {
    match result {
        Ok(report) => Json(report).into_response(),
        Err(e) => failed(e),
    }
}

fn failed(e: ParkingError) -> Response {
    match e {
        ParkingError::Unbounded | ParkingError::Invalid(_) => {
            error_response(StatusCode::BAD_REQUEST, "invalid_request", e.to_string())
        }
        ParkingError::Database(_) | ParkingError::Publish { .. } => {
            tracing::warn!(error = %e, "parking-lot action failed");
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            )
        }
    }
}
