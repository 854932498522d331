#!/usr/bin/env bash
# Renders both Kubernetes overlays (deploy/kubernetes/dev, deploy/kubernetes/production)
# offline and checks them: every object against the Kubernetes schemas
# (kubernetes-validate; the custom resources structurally), and against the rest of the
# repository: only the gateway exposed, the NetworkPolicies, secrets from the Secret only,
# the probes equal to compose's healthchecks, the PrometheusRule equal to
# deploy/prometheus/alerts.yml, the dashboard ConfigMap equal to its JSON file
# (deploy/kubernetes/tests/test_manifests.py). Needs no cluster and no kubectl: the
# renderer is deploy/kubernetes/render.py; where a kubectl with kustomize is on PATH its
# output is compared with the renderer's too. Exits non-zero on any failure.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# pip puts console scripts here for a user install.
PATH="$PATH:$HOME/.local/bin"
# No __pycache__ left in deploy/kubernetes.
export PYTHONDONTWRITEBYTECODE=1

command -v python3 >/dev/null 2>&1 || die "python3 is needed to render and check the manifests"
pip_pkgs=()
python3 -c 'import yaml' >/dev/null 2>&1 || pip_pkgs+=(pyyaml)
python3 -c 'import kubernetes_validate' >/dev/null 2>&1 || pip_pkgs+=(kubernetes-validate)
if ((${#pip_pkgs[@]} > 0)); then
    # Debian's python3 comes without pip.
    if ! python3 -m pip --version >/dev/null 2>&1; then
        apt_install python3-pip
    fi
    say "installing ${pip_pkgs[*]} (pip)"
    python3 -m pip install -q "${pip_pkgs[@]}" ||
        python3 -m pip install -q --user --break-system-packages "${pip_pkgs[@]}"
fi

for overlay in dev production; do
    say "rendering deploy/kubernetes/$overlay"
    python3 "$ROOT/deploy/kubernetes/render.py" "$ROOT/deploy/kubernetes/$overlay" >/dev/null ||
        die "deploy/kubernetes/$overlay does not render"
done

say "checking the rendered manifests (deploy/kubernetes/tests)"
cd "$ROOT"
counts=$(mktemp)
trap 'rm -f "$counts"' EXIT
status=0
# One total line, as scripts/test.sh adds them up: `kubernetes: N passed, N failed`, counting
# test methods: a method with failing subtests is one failed test, however many fail. The
# runner writes "<ran> <failed>" to $counts; unittest's own report goes to stderr as usual.
python3 - "$counts" "$@" <<'PY' || status=$?
import sys
import unittest

counts, args = sys.argv[1], sys.argv[2:]
program = unittest.main(
    module=None,
    argv=["check-kubernetes", "discover", "-s", "deploy/kubernetes/tests", "-t", "deploy/kubernetes/tests", *args],
    exit=False,
)
result = program.result
# A subtest's failure is reported under the _SubTest; its test_case is the method.
failed = {getattr(test, "test_case", test).id() for test, _ in result.failures + result.errors}
failed |= {test.id() for test in result.unexpectedSuccesses}
with open(counts, "w") as f:
    f.write(f"{result.testsRun} {len(failed)}\n")
sys.exit(0 if result.wasSuccessful() else 1)
PY
read -r ran failed <"$counts" || true
ran=${ran:-0} failed=${failed:-0}
((status == 0)) || ((failed > 0)) || failed=1
echo "kubernetes: $((ran - failed < 0 ? 0 : ran - failed)) passed, $failed failed"
((status == 0)) || die "the Kubernetes manifests failed their checks"
say "Kubernetes manifests: both overlays render and pass their checks"
