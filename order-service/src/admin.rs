//! Operator routes of the parking lot (`/admin/orders/dead-letters…`, role `admin`, reached
//! through the gateway). Each action takes a [`Selection`] body; `"dry_run": true` reports
//! what it would do. The operator recorded in the audit trail is `admin:<user id>`.
//!
//! ```text
//! GET  /admin/orders/dead-letters?status=&product_id=&from=&to=&limit=
//! POST /admin/orders/dead-letters/redrive   {"ids": […]} | {"product_id": 7} | {"from": …, "to": …}
//! POST /admin/orders/dead-letters/ignore    (same selection)
//! POST /admin/orders/dead-letters/clear     (same selection; quarantined entries)
//! GET  /admin/orders/dead-letters/audit?limit=
//! ```

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};

use seckill_auth::AdminIdentity;
use seckill_http::{JsonBody, QueryParams, error_response};

use crate::parking::{self, ParkingError, Selection, Status};
use crate::routes::AppState;

/// The parking-lot routes.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/admin/orders/dead-letters", get(list))
        .route("/admin/orders/dead-letters/redrive", post(redrive))
        .route("/admin/orders/dead-letters/ignore", post(ignore))
        .route("/admin/orders/dead-letters/clear", post(clear))
        .route("/admin/orders/dead-letters/audit", get(audit))
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
    answer(
        state
            .redriver
            .redrive(&state.db, &selection, &operator(&admin))
            .await,
    )
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
        ParkingError::Unbounded => {
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
