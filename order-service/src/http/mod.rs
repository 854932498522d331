//! The HTTP API: the one state every handler shares, and every route merged in one place
//! with the layer stack around it.
//!
//! - [`orders`] — the buyer's own orders: list, read, pay, cancel.
//! - [`admin`] — operator routes: the parking lot (`/admin/dlq…`) and the breaker.

mod admin;
mod orders;

use std::sync::Arc;

use axum::Router;
use sqlx::PgPool;
use utoipa_axum::router::OpenApiRouter;

use seckill_auth::IdentityVerifier;
use seckill_http::ops::{self, Probe};
use seckill_store::{Redis, RedisKeys};

use crate::breaker::CircuitBreaker;
use crate::parking::Redriver;

/// Handles shared by all handlers; each is cheap to clone.
#[derive(Clone, Debug)]
pub struct AppState {
    /// Orders and the parking lot.
    pub(crate) db: PgPool,
    /// Where the breaker's forced mode is shared with every replica.
    pub(crate) redis: Redis,
    /// Key names.
    pub(crate) keys: RedisKeys,
    /// The consumer's circuit breaker, which the breaker admin routes show and force.
    pub(crate) breaker: Arc<CircuitBreaker>,
    /// Verifies the gateway's identity credentials (the routes' middleware holds it).
    pub(crate) identity: IdentityVerifier,
    /// Publishes redriven dead letters, paced.
    pub(crate) redriver: Arc<Redriver>,
}

/// Every route of the service — business, admin and ops (`/healthz`, `/readyz`, `/metrics`,
/// answering `probes`) — the business ones behind the identity check, all inside the request-id, tracing, panic and metrics layers.
pub fn router(state: AppState, probes: Vec<(&'static str, Probe)>) -> Router {
    let identity = state.identity.clone();
    let (business, _description) = described().split_for_parts();
    let business = business.with_state(state);
    // Credentials are checked on the business routes only: ops routes take none.
    let routes =
        seckill_auth::verified(business, identity).merge(ops::router("order-service", probes));
    seckill_http::layers::instrument(routes, "order-service")
}

/// The OpenAPI description of the business and admin routes, as the service answers them
/// (the gateway adds its own refusals when it merges the public document).
pub fn openapi() -> utoipa::openapi::OpenApi {
    described().into_openapi()
}

/// Every business and admin route with its description: the router and the document are
/// built from this one list.
fn described() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(orders::router())
        .merge(admin::router())
}
