//! What `docker-compose.yml` exposes: only the gateway is published beyond the host's
//! loopback, and no credential has a default (no `guest`, no public development secret), so
//! a deployment without its own secrets does not start at all.

use serde_norway::Value;

use crate::compose::{OURS, compose, compose_text, environment, service, services};

/// The one service the outside world may reach.
const PUBLIC: &str = "gateway";

/// Where each credential is set: (service, variable). Each must come from the environment.
const CREDENTIALS: [(&str, &str); 10] = [
    ("postgres", "POSTGRES_PASSWORD"),
    ("rabbitmq", "RABBITMQ_DEFAULT_USER"),
    ("rabbitmq", "RABBITMQ_DEFAULT_PASS"),
    ("gateway", "SECKILL_JWT_SECRET"),
    ("gateway", "SECKILL_INTERNAL_KEY"),
    ("seckill-api", "SECKILL_INTERNAL_KEY"),
    ("order-service", "SECKILL_INTERNAL_KEY"),
    ("seckill-api", "SECKILL_ORDER_SIGNING_KEY"),
    ("order-service", "SECKILL_ORDER_SIGNING_KEY"),
    ("grafana", "GF_SECURITY_ADMIN_PASSWORD"),
];

/// Every port the stack publishes on the host: (service, host port, container port). The
/// gateway's on every interface, each other on the host's loopback only.
const PUBLISHED: [(&str, u16, u16); 7] = [
    ("gateway", 8080, 8080),
    ("rabbitmq", 15672, 15672),
    ("postgres", 15432, 5432),
    ("redis", 16379, 6379),
    ("prometheus", 9090, 9090),
    ("grafana", 3000, 3000),
    ("jaeger", 16686, 16686),
];

/// Store URLs of the backends: each carries a password, from the environment.
const STORE_URLS: [&str; 3] = [
    "SECKILL_DATABASE_URL",
    "SECKILL_REDIS_URL",
    "SECKILL_AMQP_URL",
];

/// The host address a published port binds, from either form compose accepts: `None` for
/// every interface.
fn host_ip(port: &Value) -> Option<String> {
    match port {
        Value::Mapping(long) => long
            .get("host_ip")
            .and_then(Value::as_str)
            .map(String::from),
        // "[HOST_IP:]HOST_PORT:CONTAINER_PORT[/PROTOCOL]", or a bare container port.
        Value::String(short) => {
            let parts: Vec<&str> = short.split(':').collect();
            (parts.len() == 3).then(|| parts[0].to_string())
        }
        _ => None,
    }
}

/// (host port, container port) of a published port, from either form compose accepts.
fn host_and_container_port(port: &Value) -> Option<(u16, u16)> {
    let number = |v: &Value| match v {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    };
    match port {
        Value::Mapping(long) => Some((
            number(long.get("published")?)?,
            number(long.get("target")?)?,
        )),
        Value::String(short) => {
            let parts: Vec<&str> = short.split(':').collect();
            let [host, container] = &parts[parts.len().checked_sub(2)?..] else {
                return None;
            };
            Some((host.parse().ok()?, container.parse().ok()?))
        }
        _ => None,
    }
}

#[test]
fn only_the_gateway_publishes_a_port_beyond_loopback() {
    let doc = compose();
    let mut exposed = Vec::new();
    for (name, svc) in services(&doc) {
        let name = name.as_str().unwrap_or_default();
        if svc.get("network_mode").and_then(Value::as_str) == Some("host") {
            exposed.push(format!("{name}: network_mode host"));
        }
        let ports = svc.get("ports").and_then(Value::as_sequence);
        for port in ports.into_iter().flatten() {
            if name != PUBLIC && host_ip(port).as_deref() != Some("127.0.0.1") {
                exposed.push(format!("{name}: {port:?}"));
            }
        }
    }
    assert!(
        exposed.is_empty(),
        "published beyond loopback:\n{}",
        exposed.join("\n")
    );
    let gateway = service(&doc, PUBLIC).get("ports");
    assert!(gateway.is_some(), "the gateway publishes no port");
}

/// Whether `value` is exactly one required interpolation, `${NAME:?message}`: compose stops
/// when NAME is unset or empty instead of falling back to a default.
fn is_required_variable(value: &str) -> bool {
    value.starts_with("${")
        && value.ends_with('}')
        && value.matches("${").count() == 1
        && value.contains(":?")
}

#[test]
fn every_credential_comes_from_the_environment_without_a_default() {
    let doc = compose();
    let mut defaulted = Vec::new();
    for (name, variable) in CREDENTIALS {
        let value = environment(service(&doc, name)).remove(variable);
        match value {
            Some(value) if is_required_variable(&value) => {}
            other => defaulted.push(format!("{name}: {variable} = {other:?}")),
        }
    }
    for (name, _) in OURS.iter().filter(|(name, _)| *name != PUBLIC) {
        let env = environment(service(&doc, name));
        for variable in STORE_URLS {
            let url = env.get(variable).map(String::as_str).unwrap_or_default();
            // scheme://[user]:PASSWORD@host — the password sits between the last ':' and '@'
            // of the user-info part.
            let password = url
                .split_once("://")
                .and_then(|(_, rest)| rest.rsplit_once('@'))
                .and_then(|(user_info, _)| user_info.split_once(":${"))
                .map(|(_, password)| format!("${{{password}"));
            if !password.as_deref().is_some_and(is_required_variable) {
                defaulted.push(format!(
                    "{name}: {variable} = {url:?} (no password from the environment)"
                ));
            }
        }
    }
    let redis = service(&doc, "redis")
        .get("command")
        .and_then(Value::as_sequence);
    let args: Vec<&str> = redis
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let password = args
        .iter()
        .position(|arg| *arg == "--requirepass")
        .and_then(|i| args.get(i + 1));
    if !password.is_some_and(|p| is_required_variable(p)) {
        defaulted.push(format!(
            "redis: no --requirepass from the environment in {args:?}"
        ));
    }
    assert!(
        defaulted.is_empty(),
        "credentials not required from the environment:\n{}",
        defaulted.join("\n")
    );
}

/// The file without its comments (which may well explain why there is no guest account).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| match line.find('#') {
            Some(at) if at == 0 || line[..at].ends_with(char::is_whitespace) => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_guest_account_or_public_secret_appears_anywhere_in_the_file() {
    let text = without_comments(&compose_text());
    let lower = text.to_ascii_lowercase();
    for public in [
        "guest",
        seckill_config::DEV_JWT_SECRET,
        seckill_config::DEV_INTERNAL_KEY,
        "change-me",
        "postgres:postgres@",
    ] {
        assert!(
            !lower.contains(public),
            "docker-compose.yml mentions {public:?}"
        );
    }
    // A secret-looking variable interpolated with a default (`${X:-v}`, `${X-v}`) or
    // optionally (`${X}`) would let compose start without it.
    let mut optional = Vec::new();
    for interpolation in text.split("${").skip(1) {
        let name: String = interpolation
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let secret = ["PASS", "SECRET", "KEY", "USER"]
            .iter()
            .any(|word| name.contains(word));
        if secret && !interpolation[name.len()..].starts_with(":?") {
            optional.push(name);
        }
    }
    assert!(
        optional.is_empty(),
        "secrets compose would start without: {optional:?}"
    );
}

#[test]
fn the_published_ports_are_exactly_the_known_ones() {
    let doc = compose();
    let mut published = Vec::new();
    for (name, svc) in services(&doc) {
        let name = name.as_str().unwrap_or_default();
        let ports = svc.get("ports").and_then(Value::as_sequence);
        for port in ports.into_iter().flatten() {
            let (host, container) = host_and_container_port(port)
                .unwrap_or_else(|| panic!("{name}: cannot read the published port {port:?}"));
            let loopback = host_ip(port).as_deref() == Some("127.0.0.1");
            published.push((name.to_string(), host, container, loopback));
        }
    }
    published.sort();
    let mut expected: Vec<(String, u16, u16, bool)> = PUBLISHED
        .iter()
        .map(|(name, host, container)| (name.to_string(), *host, *container, *name != PUBLIC))
        .collect();
    expected.sort();
    assert_eq!(
        published, expected,
        "published (service, host port, container port, loopback only)"
    );
}

#[test]
fn grafana_prometheus_and_jaeger_are_published_on_loopback_only() {
    let doc = compose();
    for (name, ui) in [("grafana", 3000), ("prometheus", 9090), ("jaeger", 16686)] {
        let ports = service(&doc, name)
            .get("ports")
            .and_then(Value::as_sequence)
            .unwrap_or_else(|| panic!("`{name}` publishes no port: its UI is unreachable"));
        assert_eq!(
            ports.len(),
            1,
            "`{name}` publishes more than its UI: {ports:?}"
        );
        assert_eq!(host_ip(&ports[0]).as_deref(), Some("127.0.0.1"), "{name}");
        assert_eq!(host_and_container_port(&ports[0]), Some((ui, ui)), "{name}");
    }
    // Jaeger's OTLP receivers and the gateway's operator port stay on the container network.
    for (name, port) in [("jaeger", 4317), ("jaeger", 4318), ("gateway", 9080)] {
        let ports = service(&doc, name)
            .get("ports")
            .and_then(Value::as_sequence);
        let published = ports
            .into_iter()
            .flatten()
            .filter_map(host_and_container_port)
            .any(|(_, container)| container == port);
        assert!(!published, "`{name}` publishes {port}");
    }
}
