//! The public API contract: an OpenAPI 3.1 document of every route the gateway answers or
//! forwards, generated from the code, committed as `docs/openapi.json` and served from that
//! file at `GET /openapi.json` ([`DOCUMENT`]).
//!
//! [`document`] builds it: the backends' descriptions (each handler's `#[utoipa::path]`,
//! `seckill_api::http::openapi` and `order_service::http::openapi`), the gateway's own
//! routes ([`crate::ops`]), the bearer scheme, and on every forwarded operation the answers
//! the gateway itself may give before or instead of the backend's ([`gateway_refusals`]).
//! The gateway binary links neither backend: the contract test (`gateway/tests/api/
//! openapi.rs`) calls [`document`] with them and fails when the result differs from the file.

use utoipa::OpenApi;
use utoipa::openapi::content::Content;
use utoipa::openapi::header::Header;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::response::Response;
use utoipa::openapi::schema::{Object, Ref, Type};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, RefOr};

use crate::proxy;
use crate::ratelimit::is_purchase;

/// The committed contract, as served at `GET /openapi.json` (kept beside its handler).
pub use crate::ops::OPENAPI_DOCUMENT as DOCUMENT;

/// The name of the bearer security scheme; admin operations require it with the role
/// `admin`.
pub const BEARER: &str = "bearer";

/// The gateway's own routes, described next to their handlers in [`crate::ops`].
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Seckill platform",
        description = "The public HTTP API of the flash-sale platform, through the gateway \
            (docs/DESIGN.md §2). Every error body is `{\"code\", \"message\"}`; `code` is \
            stable and named in each response's description. Business routes need a bearer \
            JWT; `/admin/…` routes need one with the role `admin`.",
        license(name = "MIT OR Apache-2.0"),
    ),
    paths(
        crate::ops::healthz,
        crate::ops::openapi_json,
        crate::sale_page::sale_page,
        crate::sale_page::sale_page_asset,
        crate::room::api::join,
        crate::room::api::challenge,
        crate::room::api::poll,
        crate::room::api::draw,
        crate::room::api::purchase_with_pass,
    ),
    tags(
        (name = "purchases", description = "Buying a unit and following its result."),
        (name = "products", description = "The catalogue."),
        (name = "orders", description = "The caller's own orders."),
        (name = "admin", description = "Operator routes (role `admin`)."),
        (name = "waiting room", description = "A sale's queue: join, wait, get admitted \
            (answered by the gateway)."),
        (name = "operations", description = "The gateway's own endpoints (no token): \
            health, this document and the buyer's sale page."),
    ),
)]
struct GatewayApi;

/// The public document: the gateway's routes merged with `backends`' (each service's own
/// description), every forwarded operation completed with [`gateway_refusals`].
pub fn document(backends: impl IntoIterator<Item = utoipa::openapi::OpenApi>) -> String {
    let mut api = GatewayApi::openapi();
    api.info.version = env!("CARGO_PKG_VERSION").to_string();
    for backend in backends {
        api.merge(backend);
    }
    let bearer = Http::builder()
        .scheme(HttpAuthScheme::Bearer)
        .bearer_format("JWT")
        .description(Some(
            "A JWT (HS256 by default; RS256/EdDSA when configured) whose `sub` is the user id; \
             `roles: [\"admin\"]` for the admin routes.",
        ))
        .build();
    api.components
        .get_or_insert_with(Components::default)
        .add_security_scheme(BEARER, SecurityScheme::Http(bearer));
    for (path, item) in api.paths.paths.iter_mut() {
        // The room's routes go through the same steps as a forwarded request of a user.
        let room = crate::room::is_room_path(path).then_some(proxy::Route {
            service: proxy::Service::SeckillApi,
            admin_only: false,
        });
        let Some(route) = proxy::route(path).or(room) else {
            continue;
        };
        for (method, operation) in operations(item) {
            if operation.security.is_none() {
                let roles: &[&str] = if route.admin_only { &["admin"] } else { &[] };
                operation.security = Some(vec![SecurityRequirement::new(
                    BEARER,
                    roles.iter().copied(),
                )]);
            }
            let purchase = is_purchase(&method, path).then_some(if path.ends_with("{pass}") {
                Purchase::WithPass
            } else {
                Purchase::Plain
            });
            for (status, refusal) in gateway_refusals(route.admin_only, purchase) {
                add_refusal(operation, status, refusal);
            }
        }
    }
    let mut text = serde_json::to_string_pretty(&api).expect("an OpenAPI document serialises");
    text.push('\n');
    text
}

/// What the gateway may answer on a forwarded operation, by status: the codes and why.
/// Each comes from `crate::pipeline` (the order a request goes through) and
/// `crate::proxy::forward`.
pub fn gateway_refusals(admin_only: bool, purchase: Option<Purchase>) -> Vec<(u16, Refusal)> {
    let mut refusals = vec![
        (
            400,
            Refusal::new(
                "`invalid_request`: a path with `.` or `..` segments, or a body that could not \
                 be read",
            ),
        ),
        (
            401,
            Refusal::new("`unauthorized`: no valid bearer token").header(
                "WWW-Authenticate",
                "`Bearer realm=\"seckill\"`, with `error=\"invalid_token\"` when a token was sent",
            ),
        ),
        (
            408,
            Refusal::new("`request_timeout`: the request body came too slowly"),
        ),
        (
            413,
            Refusal::new("`payload_too_large`: the body is over the gateway's limit"),
        ),
        (
            429,
            Refusal::new(if purchase.is_some() {
                "`rate_limited`: over the caller's quota; `too_many_purchases`: this user has \
                 too many purchases under way"
            } else {
                "`rate_limited`: over the caller's quota"
            })
            .header("Retry-After", "Seconds to wait (on `rate_limited`)."),
        ),
        (500, Refusal::new("`internal`: a bug; the cause is logged")),
        (
            502,
            Refusal::new("`bad_gateway`: the upstream service failed or answered too much"),
        ),
        (
            503,
            Refusal::new(
                "`unavailable`: overloaded, no replica reachable, or the rate limits cannot be \
                 checked",
            )
            .header("Retry-After", "Seconds to wait."),
        ),
        (
            504,
            Refusal::new("`gateway_timeout`: the request or the upstream took too long"),
        ),
    ];
    match purchase {
        Some(Purchase::Plain) => refusals.push((
            428,
            Refusal::new(
                "`admission_required`: the product's waiting room is on; join it and buy \
                 at the path the admitted poll gives",
            ),
        )),
        Some(Purchase::WithPass) => refusals.push((
            403,
            Refusal::new("`invalid_pass`: not the caller's pass for this sale; `pass_expired`"),
        )),
        None => {}
    }
    if admin_only {
        refusals.push((
            403,
            Refusal::new("`forbidden`: the token lacks the role `admin`").header(
                "WWW-Authenticate",
                "`Bearer realm=\"seckill\", error=\"insufficient_scope\"`",
            ),
        ));
    }
    refusals.sort_by_key(|(status, _)| *status);
    refusals
}

/// Which purchase an operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purchase {
    /// `POST /api/seckill/{product_id}`.
    Plain,
    /// `POST /api/seckill/{product_id}/{pass}` (a waiting room's admitted buyer).
    WithPass,
}

/// One of the gateway's own answers on a forwarded operation.
#[derive(Debug, Clone)]
pub struct Refusal {
    /// Its codes and their causes, for the response's description.
    pub description: &'static str,
    /// Headers it carries: name and description.
    pub headers: Vec<(&'static str, &'static str)>,
}

impl Refusal {
    fn new(description: &'static str) -> Self {
        Self {
            description,
            headers: Vec::new(),
        }
    }

    fn header(mut self, name: &'static str, description: &'static str) -> Self {
        self.headers.push((name, description));
        self
    }
}

/// Adds `refusal` to `operation`'s answers under `status`: a new error response, or the
/// gateway's causes appended to the backend's own response of that status.
fn add_refusal(operation: &mut Operation, status: u16, refusal: Refusal) {
    let responses = &mut operation.responses.responses;
    let entry = responses.entry(status.to_string()).or_insert_with(|| {
        let mut response = Response::new("");
        response.content.insert(
            "application/json".to_string(),
            Content::new(Some(Ref::from_schema_name("ErrorBody"))),
        );
        RefOr::T(response)
    });
    let RefOr::T(response) = entry else {
        return;
    };
    response.description = if response.description.is_empty() {
        format!("At the gateway: {}.", refusal.description)
    } else {
        format!(
            "{} At the gateway: {}.",
            response.description, refusal.description
        )
    };
    for (name, description) in refusal.headers {
        response.headers.entry(name.to_string()).or_insert_with(|| {
            let mut header = Header::new(Object::with_type(Type::String));
            header.description = Some(description.to_string());
            header
        });
    }
}

/// The operations of a path, with their methods.
fn operations(item: &mut PathItem) -> Vec<(axum::http::Method, &mut Operation)> {
    use axum::http::Method;
    [
        (Method::GET, item.get.as_mut()),
        (Method::PUT, item.put.as_mut()),
        (Method::POST, item.post.as_mut()),
        (Method::DELETE, item.delete.as_mut()),
        (Method::OPTIONS, item.options.as_mut()),
        (Method::HEAD, item.head.as_mut()),
        (Method::PATCH, item.patch.as_mut()),
        (Method::TRACE, item.trace.as_mut()),
    ]
    .into_iter()
    .filter_map(|(method, operation)| operation.map(|o| (method, o)))
    .collect()
}
