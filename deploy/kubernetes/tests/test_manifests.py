"""The Kubernetes manifests of both overlays, rendered offline and checked against the
repository's other sources of truth: the schemas (kubernetes-validate), docker-compose.yml
(what is exposed, which variables are secrets, the health checks), the services' settings
and source (which settings are secrets, ports, shutdown, pool sizes, queue names), the
alert rules and docs/metrics.md.
The same kind of checks as gateway/tests/api/compose_exposure.rs, for Kubernetes.

Run by scripts/check-kubernetes.sh (`python3 -m unittest discover -s deploy/kubernetes/tests`).
SECKILL_DEPLOY_DIR points the checks at another copy of deploy/ (to see one fail on a
broken copy); everything else is read from the repository.
"""

import base64
import os
import re
import shutil
import subprocess
import sys
import unittest

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEPLOY = os.environ.get("SECKILL_DEPLOY_DIR", os.path.join(REPO, "deploy"))
KUBERNETES = os.path.join(DEPLOY, "kubernetes")
sys.path.insert(0, KUBERNETES)

import render  # noqa: E402

OVERLAYS = ("dev", "production")
# The Kubernetes version the schemas are checked against: the oldest still supported
# upstream when these manifests were written.
KUBERNETES_VERSION = "1.31.0"
SERVICES = ("gateway", "seckill-api", "order-service")
BACKENDS = ("seckill-api", "order-service")
SECRET = "seckill-secrets"
# Custom resources kubernetes-validate has no schema for: each is checked structurally
# below (test_custom_resources_*), and any other unknown kind fails.
CUSTOM_KINDS = {
    "ServiceMonitor",
    "PrometheusRule",
    "ScaledObject",
    "TriggerAuthentication",
    "RabbitmqCluster",
    "Cluster",
}


def read(*path):
    with open(os.path.join(REPO, *path), encoding="utf-8") as f:
        return f.read()


def rust_default(path, pattern):
    """A value from a service's source, by a regex with one group."""
    match = re.search(pattern, read(*path))
    assert match, f"{'/'.join(path)}: no match for {pattern!r}"
    return match.group(1)


_RENDERED = {}


def rendered(overlay):
    if overlay not in _RENDERED:
        _RENDERED[overlay] = render.render(os.path.join(KUBERNETES, overlay))
    return _RENDERED[overlay]


def of_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def named(objects, kind, name):
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"{kind}/{name}: {len(hits)} rendered"
    return hits[0]


def workloads(objects):
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def container(deployment):
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container expected"
    return containers[0]


def compose():
    return yaml.safe_load(read("docker-compose.yml"))


def compose_environment(service):
    env = compose()["services"][service].get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def compose_secret_variables(service):
    """The variables compose takes from the secrets in `.env`: required interpolations."""
    return sorted(k for k, v in compose_environment(service).items() if ":?" in v)


def compose_health_url(service):
    """(port, path) of the URL compose's healthcheck of `service` fetches."""
    test = compose()["services"][service]["healthcheck"]["test"]
    url = next(arg for arg in test if str(arg).startswith("http://"))
    match = re.fullmatch(r"http://(?:localhost|127\.0\.0\.1):(\d+)(/\S*)", url)
    assert match, f"{service}: healthcheck URL {url!r}"
    return int(match.group(1)), match.group(2)


def labels_match(selector, labels):
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        present = expr["key"] in labels
        value = labels.get(expr["key"])
        op = expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


class Pod:
    """A pod as a NetworkPolicy sees it: labels, namespace, named ports."""

    def __init__(self, labels, namespace, ports=None):
        self.labels = labels
        self.namespace = namespace
        self.ports = ports or {}


def pods(objects):
    """Every workload's pod, by its app.kubernetes.io/name."""
    out = {}
    for w in workloads(objects):
        spec = w["spec"]["template"]
        ports = {
            p["name"]: p["containerPort"]
            for c in spec["spec"]["containers"]
            for p in c.get("ports", [])
            if "name" in p
        }
        labels = spec["metadata"]["labels"]
        out[labels["app.kubernetes.io/name"]] = Pod(labels, w["metadata"]["namespace"], ports)
    return out


def allowed(objects, source, target, port):
    """Whether the NetworkPolicies let `source` (a Pod, or None: outside the cluster)
    open `port` on `target`, as Kubernetes evaluates ingress policies."""
    selecting = [
        p
        for p in of_kind(objects, "NetworkPolicy")
        if p["metadata"]["namespace"] == target.namespace
        and labels_match(p["spec"]["podSelector"] or {"matchLabels": {}}, target.labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress") or []:
            ports = rule.get("ports")
            if ports and not any(
                (target.ports.get(p["port"]) if isinstance(p["port"], str) else p["port"]) == port
                for p in ports
            ):
                continue
            peers = rule.get("from")
            if not peers:
                return True
            for peer in peers:
                # An address range: the checks know no pod's address, so it is taken to
                # admit any source, from outside the cluster or not (`except` or not).
                if "ipBlock" in peer:
                    return True
                if source is None:
                    continue
                ns_selector = peer.get("namespaceSelector")
                if ns_selector is not None:
                    ns_labels = {"kubernetes.io/metadata.name": source.namespace}
                    if not labels_match(ns_selector, ns_labels) and ns_selector != {}:
                        continue
                elif source.namespace != policy["metadata"]["namespace"]:
                    continue
                pod_selector = peer.get("podSelector")
                if pod_selector is None or pod_selector == {} or labels_match(pod_selector, source.labels):
                    return True
    return False


class SchemaTest(unittest.TestCase):
    def test_every_rendered_object_is_valid_for_its_kind(self):
        try:
            import kubernetes_validate
        except ImportError:
            self.fail("kubernetes-validate is missing: run scripts/tools.sh (pip install kubernetes-validate)")
        for overlay in OVERLAYS:
            for obj in rendered(overlay):
                name = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
                if obj["kind"] in CUSTOM_KINDS:
                    continue
                with self.subTest(name):
                    try:
                        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
                    except kubernetes_validate.ValidationError as e:
                        self.fail(f"{name}: {e.message} at {'.'.join(map(str, e.path))}")
                    except kubernetes_validate.SchemaNotFoundError:
                        self.fail(f"{name}: no schema, and not a custom resource checked here")


def kubectl_kustomize():
    """Whether a kubectl with kustomize built in (1.21 and later) is on PATH."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return False
    probe = subprocess.run([kubectl, "kustomize", "--help"], capture_output=True)
    return probe.returncode == 0


def comparable(obj):
    """An object with a Secret's data decoded (kustomize wraps long base64 lines)."""
    if obj["kind"] == "Secret":
        obj = dict(obj)
        obj["data"] = {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
    return obj


class RendererTest(unittest.TestCase):
    @unittest.skipUnless(kubectl_kustomize(), "no kubectl with kustomize on PATH to compare with")
    def test_renderer_renders_what_kubectl_kustomize_renders(self):
        for overlay in OVERLAYS:
            path = os.path.join(KUBERNETES, overlay)
            out = subprocess.run(["kubectl", "kustomize", path], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, f"kubectl kustomize {overlay}: {out.stderr}")
            key = lambda o: (o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])  # noqa: E731
            theirs = {key(o): comparable(o) for o in yaml.safe_load_all(out.stdout) if o}
            ours = {key(o): comparable(o) for o in rendered(overlay)}
            self.assertEqual(sorted(ours), sorted(theirs), f"{overlay}: different objects")
            for k in ours:
                self.assertEqual(ours[k], theirs[k], f"{overlay}: {k} differs")


class CustomResourcesTest(unittest.TestCase):
    """The kinds without a schema in kubernetes-validate: what they refer to exists."""

    def test_custom_resources_are_only_the_kinds_checked_here(self):
        for overlay in OVERLAYS:
            for obj in rendered(overlay):
                if "." in obj["apiVersion"].split("/")[0] and not obj["apiVersion"].startswith(
                    ("apps/", "policy/", "autoscaling/", "networking.k8s.io/")
                ):
                    self.assertIn(obj["kind"], CUSTOM_KINDS, f"{overlay}: unchecked custom kind")

    def test_custom_resources_service_monitors_select_services_and_ports_that_exist(self):
        objects = rendered("production")
        monitors = of_kind(objects, "ServiceMonitor")
        self.assertTrue(monitors, "no ServiceMonitor in production")
        scraped = set()
        for monitor in monitors:
            services = [
                s
                for s in of_kind(objects, "Service")
                if labels_match(monitor["spec"]["selector"], s["metadata"].get("labels", {}))
            ]
            self.assertTrue(services, f"{monitor['metadata']['name']} selects no Service")
            for endpoint in monitor["spec"]["endpoints"]:
                # The metrics carry their own `service` label (docs/metrics.md), which the
                # alert rules select on: the target's must not replace it.
                self.assertIs(
                    endpoint.get("honorLabels"),
                    True,
                    f"{monitor['metadata']['name']}: honorLabels must be true",
                )
                self.assertEqual(endpoint.get("path"), "/metrics")
                for service in services:
                    ports = [p["name"] for p in service["spec"]["ports"]]
                    self.assertIn(endpoint["port"], ports, f"{service['metadata']['name']}")
                    scraped.add(service["spec"]["selector"]["app.kubernetes.io/name"])
        self.assertEqual(scraped, set(SERVICES), "every service is scraped")

    def test_custom_resources_prometheus_rule_holds_exactly_the_compose_alert_rules(self):
        with open(os.path.join(DEPLOY, "prometheus", "alerts.yml"), encoding="utf-8") as f:
            groups = yaml.safe_load(f)["groups"]
        rule = named(rendered("production"), "PrometheusRule", "seckill-alerts")
        self.assertEqual(
            rule["spec"]["groups"],
            groups,
            "monitoring/prometheusrule.yaml differs from deploy/prometheus/alerts.yml: "
            "run deploy/kubernetes/render.py --sync-rules",
        )

    def test_custom_resources_dashboard_config_map_is_the_compose_dashboard(self):
        with open(os.path.join(DEPLOY, "grafana", "dashboards", "seckill.json"), encoding="utf-8") as f:
            dashboard = f.read()
        cm = named(rendered("production"), "ConfigMap", "seckill-dashboard")
        self.assertEqual(cm["data"], {"seckill.json": dashboard})
        self.assertEqual(cm["metadata"]["labels"].get("grafana_dashboard"), "1")

    def test_custom_resources_scaled_object_watches_the_orders_queue_the_services_declare(self):
        objects = rendered("production")
        scaled = named(objects, "ScaledObject", "order-service")
        target = scaled["spec"]["scaleTargetRef"]["name"]
        named(objects, "Deployment", target)
        pattern = rust_default(
            ("crates", "messaging", "src", "topology.rs"), r'queue: format!\("\{namespace\}(\.[^"]+)"\)'
        )
        namespace = named(objects, "ConfigMap", "backend-config")["data"]["SECKILL_NAMESPACE"]
        (trigger,) = scaled["spec"]["triggers"]
        self.assertEqual(trigger["type"], "rabbitmq")
        self.assertEqual(trigger["metadata"]["queueName"], namespace + pattern)
        self.assertEqual(trigger["metadata"]["mode"], "QueueLength")
        auth = named(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        (ref,) = auth["spec"]["secretTargetRef"]
        self.assertEqual((ref["parameter"], ref["name"], ref["key"]), ("host", SECRET, "SECKILL_AMQP_URL"))
        self.assertLessEqual(scaled["spec"]["maxReplicaCount"], 10)
        hpa_targets = [h["spec"]["scaleTargetRef"]["name"] for h in of_kind(objects, "HorizontalPodAutoscaler")]
        self.assertNotIn(target, hpa_targets, "KEDA makes order-service's HPA; a second would fight it")

    def test_custom_resources_stores_are_three_node_operator_clusters(self):
        objects = rendered("production")
        rabbit = named(objects, "RabbitmqCluster", "seckill-rabbitmq")
        self.assertEqual(rabbit["apiVersion"], "rabbitmq.com/v1beta1")
        self.assertEqual(rabbit["spec"]["replicas"], 3)
        pg = named(objects, "Cluster", "seckill-pg")
        self.assertEqual(pg["apiVersion"], "postgresql.cnpg.io/v1")
        self.assertGreaterEqual(pg["spec"]["instances"], 3)
        self.assertEqual(pg["spec"]["bootstrap"]["initdb"]["database"], "seckill")
        redis = named(objects, "Service", "seckill-redis")
        self.assertEqual(redis["spec"]["type"], "ExternalName")
        self.assertEqual(
            named(objects, "ConfigMap", "backend-config")["data"].get("SECKILL_AMQP_QUEUE_TYPE"), "quorum"
        )


class ExposureTest(unittest.TestCase):
    def test_only_the_gateway_is_exposed_outside_the_cluster(self):
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service in of_kind(objects, "Service"):
                kind = service["spec"].get("type", "ClusterIP")
                selector = (service["spec"].get("selector") or {}).get("app.kubernetes.io/name")
                if kind in ("LoadBalancer", "NodePort") or service["spec"].get("externalIPs"):
                    self.assertEqual(selector, "gateway", f"{overlay}: {service['metadata']['name']} is {kind}")
                    self.assertEqual(
                        [p["targetPort"] for p in service["spec"]["ports"]],
                        ["http"],
                        f"{overlay}: only the public port, never the operator listener",
                    )
            for ingress in of_kind(objects, "Ingress"):
                backends = re.findall(r"'name': '([^']+)'", str(ingress["spec"]))
                self.assertEqual(set(backends), {"gateway"}, f"{overlay}: Ingress reaches {backends}")
            for w in workloads(objects):
                spec = w["spec"]["template"]["spec"]
                self.assertFalse(spec.get("hostNetwork"), f"{overlay}: {w['metadata']['name']} hostNetwork")
                for c in spec["containers"]:
                    for p in c.get("ports", []):
                        self.assertNotIn("hostPort", p, f"{overlay}: {w['metadata']['name']} hostPort")
            public = [
                s["metadata"]["name"]
                for s in of_kind(objects, "Service")
                if s["spec"].get("type") in ("LoadBalancer", "NodePort")
            ]
            self.assertEqual(public, ["gateway"], f"{overlay}: the gateway must be reachable")

    def test_network_policies_let_only_the_gateway_be_reached_from_outside(self):
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            p = pods(objects)
            ns = p["gateway"].namespace
            gateway, api, orders = p["gateway"], p["seckill-api"], p["order-service"]
            prometheus = Pod({"app.kubernetes.io/name": "prometheus"}, "monitoring")
            stranger = Pod({"app.kubernetes.io/name": "debug"}, ns)
            elsewhere = Pod({"app.kubernetes.io/name": "gateway"}, "other")
            admin = gateway.ports["admin"]
            checks = [
                (None, gateway, gateway.ports["http"], True),
                (None, gateway, admin, False),
                (prometheus, gateway, admin, True),
                (stranger, gateway, admin, False),
                (None, api, 8081, False),
                (None, orders, 8082, False),
                (gateway, api, 8081, True),
                (gateway, orders, 8082, True),
                (prometheus, api, 8081, True),
                (prometheus, orders, 8082, True),
                (stranger, api, 8081, False),
                (stranger, orders, 8082, False),
                (elsewhere, api, 8081, False),
                (orders, api, 8081, False),
            ]
            stores = {
                "dev": {"redis": 6379, "rabbitmq": 5672, "postgres": 5432},
                "production": {"seckill-rabbitmq": 5672, "seckill-pg": 5432},
            }[overlay]
            store_pods = {
                "seckill-rabbitmq": Pod({"app.kubernetes.io/name": "seckill-rabbitmq"}, ns),
                "seckill-pg": Pod({"cnpg.io/cluster": "seckill-pg"}, ns),
            }
            for store, port in stores.items():
                target = p.get(store) or store_pods[store]
                checks += [
                    (None, target, port, False),
                    (stranger, target, port, False),
                    (prometheus, target, port, False),
                    (api, target, port, True),
                    (orders, target, port, True),
                    (gateway, target, port, store == "redis"),
                ]
            for source, target, port, expected in checks:
                who = source.labels["app.kubernetes.io/name"] + "@" + source.namespace if source else "outside"
                what = target.labels.get("app.kubernetes.io/name") or target.labels
                with self.subTest(overlay=overlay, source=who, target=what, port=port):
                    self.assertEqual(
                        allowed(objects, source, target, port),
                        expected,
                        f"{overlay}: {who} -> {what}:{port} should be {'allowed' if expected else 'refused'}",
                    )


class SecretsTest(unittest.TestCase):
    def test_every_secret_compose_takes_from_the_environment_comes_from_a_secret(self):
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service in SERVICES:
                env = {e["name"]: e for e in container(named(objects, "Deployment", service)).get("env", [])}
                for variable in compose_secret_variables(service):
                    with self.subTest(overlay=overlay, service=service, variable=variable):
                        self.assertIn(variable, env, f"{overlay}: {service} lacks {variable}")
                        ref = env[variable].get("valueFrom", {}).get("secretKeyRef")
                        self.assertEqual(
                            ref, {"name": SECRET, "key": variable}, f"{overlay}: {service} {variable} not from the Secret"
                        )

    def test_secret_settings_are_found_in_the_code_as_the_configuration_reference_names_them(self):
        variables = secret_variables()
        reference = read("docs", "configuration.md")
        for variable in sorted(variables):
            self.assertIn(f"`{variable}`", reference, "a secret variable docs/configuration.md does not list")
        for variable in (
            "SECKILL_JWT_SECRET",
            "SECKILL_DATABASE_URL",
            "SECKILL_GATEWAY_SECKILL_API_INTERNAL_KEY",
            "SECKILL_ORDER_SIGNING_KEY_PREVIOUS",
            "SECKILL_API_INTERNAL_KEY",
        ):
            self.assertIn(variable, variables, "the secret-typed settings were not all found")
        for service in SERVICES:
            for variable in compose_secret_variables(service):
                self.assertIn(variable, variables, f"compose takes {variable} as a secret; the code does not type it so")

    def test_no_config_map_holds_a_secret(self):
        secret_names = secret_variables()
        secret_names |= {v for s in SERVICES for v in compose_secret_variables(s)}
        secret_names |= {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "RABBITMQ_PASSWORD"}
        dev_values = self.dev_values()
        for overlay in OVERLAYS:
            for cm in of_kind(rendered(overlay), "ConfigMap"):
                for key, value in (cm.get("data") or {}).items():
                    with self.subTest(overlay=overlay, config_map=cm["metadata"]["name"], key=key):
                        self.assertFalse(key in secret_names, f"{overlay}: secret {key} in a ConfigMap")
                        self.assertFalse(re.search(r"://[^/@\s]*:[^/@\s]*@", value), f"{key}: a URL with a password")
                        for dev in dev_values:
                            self.assertNotIn(dev, value)
            for w in workloads(rendered(overlay)):
                for c in w["spec"]["template"]["spec"]["containers"]:
                    for e in c.get("env", []):
                        if e["name"] in secret_names:
                            with self.subTest(overlay=overlay, workload=w["metadata"]["name"], variable=e["name"]):
                                self.assertIn(
                                    "secretKeyRef",
                                    e.get("valueFrom", {}),
                                    f"{overlay}: {e['name']} of {w['metadata']['name']} not from a Secret",
                                )

    @staticmethod
    def dev_values():
        source = read("crates", "config", "src", "lib.rs")
        values = re.findall(r'pub const DEV_[A-Z_]+: &str = "([^"]+)";', source)
        assert len(values) >= 3, "the public development secrets were not found"
        return values

    def test_production_has_no_public_secret_and_never_allows_one(self):
        objects = rendered("production")
        self.assertEqual(of_kind(objects, "Secret"), [], "production's Secret is created out of the repository")
        text = yaml.safe_dump_all(objects)
        for dev in self.dev_values() + ["SECKILL_ALLOW_DEV_SECRETS", "guest:guest", "postgres:postgres@"]:
            self.assertNotIn(dev, text, f"production mentions {dev!r}")

    def test_dev_secret_holds_every_key_the_pods_read(self):
        objects = rendered("dev")
        secret = named(objects, "Secret", SECRET)
        for w in workloads(objects):
            for c in w["spec"]["template"]["spec"]["containers"]:
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        self.assertEqual(ref["name"], SECRET)
                        self.assertIn(ref["key"], secret["data"], f"{w['metadata']['name']}: {ref['key']}")
        for name in ("backend-config", "gateway-config"):
            self.assertEqual(named(objects, "ConfigMap", name)["data"].get("SECKILL_ALLOW_DEV_SECRETS"), "true")


def settings_fields(path, struct, secret_only=False):
    """The variable-name suffixes of a Rust settings struct: its field names, or the
    `#[serde(rename = "…")]` given to one; with `secret_only`, of the fields typed
    `Secret` or `Option<Secret>` only."""
    source = read(*path)
    body = re.search(r"pub struct " + struct + r" \{(.*?)\n\}", source, re.S)
    assert body, f"{'/'.join(path)}: no struct {struct}"
    fields, rename = set(), None
    for line in body.group(1).splitlines():
        line = line.strip()
        renamed = re.search(r'rename = "(\w+)"', line)
        if renamed:
            rename = renamed.group(1)
        field = re.match(r"pub (\w+):\s*(.*?),?$", line)
        if field:
            secret = re.fullmatch(r"(?:Option<\s*)?(?:seckill_config::)?Secret(?:\s*>)?", field.group(2))
            if secret or not secret_only:
                fields.add((rename or field.group(1)).upper())
            rename = None
    return fields


# Each service's settings: (its variable prefix, the settings structs it reads).
SETTINGS_SOURCES = {
    "gateway": ("GATEWAY", [(("gateway", "src", "config.rs"), "Settings")]),
    "seckill-api": (
        "API",
        [(("crates", "config", "src", "lib.rs"), "BackendSettings"), (("seckill-api", "src", "config.rs"), "Settings")],
    ),
    "order-service": (
        "ORDER",
        [(("crates", "config", "src", "lib.rs"), "BackendSettings"), (("order-service", "src", "config.rs"), "Settings")],
    ),
}


def secret_variables():
    """Every variable that sets a setting typed `Secret` or `Option<Secret>` in the
    services' settings structs, in both of the forms docs/configuration.md lists:
    `SECKILL_<NAME>` and the service's own `SECKILL_<PREFIX>_<NAME>`."""
    names = set()
    for prefix, structs in SETTINGS_SOURCES.values():
        for path, struct in structs:
            for field in settings_fields(path, struct, secret_only=True):
                names |= {f"SECKILL_{field}", f"SECKILL_{prefix}_{field}"}
    return names


class SettingsTest(unittest.TestCase):
    def test_every_variable_set_is_a_setting_of_the_services_reading_it(self):
        known = {
            service: (prefix, set().union(*(settings_fields(path, struct) for path, struct in structs)))
            for service, (prefix, structs) in SETTINGS_SOURCES.items()
        }
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service, (prefix, fields) in known.items():
                c = container(named(objects, "Deployment", service))
                variables = [e["name"] for e in c.get("env", [])]
                for source in c.get("envFrom", []):
                    cm = named(objects, "ConfigMap", source["configMapRef"]["name"])
                    variables += list(cm["data"])
                for variable in variables:
                    with self.subTest(overlay=overlay, service=service, variable=variable):
                        self.assertTrue(variable.startswith("SECKILL_"), variable)
                        name = variable[len("SECKILL_"):]
                        if name.startswith(prefix + "_") and name[len(prefix) + 1:] in fields:
                            continue
                        self.assertTrue(name in fields, f"{overlay}: {service} has no setting {variable}")


class ProbesTest(unittest.TestCase):
    def test_readiness_probes_ask_what_the_compose_healthchecks_ask(self):
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service in SERVICES:
                port, path = compose_health_url(service)
                c = container(named(objects, "Deployment", service))
                with self.subTest(overlay=overlay, service=service):
                    probe = c["readinessProbe"]["httpGet"]
                    self.assertEqual((probe["port"], probe["path"]), (port, path))
                    self.assertIn(port, [p["containerPort"] for p in c["ports"]])

    def test_ports_are_the_services_own_defaults(self):
        ports = {
            "gateway": int(rust_default(("gateway", "src", "config.rs"), r"\n            port: (\d+),")),
            "seckill-api": int(rust_default(("seckill-api", "src", "config.rs"), r"\n            port: (\d+),")),
            "order-service": int(rust_default(("order-service", "src", "config.rs"), r"\n            port: (\d+),")),
        }
        admin = int(rust_default(("gateway", "src", "config.rs"), r"admin_port: (\d+),"))
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service, port in ports.items():
                c = container(named(objects, "Deployment", service))
                with self.subTest(overlay=overlay, service=service):
                    named_ports = {p["name"]: p["containerPort"] for p in c["ports"]}
                    self.assertEqual(named_ports["http"], port)
                    # Liveness and startup: /healthz, which answers whatever the dependencies
                    # do (crates/http/src/ops.rs, gateway/src/ops.rs), on the backends' own
                    # port and on the gateway's operator port: its public port answers 503
                    # at the connection cap, which must not restart it.
                    expected = ("/healthz", admin if service == "gateway" else port)
                    for probe in ("livenessProbe", "startupProbe"):
                        get = c[probe]["httpGet"]
                        self.assertEqual((get["path"], get["port"]), expected, f"{overlay}: {service} {probe}")
                    if service == "gateway":
                        self.assertEqual(named_ports["admin"], admin)
            urls = named(objects, "ConfigMap", "gateway-config")["data"]
            self.assertEqual(urls["SECKILL_GATEWAY_SECKILL_API_URLS"], f"http://seckill-api:{ports['seckill-api']}")
            self.assertEqual(urls["SECKILL_GATEWAY_ORDER_SERVICE_URLS"], f"http://order-service:{ports['order-service']}")
            for backend in BACKENDS:
                self.assertEqual(named(objects, "Service", backend)["spec"].get("clusterIP"), "None")
        self.assertTrue("/healthz" in read("crates", "http", "src", "ops.rs"))


class PodsTest(unittest.TestCase):
    def test_every_service_pod_is_hardened_bounded_and_spread(self):
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service in SERVICES:
                d = named(objects, "Deployment", service)
                spec = d["spec"]["template"]["spec"]
                c = container(d)
                with self.subTest(overlay=overlay, service=service):
                    self.assertTrue(spec["securityContext"]["runAsNonRoot"])
                    self.assertNotEqual(spec["securityContext"].get("runAsUser"), 0)
                    sc = c["securityContext"]
                    self.assertIs(sc["readOnlyRootFilesystem"], True)
                    self.assertIs(sc["allowPrivilegeEscalation"], False)
                    self.assertEqual(sc["capabilities"]["drop"], ["ALL"])
                    for bound in ("requests", "limits"):
                        self.assertEqual(set(c["resources"][bound]), {"cpu", "memory"}, bound)
                    terms = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
                    self.assertEqual(terms[0]["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname")
                    pdbs = [
                        p
                        for p in of_kind(objects, "PodDisruptionBudget")
                        if labels_match(p["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
                    ]
                    self.assertEqual(len(pdbs), 1, "one PodDisruptionBudget")
                    self.assertIs(spec.get("automountServiceAccountToken"), False)

    def test_grace_period_covers_the_pre_stop_sleep_and_the_drain(self):
        drain = int(rust_default(("gateway", "src", "serve.rs"), r"const DRAIN: Duration = Duration::from_secs\((\d+)\)"))
        upstream = int(
            rust_default(("gateway", "src", "config.rs"), r"upstream_request_timeout: Duration::from_secs\((\d+)\)")
        )
        for overlay in OVERLAYS:
            objects = rendered(overlay)
            for service in SERVICES:
                d = named(objects, "Deployment", service)
                command = container(d)["lifecycle"]["preStop"]["exec"]["command"]
                self.assertEqual(command[0], "sleep")
                sleep = int(command[1])
                # The backends' longest request is the gateway's deadline for it; the
                # gateway's own drain is its DRAIN.
                work = drain if service == "gateway" else upstream
                with self.subTest(overlay=overlay, service=service):
                    self.assertGreaterEqual(sleep, 5, "the endpoint's removal needs time to spread")
                    self.assertGreater(d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"], sleep + work)

    def test_dev_runs_one_replica_of_each_and_no_autoscaler(self):
        objects = rendered("dev")
        for service in SERVICES:
            self.assertEqual(named(objects, "Deployment", service)["spec"]["replicas"], 1)
        for kind in ("HorizontalPodAutoscaler", "ScaledObject"):
            self.assertEqual(of_kind(objects, kind), [])
        for store in ("redis", "rabbitmq", "postgres"):
            self.assertEqual(named(objects, "StatefulSet", store)["spec"]["replicas"], 1)


class AutoscalingTest(unittest.TestCase):
    def test_seckill_api_scales_on_the_request_metric_the_adapter_serves(self):
        objects = rendered("production")
        hpa = named(objects, "HorizontalPodAutoscaler", "seckill-api")
        (metric,) = hpa["spec"]["metrics"]
        self.assertEqual(metric["type"], "Pods")
        name = metric["pods"]["metric"]["name"]
        with open(os.path.join(KUBERNETES, "production", "prometheus-adapter-values.yaml"), encoding="utf-8") as f:
            rules = yaml.safe_load(f)["rules"]["custom"]
        served = {r["name"]["as"]: r for r in rules}
        self.assertIn(name, served, "the HPA reads a metric the adapter does not serve")
        series = re.match(r"(\w+)\{", served[name]["seriesQuery"]).group(1)
        self.assertIn('service="seckill-api"', served[name]["seriesQuery"])
        self.assertIn(f"| `{series}` | counter |", read("docs", "metrics.md"), "not a metric the services export")
        self.assertEqual(name, series, "named as the services export it")

    def test_gateway_scales_on_cpu(self):
        hpa = named(rendered("production"), "HorizontalPodAutoscaler", "gateway")
        (metric,) = hpa["spec"]["metrics"]
        self.assertEqual((metric["type"], metric["resource"]["name"]), ("Resource", "cpu"))

    def test_maximum_replicas_fit_the_postgres_connections(self):
        objects = rendered("production")
        pools = {
            "seckill-api": int(rust_default(("seckill-api", "src", "config.rs"), r"db_pool_size: (\d+),")),
            "order-service": int(rust_default(("order-service", "src", "config.rs"), r"db_pool_size: (\d+),")),
        }
        maxima = {
            "seckill-api": named(objects, "HorizontalPodAutoscaler", "seckill-api")["spec"]["maxReplicas"],
            "order-service": named(objects, "ScaledObject", "order-service")["spec"]["maxReplicaCount"],
        }
        pg = named(objects, "Cluster", "seckill-pg")
        max_connections = int(pg["spec"]["postgresql"]["parameters"]["max_connections"])
        # A rolling update adds up to 25 % more pods (rounded up) while the old ones drain.
        surge = sum(pools[s] * -(-maxima[s] * 5 // 4) for s in pools)
        # CloudNativePG's own connections and superuser_reserved_connections: keep 20.
        self.assertLessEqual(surge, max_connections - 20, f"{maxima} x {pools} at surge: {surge}")
        for hpa in of_kind(objects, "HorizontalPodAutoscaler"):
            self.assertLessEqual(hpa["spec"]["maxReplicas"], 20)


if __name__ == "__main__":
    unittest.main()
