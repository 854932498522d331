//! The HTTP API of seckill-api: the one state every handler shares (cheap handles only),
//! and every route merged in one place, each documented where it is handled
//! (`#[utoipa::path]`): the router and the OpenAPI description are built from the same
//! list, so a route cannot be served without being described.
//!
//! - [`purchase`] — `POST /api/seckill/{product_id}` and its result.
//! - [`products`] — product reads, the admin create and the admin edit.
//! - [`reconcile`] — `GET /admin/products/{id}/stock`: does every unit add up?

mod products;
mod purchase;
mod reconcile;

use std::sync::Arc;

use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use seckill_auth::IdentityVerifier;
use seckill_store::RedisKeys;

use crate::catalog::Catalog;
use crate::idempotency::Idempotency;
use crate::publisher::OrderPublisher;
use crate::relay::RelayHints;
use crate::room::RoomSetup;
use crate::sold_out::SoldOutMemory;
use crate::stock::StockEngine;

/// What every handler shares, behind one `Arc`: axum clones the state for each request, so
/// it is one reference count, whatever the handles inside own.
#[derive(Clone, Debug)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// The state of `shared`.
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// Handles shared by all handlers.
#[derive(Debug)]
pub struct Shared {
    /// Products (Postgres + L1 cache).
    pub catalog: Catalog,
    /// Redis stock and purchase decisions.
    pub stock: StockEngine,
    /// Redis, for results.
    pub redis: seckill_store::Redis,
    /// Key names.
    pub keys: RedisKeys,
    /// Verifies the gateway's identity credentials (the routes' middleware holds it).
    pub identity: IdentityVerifier,
    /// Products this replica saw flagged sold out in Redis recently: answered 410 without
    /// Redis or Lua.
    pub sold_out: SoldOutMemory,
    /// `Idempotency-Key` records.
    pub idempotency: Idempotency,
    /// Writes a product's waiting room into Redis after an admin's create or change.
    pub rooms: RoomSetup,
    /// Tells the outbox relay which stream an accepted purchase went to.
    pub relay_hints: Arc<RelayHints>,
    /// Publishes accepted purchases before they are answered; `None`: the relay does.
    pub publisher: Option<OrderPublisher>,
    /// Buckets of a product created without a bucket count.
    pub default_buckets: i16,
}

/// Every business route, behind the gateway identity check; ops routes are added by
/// `startup`.
pub fn router(state: AppState) -> Router {
    let identity = state.identity.clone();
    let (routes, _description) = described().split_for_parts();
    seckill_auth::verified(routes.with_state(state), identity)
}

/// The OpenAPI description of [`router`]'s routes, as the backend answers them (the
/// gateway adds its own refusals when it merges the public document).
pub fn openapi() -> utoipa::openapi::OpenApi {
    described().into_openapi()
}

fn described() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(purchase::purchase))
        .routes(routes!(purchase::result))
        .routes(routes!(products::list))
        .routes(routes!(products::get))
        .routes(routes!(products::create))
        .routes(routes!(products::update))
        .routes(routes!(reconcile::stock))
}
