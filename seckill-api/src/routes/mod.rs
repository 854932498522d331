//! HTTP routes of seckill-api, merged in one place, each documented where it is handled
//! (`#[utoipa::path]`): the router and the OpenAPI description are built from the same
//! list, so a route cannot be served without being described.

mod products;
mod purchase;
mod reconcile;

use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

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
