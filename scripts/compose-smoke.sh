#!/usr/bin/env bash
# The compose stack end to end, for anyone with a Docker engine that can pull images (redis,
# rabbitmq, postgres, rust, debian, prom/prometheus, grafana/grafana, jaegertracing/jaeger):
#
#   scripts/compose-smoke.sh            # up, buy, load test, scale to 3, buy, check, down -v
#   scripts/compose-smoke.sh --keep     # leave the stack running at the end (down -v later)
#
# 1. writes `.env` where missing (scripts/compose-env.sh; an existing one keeps its values
#    and gains only the variables it lacks);
# 2. `docker compose up -d --build --wait` (with the older `docker-compose` v1, which has no
#    --wait: up -d --build, then polls every container's healthcheck);
# 3. buys one unit through the gateway on 127.0.0.1:8080, with tokens minted inside the
#    gateway's container (`seckill-token`, signed with the stack's SECKILL_JWT_SECRET), and
#    waits until the order is written;
# 4. runs the load tester (`seckill-loadtest`, in the gateway's container, against the
#    gateway, checking its invariants against the stack's Postgres and Redis);
# 5. scales seckill-api to 3 replicas, buys again, and waits until Prometheus
#    (127.0.0.1:9090) scrapes 3 seckill-api targets that are up; checks Grafana's provisioned
#    datasource and dashboard, and that Jaeger's UI answers;
# 6. tears the stack down with its volumes (`down -v`) on any exit, unless --keep.
#
# It runs as its own compose project (COMPOSE_PROJECT_NAME, default `seckill-smoke`), so
# `down -v` never drops the volumes of a stack started from this directory by hand; the
# host ports are the same, though, so that stack must be stopped first.
# Exit code: 0 when every step passed, 1 otherwise.
set -euo pipefail
# shellcheck source=scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

keep=0
# Buyers and units of the load test: under the gateway's per-address pre-limit on tokens it
# has not verified yet (burst 2000), since every buyer comes from the same address.
users="${SECKILL_SMOKE_USERS:-1000}"
stock="${SECKILL_SMOKE_STOCK:-100}"
wait_secs="${SECKILL_SMOKE_WAIT_SECS:-600}"
while (($# > 0)); do
    case $1 in
    --keep)
        keep=1
        shift
        ;;
    -h | --help)
        sed -n '2,25p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument '$1' (see --help)" ;;
    esac
done

cd "$ROOT"
export COMPOSE_PROJECT_NAME="${COMPOSE_PROJECT_NAME:-seckill-smoke}"

# `docker compose` (v2) where there is one, else the standalone v1.
compose=()
v2=0
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
    v2=1
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
    # v1 builds with the classic builder unless told to hand the build to the docker CLI;
    # the Dockerfile's cache mounts need BuildKit.
    export COMPOSE_DOCKER_CLI_BUILD=1 DOCKER_BUILDKIT=1
else
    die "neither 'docker compose' nor 'docker-compose' found (scripts/tools.sh installs docker-compose)"
fi
docker info >/dev/null 2>&1 || die "no Docker engine answers ('docker info' failed)"
command -v curl >/dev/null 2>&1 || die "curl is needed"

for port in 8080 3000 9090 16686 15672 15432 16379; do
    if port_open "$port"; then
        die "something already listens on 127.0.0.1:$port (a stack started by hand? 'docker compose down' it first)"
    fi
done

"$SCRIPTS/compose-env.sh"
# The stack's secrets and passwords, for the load tester's URLs and Grafana's API.
set -a
# shellcheck source=/dev/null
. ./.env
set +a

teardown() {
    local status=$?
    if ((keep == 1)); then
        say "leaving the stack up (--keep): '${compose[*]} -p $COMPOSE_PROJECT_NAME down -v' removes it"
    else
        say "tearing down (${compose[*]} down -v)"
        "${compose[@]}" down -v --remove-orphans >/dev/null 2>&1 || true
    fi
    if ((status == 0)); then
        say "compose smoke: PASS"
    else
        printf 'compose smoke: FAIL (exit %s)\n' "$status" >&2
    fi
}
trap teardown EXIT

# Every container of the project healthy (v1 has no --wait). Fails at once on `unhealthy`.
wait_all_healthy() {
    local deadline=$((SECONDS + wait_secs)) ids id state pending
    while :; do
        pending=0
        ids=$("${compose[@]}" ps -q)
        [ -n "$ids" ] || die "no container is running"
        for id in $ids; do
            state=$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id")
            case $state in
            healthy) ;;
            unhealthy | exited | dead)
                docker logs --tail 50 "$id" >&2 || true
                die "container $id is $state"
                ;;
            *) pending=$((pending + 1)) ;;
            esac
        done
        ((pending == 0)) && return 0
        ((SECONDS < deadline)) || die "$pending container(s) not healthy after ${wait_secs}s"
        sleep 2
    done
}

# compose_up ARGS...: `up -d ARGS` and wait until everything is healthy.
compose_up() {
    if ((v2 == 1)); then
        "${compose[@]}" up -d --wait --wait-timeout "$wait_secs" "$@"
    else
        "${compose[@]}" up -d "$@"
        wait_all_healthy
    fi
}

say "building and starting the stack (${compose[*]}, project $COMPOSE_PROJECT_NAME)"
compose_up --build

GW=http://127.0.0.1:8080
# token ARGS...: a token minted by seckill-token inside the gateway's container, which holds
# the stack's SECKILL_JWT_SECRET.
token() {
    "${compose[@]}" exec -T gateway seckill-token "$@" | tr -d '\r\n'
}
ADMIN=$(token --sub 1 --admin)

# json_number KEY: the numeric value of "KEY" in the one-line JSON on stdin.
json_number() {
    sed -n "s/.*\"$1\":\([0-9][0-9]*\).*/\1/p" | head -n 1
}

say "putting a product on sale"
product=$(curl -fsS -X POST "$GW/admin/products" \
    -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
    -d "{\"name\":\"compose smoke\",\"price_cents\":100,\"stock\":50,
         \"start_at\":\"$(date -u -d '-1 minute' +%FT%TZ)\",\"end_at\":\"$(date -u -d '+1 hour' +%FT%TZ)\"}" |
    json_number id)
[ -n "$product" ] || die "no product id in the answer of POST /admin/products"

# buy USER: one purchase by USER through the gateway; must be 202; then waits for the order.
buy() {
    local buyer status result deadline
    buyer=$(token --sub "$1")
    status=$(curl -sS -o /dev/null -w '%{http_code}' -X POST "$GW/api/seckill/$product" \
        -H "Authorization: Bearer $buyer")
    [ "$status" = 202 ] || die "purchase of user $1: HTTP $status, not 202"
    deadline=$((SECONDS + 60))
    until result=$(curl -fsS "$GW/api/seckill/$product/result" -H "Authorization: Bearer $buyer") &&
        [[ $result == *'"status":"success"'* ]]; do
        ((SECONDS < deadline)) || die "user $1's order not written after 60s: $result"
        sleep 1
    done
    say "user $1 bought a unit of product $product: $result"
}
buy 42

say "load test: $users buyers for $stock units (seckill-loadtest in the gateway's container)"
"${compose[@]}" exec -T gateway seckill-loadtest \
    --gateway-url http://127.0.0.1:8080 --users "$users" --stock "$stock" --first-user-id 1000 \
    --database-url "postgres://postgres:$POSTGRES_PASSWORD@postgres:5432/seckill" \
    --redis-url "redis://:$REDIS_PASSWORD@redis:6379"

say "scaling seckill-api to 3 replicas"
compose_up --no-recreate --scale seckill-api=3
for buyer in 43 44 45 46 47 48; do
    buy "$buyer"
done

# up_targets JOB: how many targets of JOB Prometheus scraped successfully last time.
up_targets() {
    curl -fsS -G 'http://127.0.0.1:9090/api/v1/query' \
        --data-urlencode "query=count(up{job=\"$1\"} == 1)" |
        sed -n 's/.*"value":\[[^,]*,"\([0-9]*\)"\].*/\1/p'
}
say "waiting for Prometheus to scrape 3 seckill-api replicas"
deadline=$((SECONDS + 90))
until [ "$(up_targets seckill-api)" = 3 ]; do
    ((SECONDS < deadline)) || die "Prometheus sees $(up_targets seckill-api) seckill-api targets up, not 3"
    sleep 2
done
for job in gateway order-service; do
    [ "$(up_targets "$job")" = 1 ] || die "Prometheus sees no $job target up"
done
say "Prometheus: 3 seckill-api, 1 order-service and 1 gateway target up"

grafana=(curl -fsS -u "admin:$GRAFANA_ADMIN_PASSWORD")
"${grafana[@]}" http://127.0.0.1:3000/api/datasources/uid/prometheus/health | grep -q '"status":"OK"' ||
    die "Grafana's prometheus datasource is not healthy"
"${grafana[@]}" 'http://127.0.0.1:3000/api/search?type=dash-db' | grep -q '"uid"' ||
    die "Grafana has no provisioned dashboard"
curl -fsS -o /dev/null http://127.0.0.1:16686/ || die "Jaeger's UI does not answer"
say "Grafana: datasource healthy, dashboard provisioned; Jaeger UI answers"
