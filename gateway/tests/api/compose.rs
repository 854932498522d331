//! `docker-compose.yml` checked against the services' real settings and the rules that make
//! `docker compose up --scale` work. The configuration loader refuses a `SECKILL_*` variable
//! no service reads, but lets through one that another service reads; a variable here must
//! name a setting of the very service it is set on, or it runs on a default.

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
    let keys = values_on_ours(&compose(), "SECKILL_INTERNAL_KEY");
    assert_eq!(keys.len(), 1, "different internal keys: {keys:?}");
}

#[test]
fn gateway_and_backends_share_one_redis() {
    // The gateway hears on it when units go back on sale (its sold-out answers, and the
    // replicas' local flags, are forgotten then); without it the gateway answers no
    // sold-out purchase itself.
    let urls = values_on_ours(&compose(), "SECKILL_REDIS_URL");
    assert_eq!(urls.len(), 1, "different Redis URLs: {urls:?}");
}

/// The distinct values `variable` has on our services; every one of them must set it.
fn values_on_ours(doc: &Value, variable: &str) -> BTreeSet<String> {
    OURS.iter()
        .map(|(name, _)| {
            environment(service(doc, name))
                .remove(variable)
                .unwrap_or_else(|| panic!("`{name}` does not set {variable}"))
        })
        .collect()
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

/// The observability services beside the platform.
const OBSERVABILITY: [&str; 3] = ["prometheus", "grafana", "jaeger"];

/// A file of the repository, by its path from the root.
fn repo_file(path: &str) -> String {
    let full = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("read {full}: {e}"))
}

/// A YAML file of the repository, parsed.
fn repo_yaml(path: &str) -> Value {
    serde_norway::from_str(&repo_file(path)).unwrap_or_else(|e| panic!("parse {path}: {e}"))
}

/// The healthcheck's command of `name`, as one string.
fn healthcheck_command(doc: &Value, name: &str) -> String {
    match service(doc, name)
        .get("healthcheck")
        .and_then(|c| c.get("test"))
    {
        Some(Value::Sequence(argv)) => argv
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" "),
        Some(Value::String(command)) => command.clone(),
        other => panic!("`{name}` has no healthcheck command: {other:?}"),
    }
}

/// `host:container` mounts of a service, as written (`./deploy/...` on the host side).
fn mounts(doc: &Value, name: &str) -> BTreeMap<String, String> {
    let volumes = service(doc, name)
        .get("volumes")
        .and_then(Value::as_sequence);
    volumes
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|mount| {
            let mut parts = mount.split(':');
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

#[test]
fn observability_services_have_a_healthcheck_with_a_tool_their_image_ships() {
    let doc = compose();
    // Each image's own tools: prom/prometheus is busybox (wget, no curl); grafana/grafana
    // ships curl; jaegertracing/jaeger (v2) is Alpine (busybox wget) and answers its
    // healthcheckv2 extension on 13133.
    let expected = [
        (
            "prometheus",
            "prom/prometheus:",
            "wget -q -O /dev/null http://127.0.0.1:9090/-/ready",
        ),
        (
            "grafana",
            "grafana/grafana:",
            "curl -fsS -o /dev/null http://127.0.0.1:3000/api/health",
        ),
        (
            "jaeger",
            "jaegertracing/jaeger:2.",
            "wget -q -O /dev/null http://127.0.0.1:13133/status",
        ),
    ];
    for (name, image, probe) in expected {
        let svc = service(&doc, name);
        let actual = svc.get("image").and_then(Value::as_str).unwrap_or_default();
        assert!(
            actual.starts_with(image),
            "`{name}` runs {actual:?}, not {image}…"
        );
        assert_eq!(
            healthcheck_command(&doc, name),
            format!("CMD {probe}"),
            "{name}"
        );
    }
    assert_eq!(OBSERVABILITY.len(), expected.len());
}

#[test]
fn our_services_export_traces_to_jaeger_over_otlp_http() {
    let doc = compose();
    service(&doc, "jaeger");
    for (name, _) in OURS {
        let env = environment(service(&doc, name));
        assert_eq!(
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT").map(String::as_str),
            Some("http://jaeger:4318"),
            "{name}"
        );
        assert_eq!(
            env.get("OTEL_EXPORTER_OTLP_PROTOCOL").map(String::as_str),
            Some("http/protobuf"),
            "{name}"
        );
    }
}

/// The port each of our services serves `/metrics` on inside the container network.
fn metrics_port(doc: &Value, name: &str) -> u16 {
    let env = environment(service(doc, name));
    let (variable, default) = match name {
        "gateway" => {
            // The operator listener must listen beyond the container's loopback.
            assert_eq!(
                env.get("SECKILL_GATEWAY_ADMIN_HOST").map(String::as_str),
                Some("0.0.0.0"),
                "Prometheus cannot reach the gateway's operator listener"
            );
            (
                "SECKILL_GATEWAY_ADMIN_PORT",
                gateway::Settings::default().admin_port,
            )
        }
        "seckill-api" => ("SECKILL_API_PORT", seckill_api::Settings::default().port),
        "order-service" => (
            "SECKILL_ORDER_PORT",
            order_service::Settings::default().port,
        ),
        other => panic!("no metrics port known for `{other}`"),
    };
    env.get(variable)
        .map_or(default, |port| port.parse().expect("a port number"))
}

#[test]
fn prometheus_scrapes_every_replica_through_dns_service_discovery() {
    let doc = compose();
    let config = repo_yaml("deploy/prometheus/prometheus.yml");
    let jobs = config
        .get("scrape_configs")
        .and_then(Value::as_sequence)
        .expect("prometheus.yml has scrape_configs");
    for (name, _) in OURS {
        let job = jobs
            .iter()
            .find(|job| job.get("job_name").and_then(Value::as_str) == Some(name))
            .unwrap_or_else(|| panic!("no scrape job `{name}`"));
        // A static target would be one replica: the name must be resolved again and again.
        assert!(
            job.get("static_configs").is_none(),
            "`{name}`: static_configs"
        );
        let sd = job
            .get("dns_sd_configs")
            .and_then(Value::as_sequence)
            .unwrap_or_else(|| panic!("`{name}` has no dns_sd_configs"));
        assert_eq!(sd.len(), 1, "{name}");
        let names: Vec<&str> = sd[0]
            .get("names")
            .and_then(Value::as_sequence)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(names, [name], "`{name}` resolves another name");
        assert_eq!(
            sd[0].get("type").and_then(Value::as_str),
            Some("A"),
            "{name}"
        );
        let port = sd[0].get("port").and_then(Value::as_u64);
        assert_eq!(port, Some(u64::from(metrics_port(&doc, name))), "{name}");
        // /metrics is the default path; anything else would miss it.
        assert!(job.get("metrics_path").is_none_or(|p| p == "/metrics"));
    }
}

#[test]
fn prometheus_mounts_its_config_and_the_alert_rules_it_names() {
    let doc = compose();
    let config = repo_yaml("deploy/prometheus/prometheus.yml");
    let rules: Vec<&str> = config
        .get("rule_files")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(rules, ["/etc/prometheus/alerts.yml"]);
    let mounted = mounts(&doc, "prometheus");
    assert_eq!(
        mounted
            .get("./deploy/prometheus/prometheus.yml")
            .map(String::as_str),
        Some("/etc/prometheus/prometheus.yml")
    );
    assert_eq!(
        mounted
            .get("./deploy/prometheus/alerts.yml")
            .map(String::as_str),
        Some(rules[0])
    );
}

#[test]
fn grafana_is_provisioned_with_prometheus_and_the_dashboards_directory() {
    let doc = compose();
    let mounted = mounts(&doc, "grafana");
    assert_eq!(
        mounted
            .get("./deploy/grafana/provisioning")
            .map(String::as_str),
        Some("/etc/grafana/provisioning")
    );
    let dashboards_dir = mounted
        .get("./deploy/grafana/dashboards")
        .expect("deploy/grafana/dashboards is mounted");

    let sources = repo_yaml("deploy/grafana/provisioning/datasources/prometheus.yml");
    let sources = sources
        .get("datasources")
        .and_then(Value::as_sequence)
        .expect("datasources");
    let prometheus = sources
        .iter()
        .find(|s| s.get("uid").and_then(Value::as_str) == Some("prometheus"))
        .expect("a datasource with uid `prometheus`");
    assert_eq!(prometheus["type"], "prometheus");
    // Grafana's server side reaches Prometheus by its service name and container port.
    assert_eq!(prometheus["url"], "http://prometheus:9090");
    service(&doc, "prometheus");

    let providers = repo_yaml("deploy/grafana/provisioning/dashboards/seckill.yml");
    let providers = providers
        .get("providers")
        .and_then(Value::as_sequence)
        .expect("providers");
    assert!(
        providers.iter().any(|p| p["type"] == "file"
            && p["options"]["path"].as_str() == Some(dashboards_dir.as_str())),
        "no file provider loads {dashboards_dir}"
    );
    assert_eq!(
        environment(service(&doc, "grafana"))
            .get("GF_SECURITY_ADMIN_PASSWORD")
            .map(String::as_str),
        Some("${GRAFANA_ADMIN_PASSWORD:?run scripts/compose-env.sh to write .env}")
    );
}

#[test]
fn promtool_accepts_the_prometheus_config() {
    // promtool checks that every rule file exists: check a copy next to the real rules
    // (deploy/prometheus/alerts.yml) or, before they exist, a stub.
    let dir = std::env::temp_dir().join(format!("seckill-promtool-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let config = repo_file("deploy/prometheus/prometheus.yml");
    assert!(config.contains("/etc/prometheus/alerts.yml"));
    std::fs::write(
        dir.join("prometheus.yml"),
        config.replace("/etc/prometheus/alerts.yml", "alerts.yml"),
    )
    .expect("write config");
    let rules = format!(
        "{}/../deploy/prometheus/alerts.yml",
        env!("CARGO_MANIFEST_DIR")
    );
    let rules = std::fs::read_to_string(&rules)
        .unwrap_or_else(|_| "groups:\n  - name: stub\n    rules: []\n".into());
    std::fs::write(dir.join("alerts.yml"), rules).expect("write rules");
    let output = std::process::Command::new("promtool")
        .args(["check", "config"])
        .arg(dir.join("prometheus.yml"))
        .output()
        .expect("run promtool (Debian's `prometheus` package; scripts/tools.sh installs it)");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        output.status.success(),
        "promtool check config:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_compose_tool_accepts_the_file_and_refuses_it_without_secrets() {
    // scripts/check-compose.sh runs `docker compose config` (or docker-compose v1, which
    // scripts/tools.sh installs; neither needs a Docker engine for this) with the variables
    // scripts/compose-env.sh writes, and again without them, which must fail.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/check-compose.sh");
    let output = std::process::Command::new("bash")
        .arg(script)
        .output()
        .expect("run scripts/check-compose.sh");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "check-compose.sh failed:\n{said}");
    assert!(
        said.contains("docker compose config)") || said.contains("docker-compose config)"),
        "no compose tool validated the file (run scripts/tools.sh):\n{said}"
    );
}

#[test]
fn the_image_builds_without_a_registry_frontend_and_without_debug_info() {
    let dockerfile = repo_file("Dockerfile");
    assert!(
        !dockerfile
            .lines()
            .any(|l| l.trim_start().to_ascii_lowercase().starts_with("# syntax")),
        "a `# syntax=` line makes every build pull a frontend from a registry"
    );
    assert!(
        dockerfile.contains("--mount=type=cache"),
        "the cache mounts are gone"
    );
    assert!(
        dockerfile.contains("strip --strip-debug /out/*"),
        "the runtime image's binaries keep their debug info"
    );
    for binary in [
        "gateway",
        "seckill-api",
        "order-service",
        "seckill-loadtest",
        "seckill-token",
    ] {
        assert!(
            dockerfile.contains(&format!("target/release/{binary} ")),
            "{binary}"
        );
    }
    let ignored = repo_file(".dockerignore");
    assert!(
        ignored.lines().any(|l| l.trim() == ".env"),
        "the secrets in .env would enter the build context"
    );
}
