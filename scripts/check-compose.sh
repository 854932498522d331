#!/usr/bin/env bash
# Validates docker-compose.yml with the best tool at hand: `docker compose config`, else the
# standalone `docker-compose config`, else a YAML parse with PyYAML. The file requires its
# secrets from the environment, so the check supplies throwaway ones written by
# scripts/compose-env.sh (which thereby shows it covers every variable the file requires),
# and makes sure that without them the file is refused. On the resolved file it checks that
# only the gateway publishes a port beyond loopback. The structural rules (env names,
# credentials, healthchecks, depends_on, scalable services) are checked by the Rust test
# gateway/tests/api/compose.rs whatever tools exist.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

file="$ROOT/docker-compose.yml"
env_file=$(mktemp)
no_env=$(mktemp)
trap 'rm -f "$env_file" "$no_env"' EXIT
rm -f "$env_file"
"$SCRIPTS/compose-env.sh" --output "$env_file" 2>/dev/null

# Published ports of the resolved file (YAML on stdin): the gateway's may be on every
# interface, any other must be bound to 127.0.0.1.
check_ports() {
    python3 -c '
import sys, yaml
doc = yaml.safe_load(sys.stdin)
wrong = []
for name, svc in doc["services"].items():
    if svc.get("network_mode") == "host":
        wrong.append(f"{name}: network_mode host")
    for port in svc.get("ports", []):
        host_ip = port.get("host_ip", "") if isinstance(port, dict) else (
            str(port).rsplit(":", 2)[0] if str(port).count(":") == 2 else "")
        if name != "gateway" and host_ip != "127.0.0.1":
            wrong.append(f"{name}: {port}")
assert not wrong, "published beyond loopback: " + ", ".join(wrong)
'
}

compose=()
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
fi

if ((${#compose[@]} > 0)); then
    # Without the secrets (and without the caller's own .env and environment) it must refuse.
    if env -i PATH="$PATH" HOME="$HOME" "${compose[@]}" --env-file "$no_env" -f "$file" config -q >/dev/null 2>&1; then
        die "docker-compose.yml: accepted without secrets; a secret has a default"
    fi
    "${compose[@]}" --env-file "$env_file" -f "$file" config -q
    if python3 -c 'import yaml' >/dev/null 2>&1; then
        "${compose[@]}" --env-file "$env_file" -f "$file" config | check_ports
    fi
    say "docker-compose.yml: valid, needs its secrets, publishes beyond loopback only the gateway (${compose[*]} config)"
elif python3 -c 'import yaml' >/dev/null 2>&1; then
    python3 - "$file" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
services = doc["services"]
for name, svc in services.items():
    assert "image" in svc or "build" in svc, f"{name}: neither image nor build"
    assert "healthcheck" in svc, f"{name}: no healthcheck"
PY
    check_ports <"$file"
    say "docker-compose.yml: parses as YAML (no compose tool here; structure and ports only)"
else
    say "docker-compose.yml: SKIPPED, no docker compose, docker-compose or PyYAML here"
fi
