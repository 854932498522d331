#!/usr/bin/env bash
# Validates docker-compose.yml with the best tool at hand: `docker compose config`, else the
# standalone `docker-compose config`, else a YAML parse with PyYAML. The structural rules
# (env names, healthchecks, depends_on, scalable services) are checked by the Rust test
# gateway/tests/api/compose.rs whatever tools exist.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

file="$ROOT/docker-compose.yml"
if docker compose version >/dev/null 2>&1; then
    docker compose -f "$file" config -q
    say "docker-compose.yml: valid (docker compose config)"
elif command -v docker-compose >/dev/null 2>&1; then
    docker-compose -f "$file" config -q
    say "docker-compose.yml: valid (docker-compose config)"
elif python3 -c 'import yaml' >/dev/null 2>&1; then
    python3 - "$file" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
services = doc["services"]
for name, svc in services.items():
    assert "image" in svc or "build" in svc, f"{name}: neither image nor build"
    assert "healthcheck" in svc, f"{name}: no healthcheck"
PY
    say "docker-compose.yml: parses as YAML (no compose tool here; structure only)"
else
    say "docker-compose.yml: SKIPPED, no docker compose, docker-compose or PyYAML here"
fi
