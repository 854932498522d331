//! The JSON error contract (DESIGN.md §2) and extractors that honour it.

use axum::Json;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// Every error body: a stable machine code and a human message.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[schema(example = json!({"code": "sold_out", "message": "sold out"}))]
pub struct ErrorBody {
    /// snake_case, stable: clients switch on it.
    pub code: String,
    /// For people; may change wording.
    pub message: String,
}

/// Header of seckill-api's `410 sold_out` answers backed by the product's sold-out flag:
/// `<product id> <gen>`, the generation under which the flag went up. The gateway learns
/// from it to answer the product's purchases itself until units go back on sale (a newer
/// generation is announced), and answers with it too.
pub const SOLD_OUT_HEADER: &str = "seckill-sold-out";

/// Builds an error response in the contract's shape.
pub fn error_response(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = ErrorBody {
        code: code.to_string(),
        message: message.into(),
    };
    (status, Json(body)).into_response()
}

/// A positive integer id taken from the last `{…}` segment of the route, e.g.
/// `/api/seckill/{product_id}`. Anything else is a 400 `invalid_request`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathId(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for PathId {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let invalid = || {
            error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "the id in the path must be a positive integer",
            )
        };
        let axum::extract::Path(raw) =
            axum::extract::Path::<String>::from_request_parts(parts, state)
                .await
                .map_err(|_| invalid())?;
        match raw.parse::<i64>() {
            Ok(id) if id > 0 => Ok(PathId(id)),
            _ => Err(invalid()),
        }
    }
}

/// Answers 404 in the contract's shape for routes nobody serves.
pub async fn not_found() -> Response {
    error_response(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// `axum::Json` whose rejection (bad JSON, wrong content type, missing field) is a 400
/// `invalid_request` in the contract's shape, with serde's reason as the message.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonBody<T>(pub T);

impl<T, S> axum::extract::FromRequest<S> for JsonBody<T>
where
    axum::Json<T>:
        axum::extract::FromRequest<S, Rejection = axum::extract::rejection::JsonRejection>,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(value)) => Ok(Self(value)),
            Err(rejection) => Err(error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                rejection.body_text(),
            )),
        }
    }
}

/// `axum::extract::Query` whose rejection (an unknown or malformed parameter) is a 400
/// `invalid_request` in the contract's shape.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueryParams<T>(pub T);

impl<T, S> FromRequestParts<S> for QueryParams<T>
where
    T: serde::de::DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(value)) => Ok(Self(value)),
            Err(rejection) => Err(error_response(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                rejection.body_text(),
            )),
        }
    }
}
