//! HTTP routes of seckill-api, merged in one place.

mod products;
mod purchase;
mod reconcile;

use axum::Router;
use axum::routing::{get, patch, post};

use crate::state::AppState;

/// Every business route, behind the gateway identity check; ops routes are added by
/// `startup`.
pub fn router(state: AppState) -> Router {
    let identity = state.identity.clone();
    let routes = Router::new()
        .route("/api/seckill/{product_id}", post(purchase::purchase))
        .route("/api/seckill/{product_id}/result", get(purchase::result))
        .route("/api/products", get(products::list))
        .route("/api/products/{product_id}", get(products::get))
        .route("/admin/products", post(products::create))
        .route("/admin/products/{product_id}", patch(products::update))
        .route("/admin/products/{product_id}/stock", get(reconcile::stock))
        .with_state(state);
    seckill_auth::verified(routes, identity)
}
