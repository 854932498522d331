#!/usr/bin/env python3
"""Renders a kustomization of deploy/kubernetes the way `kubectl kustomize` does, offline.

kubectl is not on a fresh Debian machine, and Debian's `kubernetes-client` (1.20) carries a
kustomize too old for these files; the offline checks (tests/test_manifests.py, run by
scripts/check-kubernetes.sh) render with this instead. It implements exactly the subset of
kustomize the kustomizations here use, and refuses anything else rather than render it
wrongly:

- `resources`: YAML files (several documents each) and directories holding a
  kustomization.yaml, rendered recursively;
- `namespace`: set on every namespaced object (not on Namespace itself);
- `configMapGenerator` / `secretGenerator`: `files` (key = the file's name, or `key=path`),
  `literals` (`KEY=value`) and `envs` (files of `KEY=value` lines), with
  `generatorOptions.disableNameSuffixHash: true` required (no hash suffix, so no
  reference to rewrite), `options.labels`;
- `patches` with `path:` only: strategic-merge patches, matched by kind and name, merged
  as Kubernetes does for the fields used here (containers, env, volumes by `name`;
  volumeMounts by `mountPath`; ports by `containerPort`; other lists replaced).

Where a real kustomize is at hand, scripts/check-kubernetes.sh also compares this
renderer's output with `kubectl kustomize` for both overlays.

    deploy/kubernetes/render.py deploy/kubernetes/production     # YAML on stdout
    deploy/kubernetes/render.py --sync-rules                     # rewrite the PrometheusRule
"""

import base64
import copy
import os
import sys

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# The alert rules compose's Prometheus loads, and the PrometheusRule made from them.
ALERTS = os.path.join(REPO, "deploy", "prometheus", "alerts.yml")
PROMETHEUS_RULE = os.path.join(HERE, "monitoring", "prometheusrule.yaml")

KNOWN_KEYS = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "secretGenerator",
    "generatorOptions",
    "patches",
}

# Kinds without a namespace (of those that could appear here).
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
}

# Strategic-merge keys of the lists the patches here touch.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}


class RenderError(Exception):
    """A kustomization uses something this renderer does not implement, or is wrong."""


def load_documents(path):
    with open(path, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def inside(root, path):
    """kustomize's load restrictor: a file must be under the kustomization's root."""
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    if os.path.commonpath([root, path]) != root:
        raise RenderError(f"{path} is outside the kustomization root {root}")
    return path


def env_pairs(path):
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise RenderError(f"{path}: not KEY=value: {line!r}")
            pairs.append((key, value))
    return pairs


def generate(root, spec, kind, options):
    if not options.get("disableNameSuffixHash"):
        raise RenderError(f"{root}: generators need generatorOptions.disableNameSuffixHash")
    unknown = set(spec) - {"name", "files", "literals", "envs", "options"}
    if unknown:
        raise RenderError(f"{root}: generator fields not implemented: {sorted(unknown)}")
    data = {}
    for entry in spec.get("files", []):
        key, sep, rel = entry.partition("=")
        if not sep:
            key, rel = os.path.basename(entry), entry
        with open(inside(root, os.path.join(root, rel)), encoding="utf-8") as f:
            data[key] = f.read()
    for literal in spec.get("literals", []):
        key, _, value = literal.partition("=")
        data[key] = value
    for rel in spec.get("envs", []):
        data.update(env_pairs(inside(root, os.path.join(root, rel))))
    metadata = {"name": spec["name"]}
    labels = spec.get("options", {}).get("labels")
    if labels:
        metadata["labels"] = dict(labels)
    obj = {"apiVersion": "v1", "kind": kind, "metadata": metadata}
    if kind == "Secret":
        obj["type"] = "Opaque"
        obj["data"] = {
            k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())
        }
    else:
        obj["data"] = dict(sorted(data.items()))
    return obj


def merge(target, patch, field=None):
    """Strategic merge of `patch` into `target` (both plain YAML values)."""
    if isinstance(patch, dict) and isinstance(target, dict):
        if patch.get("$patch") == "delete":
            return None
        out = dict(target)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            elif key in out:
                merged = merge(out[key], value, key)
                if merged is None:
                    out.pop(key)
                else:
                    out[key] = merged
            else:
                out[key] = copy.deepcopy(value)
        return out
    if isinstance(patch, list) and isinstance(target, list):
        key = MERGE_KEYS.get(field)
        if key is None or not all(isinstance(i, dict) and key in i for i in patch + target):
            return copy.deepcopy(patch)
        out = [copy.deepcopy(i) for i in target]
        for item in patch:
            match = next((n for n, t in enumerate(out) if t[key] == item[key]), None)
            if item.get("$patch") == "delete":
                if match is not None:
                    out.pop(match)
            elif match is None:
                out.append(copy.deepcopy(item))
            else:
                out[match] = merge(out[match], item, field)
        return out
    return copy.deepcopy(patch)


def ident(obj):
    return (obj["kind"], obj["metadata"]["name"])


def render(root):
    """The objects the kustomization in directory `root` produces."""
    path = os.path.join(root, "kustomization.yaml")
    if not os.path.exists(path):
        raise RenderError(f"{root}: no kustomization.yaml")
    with open(path, encoding="utf-8") as f:
        kust = yaml.safe_load(f)
    unknown = set(kust) - KNOWN_KEYS
    if unknown:
        raise RenderError(f"{path}: fields not implemented: {sorted(unknown)}")
    objects = []
    for rel in kust.get("resources", []):
        target = os.path.normpath(os.path.join(root, rel))
        if os.path.isdir(target):
            objects.extend(render(target))
        else:
            objects.extend(load_documents(inside(root, target)))
    options = kust.get("generatorOptions", {})
    for spec in kust.get("configMapGenerator", []):
        objects.append(generate(root, spec, "ConfigMap", options))
    for spec in kust.get("secretGenerator", []):
        objects.append(generate(root, spec, "Secret", options))
    for entry in kust.get("patches", []):
        if set(entry) != {"path"}:
            raise RenderError(f"{path}: only `path:` patches are implemented: {entry}")
        for patch in load_documents(inside(root, os.path.join(root, entry["path"]))):
            hits = [n for n, o in enumerate(objects) if ident(o) == ident(patch)]
            if len(hits) != 1:
                raise RenderError(f"{path}: patch {ident(patch)} matches {len(hits)} objects")
            objects[hits[0]] = merge(objects[hits[0]], patch)
    namespace = kust.get("namespace")
    if namespace:
        for obj in objects:
            if obj["kind"] not in CLUSTER_SCOPED:
                obj["metadata"]["namespace"] = namespace
    seen = set()
    for obj in objects:
        key = (obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in seen:
            raise RenderError(f"{root}: {key} defined twice")
        seen.add(key)
    return objects


def prometheus_rule_from_alerts():
    """The PrometheusRule carrying deploy/prometheus/alerts.yml's groups, unchanged."""
    with open(ALERTS, encoding="utf-8") as f:
        groups = yaml.safe_load(f)["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "seckill-alerts",
            "labels": {"app.kubernetes.io/part-of": "seckill", "release": "prometheus"},
        },
        "spec": {"groups": groups},
    }


class BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL, descriptions) as `|` blocks, as alerts.yml does."""


def _block_str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


BlockDumper.add_representer(str, _block_str)


def prometheus_rule_text():
    header = (
        "# GENERATED from deploy/prometheus/alerts.yml (the rules compose's Prometheus\n"
        "# loads) by `deploy/kubernetes/render.py --sync-rules`: edit alerts.yml, then run\n"
        "# that. tests/test_manifests.py fails while the groups here differ from the file's.\n"
    )
    body = yaml.dump(
        prometheus_rule_from_alerts(),
        Dumper=BlockDumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
    )
    return header + body


def main(argv):
    if argv == ["--sync-rules"]:
        with open(PROMETHEUS_RULE, "w", encoding="utf-8") as f:
            f.write(prometheus_rule_text())
        return 0
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-2].strip(), file=sys.stderr)
        return 2
    try:
        objects = render(argv[0])
    except RenderError as e:
        print(f"render.py: {e}", file=sys.stderr)
        return 1
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False, allow_unicode=True, width=100)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
