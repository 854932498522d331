//! `docker-compose.yml` checked against the services' real settings and the rules that make
//! `docker compose up --scale` work. The configuration loader ignores variables it does not
//! know, so a typo or a renamed field would otherwise pass silently and run on a default.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_norway::{Mapping, Value};

/// The services built from this repository, each with the prefix of its own variables.
pub(crate) const OURS: [(&str, &str); 3] = [
    ("gateway", "SECKILL_GATEWAY_"),
    ("seckill-api", "SECKILL_API_"),
    ("order-service", "SECKILL_ORDER_"),
];

/// The infrastructure the backends wait for.
const INFRA: [&str; 3] = ["postgres", "redis", "rabbitmq"];

/// Scaled with `--scale`: a fixed container name or host port would stop a second replica.
const SCALABLE: [&str; 2] = ["seckill-api", "order-service"];

/// The compose file as written, before compose interpolates `${...}`.
pub(crate) fn compose_text() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docker-compose.yml");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// The parsed compose file, merge keys resolved.
pub(crate) fn compose() -> Value {
    let mut doc: Value = serde_norway::from_str(&compose_text())
        .unwrap_or_else(|e| panic!("parse docker-compose.yml: {e}"));
    // Compose resolves `<<:` merge keys, nested ones too (an anchor that merges another);
    // `apply_merge` resolves one level per pass, so repeat until nothing changes.
    loop {
        let before = doc.clone();
        doc.apply_merge()
            .expect("merge keys of docker-compose.yml resolve");
        if doc == before {
            return doc;
        }
    }
}

/// The `services` mapping.
pub(crate) fn services(doc: &Value) -> &Mapping {
    doc.get("services")
        .and_then(Value::as_mapping)
        .expect("docker-compose.yml has a `services` mapping")
}

/// One service, by name.
pub(crate) fn service<'a>(doc: &'a Value, name: &str) -> &'a Value {
    services(doc)
        .get(name)
        .unwrap_or_else(|| panic!("docker-compose.yml has no service `{name}`"))
}

/// The field names of a settings struct: the keys the configuration loader fills.
fn settings_fields<T: Default + Serialize>() -> BTreeSet<String> {
    match serde_json::to_value(T::default()).expect("settings serialize") {
        serde_json::Value::Object(fields) => fields.keys().cloned().collect(),
        other => panic!("settings serialize to an object, not {other}"),
    }
}

fn fields_of(service: &str) -> BTreeSet<String> {
    match service {
        "gateway" => settings_fields::<gateway::Settings>(),
        "seckill-api" => settings_fields::<seckill_api::Settings>(),
        "order-service" => settings_fields::<order_service::Settings>(),
        other => panic!("no settings known for `{other}`"),
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        other => panic!("an environment value must be a scalar, not {other:?}"),
    }
}

/// A service's environment, from either form compose accepts (mapping or `KEY=value` list).
pub(crate) fn environment(service: &Value) -> BTreeMap<String, String> {
    match service.get("environment") {
        None => BTreeMap::new(),
        Some(Value::Mapping(vars)) => vars
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().expect("variable names are strings").to_string(),
                    scalar_text(v),
                )
            })
            .collect(),
        Some(Value::Sequence(vars)) => vars
            .iter()
            .map(|entry| {
                let entry = entry
                    .as_str()
                    .expect("list entries are `KEY=value` strings");
                let (k, v) = entry.split_once('=').unwrap_or((entry, ""));
                (k.to_string(), v.to_string())
            })
            .collect(),
        Some(other) => panic!("environment must be a mapping or a list, not {other:?}"),
    }
}

/// The settings fields a variable may fill on a service whose own prefix is `own_prefix`:
/// the loader reads it both as a shared `SECKILL_` variable and, when it starts with the
/// service's own prefix, as one of its own (`SECKILL_ORDER_SIGNING_KEY` is the shared
/// `order_signing_key` and order-service's own `signing_key`).
fn fields_for(variable: &str, own_prefix: &str) -> Vec<String> {
    [
        variable.strip_prefix(own_prefix),
        variable.strip_prefix("SECKILL_"),
    ]
    .into_iter()
    .flatten()
    .map(str::to_ascii_lowercase)
    .collect()
}

#[test]
fn every_seckill_variable_on_a_service_names_one_of_its_settings() {
    let doc = compose();
    let mut unknown = Vec::new();
    for (name, own_prefix) in OURS {
        let fields = fields_of(name);
        let env = environment(service(&doc, name));
        let ours: Vec<&String> = env.keys().filter(|v| v.starts_with("SECKILL_")).collect();
        assert!(
            !ours.is_empty(),
            "`{name}` sets no SECKILL_ variable: nothing to check"
        );
        // SECKILL_CONFIG names the settings file; it is not a field.
        for variable in ours.into_iter().filter(|v| *v != "SECKILL_CONFIG") {
            let candidates = fields_for(variable, own_prefix);
            let known = candidates.iter().any(|f| fields.contains(f));
            if !known {
                unknown.push(format!("{name}: {variable} (no field {candidates:?})"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "variables no setting reads:\n{}",
        unknown.join("\n")
    );
}

#[test]
fn gateway_reaches_each_backend_by_its_service_name_and_port() {
    let doc = compose();
    let gateway = environment(service(&doc, "gateway"));
    let routes = [
        (
            "SECKILL_GATEWAY_SECKILL_API_URLS",
            "seckill-api",
            "SECKILL_API_PORT",
            seckill_api::Settings::default().port,
        ),
        (
            "SECKILL_GATEWAY_ORDER_SERVICE_URLS",
            "order-service",
            "SECKILL_ORDER_PORT",
            order_service::Settings::default().port,
        ),
    ];
    for (variable, backend, port_variable, default_port) in routes {
        let port = environment(service(&doc, backend))
            .get(port_variable)
            .map_or(default_port.to_string(), Clone::clone);
        let urls = gateway
            .get(variable)
            .unwrap_or_else(|| panic!("gateway does not set {variable}"));
        assert_eq!(urls, &format!("http://{backend}:{port}"), "{variable}");
    }
}

#[test]
fn gateway_and_backends_share_one_internal_key() {
    let doc = compose();
    let keys: BTreeSet<String> = OURS
        .iter()
        .map(|(name, _)| {
            environment(service(&doc, name))
                .remove("SECKILL_INTERNAL_KEY")
                .unwrap_or_else(|| panic!("`{name}` does not set SECKILL_INTERNAL_KEY"))
        })
        .collect();
    assert_eq!(keys.len(), 1, "different internal keys: {keys:?}");
}

#[test]
fn every_service_has_a_healthcheck() {
    let doc = compose();
    for name in OURS.iter().map(|(name, _)| *name).chain(INFRA) {
        service(&doc, name);
    }
    let mut unchecked = Vec::new();
    for (name, svc) in services(&doc) {
        let check = svc.get("healthcheck");
        let disabled = check
            .and_then(|c| c.get("disable"))
            .and_then(Value::as_bool)
            == Some(true);
        let probes = check
            .and_then(|c| c.get("test"))
            .is_some_and(|test| match test {
                Value::Sequence(argv) => argv.len() > 1 && argv[0].as_str() != Some("NONE"),
                Value::String(command) => !command.trim().is_empty(),
                _ => false,
            });
        if disabled || !probes {
            unchecked.push(format!("{name:?}"));
        }
    }
    assert!(
        unchecked.is_empty(),
        "services without a healthcheck: {}",
        unchecked.join(", ")
    );
}

#[test]
fn every_depends_on_waits_until_the_dependency_is_healthy() {
    let doc = compose();
    let all = services(&doc);
    let mut wrong = Vec::new();
    for (name, _) in OURS {
        assert!(
            service(&doc, name).get("depends_on").is_some(),
            "`{name}` depends on nothing: it would start before what it needs"
        );
    }
    for (name, svc) in all {
        match svc.get("depends_on") {
            None => {}
            Some(Value::Mapping(deps)) => {
                for (dep, spec) in deps {
                    let dep = dep.as_str().unwrap_or_default();
                    if !all.contains_key(dep) {
                        wrong.push(format!("{name:?} -> {dep}: no such service"));
                    }
                    let condition = spec.get("condition").and_then(Value::as_str);
                    if condition != Some("service_healthy") {
                        wrong.push(format!("{name:?} -> {dep}: condition {condition:?}"));
                    }
                }
            }
            // The list form only waits for the container to start.
            Some(other) => wrong.push(format!("{name:?}: depends_on {other:?} has no condition")),
        }
    }
    assert!(
        wrong.is_empty(),
        "depends_on not waiting for health:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn scalable_services_publish_no_host_port_and_have_no_container_name() {
    let doc = compose();
    for name in SCALABLE {
        let svc = service(&doc, name);
        assert!(
            svc.get("container_name").is_none(),
            "`{name}` has a container_name"
        );
        let ports = svc.get("ports");
        assert!(
            ports.is_none_or(|p| p.as_sequence().is_some_and(Vec::is_empty)),
            "`{name}` publishes ports {ports:?}: a second replica could not bind them"
        );
    }
}
