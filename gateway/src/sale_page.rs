//! The buyer's sale page, served by the gateway itself on its public port: `GET
//! /sale/{product_id}` answers the page, `GET /sale/assets/{file}` its script, its
//! proof-of-work solver (a Web Worker's script) and its style sheet.
//!
//! The files live in `gateway/static/sale/` (plain HTML, CSS and JavaScript, no build step,
//! nothing loaded from elsewhere) and are compiled into the binary. The page needs no token
//! to load: the buyer's bearer JWT is read by the script from the URL fragment
//! (`#token=<jwt>`, never sent to a server) or a paste field, and sent with each API call.
//! The page then drives the public API: the product, the waiting room (join, poll at the
//! server's pace, buy at the admitted pass's path), the purchase's result and the payment
//! (`docs/waiting-room.md`).
//!
//! The page goes through the request path like any request without a token (the rate limit
//! charged to its client address, [`crate::pipeline`]) and is answered before any body is
//! read. The page's references to its assets carry a digest of their contents, so that the
//! assets may be cached for a day while a new build's page never meets an old script; the
//! page itself is revalidated on every load. Any other path under `/sale/`, or another
//! method, is the gateway's usual `404 not_found`.

use std::sync::LazyLock;

use axum::http::{Method, StatusCode};
use bytes::Bytes;

use seckill_http::ErrorBody;
use seckill_http1::{Response, with_date};

use crate::{error, room};

/// Where the page's paths start.
pub const PREFIX: &str = "/sale/";

/// Where its assets' paths start.
const ASSETS: &str = "/sale/assets/";

/// The page, with `{{version}}` where its asset references carry [`VERSION`].
const PAGE_TEMPLATE: &str = include_str!("../static/sale/index.html");

/// The script.
const SCRIPT: &str = include_str!("../static/sale/app.js");

/// The proof-of-work solver, run by the script as a Web Worker.
const POW_WORKER: &str = include_str!("../static/sale/pow.js");

/// The style sheet.
const STYLE: &str = include_str!("../static/sale/style.css");

/// The page's own policy: its files only, no frames, no forms posted elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
    style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; \
    form-action 'none'; frame-ancestors 'none'";

/// A digest of the assets (FNV-1a, 64 bits, in hex): a new build's page asks for new
/// assets, past any cache.
static VERSION: LazyLock<String> = LazyLock::new(|| {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in SCRIPT
        .bytes()
        .chain(POW_WORKER.bytes())
        .chain(STYLE.bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{hash:016x}")
});

/// The page as served, its asset references versioned.
static PAGE: LazyLock<Bytes> =
    LazyLock::new(|| Bytes::from(PAGE_TEMPLATE.replace("{{version}}", &VERSION)));

/// Whether `path` is one of the page's, answered by [`respond`].
pub fn is_page_path(path: &str) -> bool {
    path.starts_with(PREFIX)
}

/// The answer to `method` `path` (a path under [`PREFIX`]).
pub fn respond(method: &Method, path: &str) -> Response {
    if method != Method::GET {
        return not_found();
    }
    if let Some(file) = path.strip_prefix(ASSETS) {
        return match file {
            "app.js" => asset("text/javascript; charset=utf-8", SCRIPT),
            "pow.js" => asset("text/javascript; charset=utf-8", POW_WORKER),
            "style.css" => asset("text/css; charset=utf-8", STYLE),
            _ => error::response(StatusCode::NOT_FOUND, "not_found", "no such asset"),
        };
    }
    match path.strip_prefix(PREFIX).and_then(room::product_id) {
        Some(_) => page(),
        None => not_found(),
    }
}

/// The page: revalidated on every load, under its content security policy.
fn page() -> Response {
    let mut response = ok("text/html; charset=utf-8", PAGE.clone());
    response.push_header(b"cache-control", b"no-cache");
    response.push_header(
        b"content-security-policy",
        CONTENT_SECURITY_POLICY.as_bytes(),
    );
    response.push_header(b"referrer-policy", b"no-referrer");
    response
}

/// An asset: cached for a day (the page asks for a new build's by another URL).
fn asset(content_type: &str, body: &'static str) -> Response {
    let mut response = ok(content_type, Bytes::from_static(body.as_bytes()));
    response.push_header(b"cache-control", b"public, max-age=86400");
    response
}

/// A `200` with `body` of `content_type`, a `Date` and no sniffing.
fn ok(content_type: &str, body: Bytes) -> Response {
    let mut response = Response::new(StatusCode::OK);
    response.push_header(b"content-type", content_type.as_bytes());
    response.push_header(b"x-content-type-options", b"nosniff");
    with_date(|date| response.push_header(b"date", date));
    response.body = body;
    response
}

fn not_found() -> Response {
    error::response(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// `GET /sale/{product_id}`.
#[utoipa::path(
    get,
    path = "/sale/{product_id}",
    operation_id = "sale_page",
    tag = "operations",
    summary = "The buyer's page of a sale",
    description = "An HTML page (no token needed to load it) that follows the sale: the \
        countdown, the waiting room, the purchase, the order and its payment. The buyer's \
        token goes in the URL fragment, `#token=<jwt>`, or in the page's paste field.",
    params(("product_id" = i64, Path, description = "The product on sale.", minimum = 1)),
    responses(
        (status = 200, description = "The page.", content_type = "text/html", body = String,
            headers(("Cache-Control" = String, description = "`no-cache`."))),
        (status = 400, description = "`invalid_request`: a path with `.` or `..` segments.",
            body = ErrorBody),
        (status = 404, description = "`not_found`: not a product id.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: over the client address's quota.",
            body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
)]
pub fn sale_page() {}

/// `GET /sale/assets/{file}`.
#[utoipa::path(
    get,
    path = "/sale/assets/{file}",
    operation_id = "sale_page_asset",
    tag = "operations",
    summary = "The sale page's scripts and style sheet",
    params(("file" = String, Path,
        description = "`app.js`, `pow.js` (its proof-of-work solver, a Web Worker) or `style.css`.")),
    responses(
        (status = 200, description = "The file.",
            content((String = "text/javascript"), (String = "text/css")),
            headers(("Cache-Control" = String, description = "`public, max-age=86400`."))),
        (status = 400, description = "`invalid_request`: a path with `.` or `..` segments.",
            body = ErrorBody),
        (status = 404, description = "`not_found`: no such asset.", body = ErrorBody),
        (status = 429, description = "`rate_limited`: over the client address's quota.",
            body = ErrorBody,
            headers(("Retry-After" = String, description = "Seconds to wait."))),
    ),
)]
pub fn sale_page_asset() {}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(response: &Response, name: &str) -> String {
        String::from_utf8(response.header(name).expect(name).to_vec()).expect("text")
    }

    #[test]
    fn the_page_is_served_for_a_product_id_with_its_assets_versioned() {
        let page = respond(&Method::GET, "/sale/42");
        assert_eq!(page.status, StatusCode::OK);
        assert_eq!(text(&page, "content-type"), "text/html; charset=utf-8");
        assert_eq!(text(&page, "cache-control"), "no-cache");
        let body = std::str::from_utf8(&page.body).expect("utf-8");
        assert!(!body.contains("{{version}}"), "every reference versioned");
        assert!(body.contains(&format!("/sale/assets/app.js?v={}", *VERSION)));
        assert!(body.contains(&format!("/sale/assets/style.css?v={}", *VERSION)));
        assert!(!body.contains("http://") && !body.contains("https://"));
    }

    #[test]
    fn the_worker_is_found_beside_the_script_and_versioned_with_it() {
        // app.js starts the worker at its own URL with `app.js` replaced: the same version.
        assert!(SCRIPT.contains("'/pow.js'") && SCRIPT.contains("new Worker("));
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in SCRIPT.bytes().chain(STYLE.bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        assert_ne!(
            format!("{hash:016x}"),
            *VERSION,
            "the worker counts in the version"
        );
    }

    #[test]
    fn assets_have_their_content_types_and_a_cache_lifetime() {
        for (file, content_type) in [
            ("app.js", "text/javascript; charset=utf-8"),
            ("pow.js", "text/javascript; charset=utf-8"),
            ("style.css", "text/css; charset=utf-8"),
        ] {
            let answer = respond(&Method::GET, &format!("/sale/assets/{file}"));
            assert_eq!(answer.status, StatusCode::OK, "{file}");
            assert_eq!(text(&answer, "content-type"), content_type);
            assert_eq!(text(&answer, "cache-control"), "public, max-age=86400");
            assert_eq!(text(&answer, "x-content-type-options"), "nosniff");
        }
    }

    #[test]
    fn anything_else_is_not_found_as_json() {
        for (method, path) in [
            (Method::GET, "/sale/assets/index.html"),
            (Method::GET, "/sale/assets/"),
            (Method::GET, "/sale/"),
            (Method::GET, "/sale/0"),
            (Method::GET, "/sale/7/x"),
            (Method::GET, "/sale/abc"),
            (Method::POST, "/sale/7"),
            (Method::DELETE, "/sale/assets/app.js"),
        ] {
            let answer = respond(&method, path);
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_eq!(text(&answer, "content-type"), "application/json");
            let body: serde_json::Value = serde_json::from_slice(&answer.body).expect("json");
            assert_eq!(body["code"], "not_found", "{method} {path}");
        }
    }
}
