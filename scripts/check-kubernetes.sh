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
report=$(mktemp)
trap 'rm -f "$report"' EXIT
status=0
python3 -m unittest discover -s deploy/kubernetes/tests -t deploy/kubernetes/tests "$@" 2>&1 |
    tee "$report" || status=$?
# One total line, as scripts/test.sh adds them up: `kubernetes: N passed, N failed`.
ran=$(sed -n 's/^Ran \([0-9]*\) tests\{0,1\} in .*/\1/p' "$report" | tail -n 1)
failed=$({ grep -oE '(failures|errors)=[0-9]+' "$report" || true; } | awk -F= '{ n += $2 } END { print n + 0 }')
((status == 0)) || ((failed > 0)) || failed=1
echo "kubernetes: $((${ran:-0} - failed < 0 ? 0 : ${ran:-0} - failed)) passed, $failed failed"
((status == 0)) || die "the Kubernetes manifests failed their checks"
say "Kubernetes manifests: both overlays render and pass their checks"
