//! The contract: `docs/openapi.json` is what the code describes, is a valid OpenAPI 3.1
//! document naming every public route with the gateway's refusals, and is what the gateway
//! serves at `/openapi.json`, without a token.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

use crate::helpers::spawn_platform;

/// How to bring `docs/openapi.json` back in step with the code.
const REGENERATE: &str = "SECKILL_UPDATE_OPENAPI=1 cargo test -p gateway --test api openapi";

/// Every public operation: DESIGN.md §2's table, plus the routes it names by family (the
/// breaker, the product edit) and the gateway's own: health, this document, the sale page.
const PUBLIC_OPERATIONS: &[(&str, &str)] = &[
    ("post", "/api/seckill/{product_id}"),
    ("post", "/api/seckill/{product_id}/{pass}"),
    ("get", "/api/seckill/{product_id}/result"),
    ("post", "/api/rooms/{product_id}/join"),
    ("get", "/api/rooms/{product_id}/challenge"),
    ("get", "/api/rooms/{product_id}/tickets/{ticket}"),
    ("get", "/api/rooms/{product_id}/draw"),
    ("get", "/api/products"),
    ("get", "/api/products/{product_id}"),
    ("get", "/api/orders"),
    ("get", "/api/orders/{order_id}"),
    ("post", "/api/orders/{order_id}/pay"),
    ("post", "/api/orders/{order_id}/cancel"),
    ("post", "/admin/products"),
    ("patch", "/admin/products/{product_id}"),
    ("get", "/admin/products/{product_id}/stock"),
    ("get", "/admin/orders/breaker"),
    ("put", "/admin/orders/breaker"),
    ("get", "/admin/dlq"),
    ("post", "/admin/dlq/redrive"),
    ("post", "/admin/dlq/{event_id}/ignore"),
    ("post", "/admin/dlq/ignore"),
    ("post", "/admin/dlq/clear"),
    ("get", "/admin/dlq/audit"),
    ("get", "/healthz"),
    ("get", "/openapi.json"),
    ("get", "/sale/{product_id}"),
    ("get", "/sale/assets/{file}"),
];

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json")
}

/// The document the code describes now.
fn generated() -> String {
    gateway::openapi::document([seckill_api::http::openapi(), order_service::http::openapi()])
}

fn operations(document: &Value) -> Vec<(String, String, &Value)> {
    let paths = document["paths"].as_object().expect("paths");
    paths
        .iter()
        .flat_map(|(path, item)| {
            METHODS.iter().filter_map(move |method| {
                item.get(*method)
                    .map(|operation| (method.to_string(), path.clone(), operation))
            })
        })
        .collect()
}

#[test]
fn the_committed_openapi_document_is_the_one_the_code_describes() {
    let generated = generated();
    let path = committed_path();
    if std::env::var_os("SECKILL_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).expect("write docs/openapi.json");
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    if committed != generated {
        let line = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| committed.lines().count().min(generated.lines().count()));
        panic!(
            "docs/openapi.json is not what the code describes (first difference at line {}:\n  \
             committed: {:?}\n  generated: {:?}).\nRegenerate it with:\n  {REGENERATE}",
            line + 1,
            committed.lines().nth(line).unwrap_or("<end>"),
            generated.lines().nth(line).unwrap_or("<end>"),
        );
    }
    assert_eq!(
        gateway::openapi::DOCUMENT,
        committed,
        "the gateway serves the committed file"
    );
}

#[test]
fn the_openapi_document_is_valid_3_1_and_names_every_public_route_with_its_refusals() {
    let text = generated();
    let document: Value = serde_json::from_str(&text).expect("the document is JSON");
    let version = document["openapi"].as_str().expect("an openapi version");
    assert!(version.starts_with("3.1"), "OpenAPI {version}, not 3.1");

    let operations = operations(&document);
    let seen: BTreeSet<(String, String)> = operations
        .iter()
        .map(|(method, path, _)| (method.clone(), path.clone()))
        .collect();
    let expected: BTreeSet<(String, String)> = PUBLIC_OPERATIONS
        .iter()
        .map(|(method, path)| (method.to_string(), path.to_string()))
        .collect();
    assert_eq!(seen, expected, "the document's operations");

    let mut ids = BTreeSet::new();
    for (method, path, operation) in &operations {
        let id = operation["operationId"].as_str().expect("an operationId");
        assert!(ids.insert(id.to_string()), "operationId {id} used twice");
        // Every error answer is the contract's body (a join's proof-of-work refusals: the
        // same with a fresh challenge).
        for (status, response) in operation["responses"].as_object().expect("responses") {
            if status.starts_with('4') || status.starts_with('5') {
                let schema = &response["content"]["application/json"]["schema"]["$ref"];
                let pow = path == "/api/rooms/{product_id}/join"
                    && ["403", "428"].contains(&status.as_str());
                let expected = if pow { "PowRefusal" } else { "ErrorBody" };
                assert_eq!(
                    *schema,
                    format!("#/components/schemas/{expected}"),
                    "{method} {path} {status}"
                );
            }
        }
        let room = gateway::room::is_room_path(path).then_some(gateway::proxy::Route {
            service: gateway::proxy::Service::SeckillApi,
            admin_only: false,
        });
        let Some(route) = gateway::proxy::route(path).or(room) else {
            assert!(
                gateway::ops::is_ops(path) || gateway::sale_page::is_page_path(path),
                "{path} is neither forwarded nor the gateway's"
            );
            assert!(operation.get("security").is_none(), "{path} needs no token");
            continue;
        };
        let roles: Vec<&str> = if route.admin_only {
            vec!["admin"]
        } else {
            vec![]
        };
        assert_eq!(
            operation["security"],
            serde_json::json!([{ "bearer": roles }]),
            "{method} {path}"
        );
        let mut statuses = vec!["401", "413", "429", "502", "503", "504"];
        if route.admin_only {
            statuses.push("403");
        }
        for status in statuses {
            assert!(
                operation["responses"].get(status).is_some(),
                "{method} {path} does not document the gateway's {status}"
            );
        }
    }
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    let purchase = &document["paths"]["/api/seckill/{product_id}"]["post"]["responses"];
    let too_many = purchase["429"]["description"].as_str().expect("429");
    assert!(too_many.contains("too_many_purchases"), "{too_many}");
    let unadmitted = purchase["428"]["description"].as_str().expect("428");
    assert!(unadmitted.contains("admission_required"), "{unadmitted}");
    let refusal = &document["components"]["schemas"]["PowRefusal"];
    for field in ["code", "message", "challenge", "bits", "expires_at_ms"] {
        assert!(
            refusal["required"]
                .as_array()
                .is_some_and(|r| r.contains(&Value::from(field))),
            "PowRefusal requires {field}: {refusal}"
        );
    }
    let with_pass = &document["paths"]["/api/seckill/{product_id}/{pass}"]["post"]["responses"];
    let refused = with_pass["403"]["description"].as_str().expect("403");
    assert!(refused.contains("pass_expired"), "{refused}");

    // The OpenAPI 3.1 meta-schema, checked by the reference validator (installed with the
    // suite's tools, scripts/tools.sh).
    let file = std::env::temp_dir().join(format!("seckill-openapi-{}.json", std::process::id()));
    std::fs::write(&file, &text).expect("write the document");
    let checked = std::process::Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&file)
        .output()
        .expect("python3 runs (scripts/tools.sh installs openapi-spec-validator)");
    let _ = std::fs::remove_file(&file);
    assert!(
        checked.status.success(),
        "openapi-spec-validator refused the document:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
}

#[tokio::test]
async fn the_gateway_serves_the_openapi_document_without_a_token() {
    let platform = spawn_platform().await;
    let response = platform
        .client
        .get(format!("{}/openapi.json", platform.gateway))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "served as JSON"
    );
    let body = response.text().await.expect("body");
    assert_eq!(body, gateway::openapi::DOCUMENT);
    let document: Value = serde_json::from_str(&body).expect("JSON");
    assert!(document["paths"]["/api/seckill/{product_id}"].is_object());
    platform.shutdown().await;
}
